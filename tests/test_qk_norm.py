"""A q/k norm over the whole projection (MiniMax-M2's ``qk_norm_type: per_layer``): under tensor parallelism
every layer all-reduces each token's q and k variances (vLLM's ``MiniMaxText01RMSNormTP.forward_qk``), one
small all-reduce per layer beside the hidden-state ones."""

from __future__ import annotations

import dataclasses

import pytest

import hwdb
from simulator.scenario import PoolConfig, deployment_for
from simulator.step_build import build_step_model


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


def test_the_config_says_which_models_norm_the_whole_projection(db):
    assert db.model("MiniMax-M2.5").arch.qk_norm_whole
    # Qwen3 normalises q and k per head: nothing to reduce across ranks
    for name in ("Qwen3-235B-A22B", "Qwen3-32B", "Llama-3.1-70B", "gpt-oss-120b"):
        assert not db.model(name).arch.qk_norm_whole, name


@pytest.mark.parametrize("tp", [1, 4])
def test_each_layer_adds_one_small_all_reduce_at_tp_above_one(db, tp):
    model = db.model("MiniMax-M2.5")
    dep = deployment_for(PoolConfig(gpu="H200", tp=tp, dtype="fp8"), model, db)
    sm = build_step_model(dep)
    per_head = build_step_model(dataclasses.replace(dep, arch=dataclasses.replace(dep.arch, qk_norm_whole=False)))
    assert sm.ar_small_per_step == model.arch.num_layers and sm.ar_small_bytes_per_token == 8.0
    for tokens in (1, 32, 2048):
        extra = sm.step_time(tokens, tokens, 0.0, 1000.0 * tokens) - per_head.step_time(
            tokens, tokens, 0.0, 1000.0 * tokens
        )
        want = model.arch.num_layers * sm.allreduce_time(8.0 * tokens, tokens <= sm.max_graph_tokens) if tp > 1 else 0.0
        assert extra == pytest.approx(want, rel=1e-6, abs=1e-12)
        # a decode-only step costs the same by either path, to the bit
        ctx = 1000.0 * tokens
        assert sm.cost.decode(tokens, ctx, tokens) == sm.cost.step(tokens, tokens, 0.0, ctx, 0.0, tokens, 0)
