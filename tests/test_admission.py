"""Admission reserves (simulator/engine/admission.py): SGLang keeps KV free for its running requests' future
output at a decaying ratio, TensorRT-LLM for all of it; vLLM keeps none.  Under a burst that overfills the
cache the first two run fewer requests at once, and TensorRT-LLM never preempts."""

from __future__ import annotations

import pytest

import hwdb
from simulator.engine.admission import Reservation
from simulator.run import simulate
from tests.conftest import pool, scenario
from tests.test_invariants import check_invariants, util_for_kv_tokens


def burst(engine: str, kv_tokens: int = 6000):
    """200 requests of 512 + 256 tokens at once into a cache that holds ~kv_tokens: capacity-bound."""
    eng = {"engine": engine, "max_num_seqs": 256, "max_model_len": 4096}
    eng["gpu_memory_utilization"] = util_for_kv_tokens(kv_tokens, eng)
    return scenario(
        pools=pool(engine=eng),
        workload={
            "arrival": {"kind": "closed", "concurrency": 200},
            "input_length": {"kind": "fixed", "value": 512},
            "output_length": {"kind": "fixed", "value": 256},
            "num_requests": 200,
        },
    )


@pytest.fixture(scope="module")
def runs():
    return {e: simulate(burst(e), 0) for e in ("vllm-v1", "sglang", "trtllm")}


def test_every_engine_conserves_requests_and_blocks(runs):
    for res in runs.values():
        check_invariants(res)
        assert res.summary["completed"] == 200


def test_reserving_engines_run_fewer_at_once(runs):
    peak = {e: int(r.steps["batch_size"].max()) for e, r in runs.items()}
    # 6,000 tokens hold ~11 requests of 512 prompt; vLLM admits on prompt blocks alone (then preempts),
    # TensorRT-LLM only what fits whole (~7 of 768 tokens), SGLang in between.
    assert peak["trtllm"] <= 6000 // 768 + 1
    assert peak["trtllm"] < peak["sglang"] <= peak["vllm-v1"]


def test_guaranteed_no_evict_never_preempts(runs):
    assert int(runs["trtllm"].steps["preemptions"].sum()) == 0
    assert int(runs["vllm-v1"].steps["preemptions"].sum()) > 0


def test_the_ratio_decays_and_restarts():
    rule = hwdb.load().engine("sglang").admission
    r = Reservation(rule, 16)
    assert r.ratio(0) == pytest.approx(0.7)
    assert r.ratio(300) == pytest.approx(0.7 - 300 * (0.7 - 0.098) / 600)
    assert r.ratio(10_000) == pytest.approx(0.098)
    r.reset_at = 10_000
    assert r.ratio(10_000) == pytest.approx(0.7)
    # 0.7 x 1,000 future tokens + a 100-token prompt + its 5,000-token output clipped at 4,096, in 16-token blocks
    assert r.free_needed(10_000, 1000, 100, 5000) == -(-(700 + 100 + 4096) // 16)
