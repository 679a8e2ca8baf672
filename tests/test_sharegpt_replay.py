"""The ShareGPT-300 replay against LLMServingSim's published vLLM 0.19.0 runs (calibration.validation.sharegpt_replay).

Bounds come from the errors measured when this test was written (docs/validation/sharegpt.md); they
are regression guards on an uncalibrated model, not accuracy claims:

* Llama-3.1-8B on RTX 4090 TP1 (KV-bound, 292 preemptions): since engine memory follows vLLM 0.19's own
  budget (simulator/memory.py, fitted on H100 start-up logs) epdsim plans 43,888 KV tokens against the
  41,408 vLLM logged (+6.0 %, the one logged capacity on a GPU the memory terms were not fitted on; the
  earlier model's +0.9 % came from counting 24 GiB of device memory instead of CUDA's 23.52).  Worst errors
  measured: TPOT p90 +33.3 %, TTFT p90 +24.9 %, TPOT mean +23.4 %.  Asserted: headline figures within 35 %,
  TPOT mean and throughput within 25 %, KV tokens within 7 %.
* Llama-3.1-8B on RTX PRO 6000 TP1: worst measured +3.2 % (TTFT p90); asserted within 10 %.
* Qwen3-32B TP2 over PCIe (RTX PRO 6000): epdsim under-predicts step time; errors measured -22 %
  (TPOT) to -31.6 % (TTFT mean), throughput +24.5 %.  Asserted: within 45 %.
* Mean running sequences (the queueing the runs are bound by) within 10 %.

No predicted number is written here: the test recomputes the table.
"""

from __future__ import annotations

import pytest

from calibration.validation import sharegpt_replay as sg
from tests.conftest import SHARED

LLAMA = ("rtx4090-llama8b", "pro6000-llama8b")
LLAMA_BOUND = {"rtx4090-llama8b": 0.35, "pro6000-llama8b": 0.10}  # worst measured 33.3 %, 3.2 %
LLAMA_MEAN_BOUND = {"rtx4090-llama8b": 0.25, "pro6000-llama8b": 0.10}  # TPOT mean, throughput: 23.4 %, 1.6 %
QWEN_BOUND = 0.45  # worst measured |error| 38.5 %


@pytest.fixture(scope="module")
def replay():
    if not (SHARED / sg.TRACE_DIR).is_dir():
        pytest.skip(f"../shared is absent (CI has it); this test reads {sg.TRACE_DIR}")
    return sg.table(SHARED)


def _errors(df, run, metrics=sg.HEADLINE):
    rows = df[(df["run"] == run) & df["metric"].isin(metrics)]
    assert len(rows) == len(metrics), f"{run}: expected {metrics}, got {list(rows['metric'])}"
    return dict(zip(rows["metric"], rows["error"], strict=True))


def test_every_request_completes(replay):
    df, facts = replay
    assert set(facts) == {r.name for r in sg.RUNS}
    for name, f in facts.items():
        assert f["requests"] == 300, name
        assert f["completed"] == 300 and f["rejected"] == 0 and f["unfinished"] == 0, (name, f)
    assert df["predicted"].notna().all() and (df["predicted"] > 0).all()


@pytest.mark.parametrize("run", LLAMA)
def test_llama8b_within_measured_bound(replay, run):
    df, _ = replay
    err = _errors(df, run)
    bad = {m: f"{e:+.1%}" for m, e in err.items() if abs(e) > LLAMA_BOUND[run]}
    assert not bad, f"{run}: beyond {LLAMA_BOUND[run]:.0%}: {bad}"
    means = {m: err[m] for m in ("tpot_mean_ms", "output_tokens_per_s")}
    bad = {m: f"{e:+.1%}" for m, e in means.items() if abs(e) > LLAMA_MEAN_BOUND[run]}
    assert not bad, f"{run}: beyond {LLAMA_MEAN_BOUND[run]:.0%}: {bad}"


def test_qwen32b_tp2_within_measured_bound(replay):
    df, _ = replay
    err = _errors(df, "pro6000-qwen32b")
    bad = {m: f"{e:+.1%}" for m, e in err.items() if abs(e) > QWEN_BOUND}
    assert not bad, f"pro6000-qwen32b: beyond {QWEN_BOUND:.0%}: {bad}"


def test_capacity_and_concurrency(replay):
    df, _ = replay
    kv = _errors(df, "rtx4090-llama8b", ("kv_cache_tokens",))["kv_cache_tokens"]
    assert abs(kv) <= 0.07, f"RTX 4090 KV tokens off by {kv:+.1%}"
    for run in sg.RUNS:
        e = _errors(df, run.name, ("mean_running_seqs",))["mean_running_seqs"]
        assert abs(e) <= 0.10, f"{run.name}: mean running sequences off by {e:+.1%}"


def test_scenarios_use_the_runs_engine_arguments(shared_dir):
    for run in sg.RUNS:
        scn = sg.scenario(run, shared_dir)
        pool = scn.pools[0]
        assert (pool.gpu, pool.tp, pool.dtype) == (run.gpu, run.tp, "bf16")
        assert pool.engine.max_num_seqs == run.engine["max_num_seqs"]
        assert pool.engine.max_num_batched_tokens == 2048
        assert scn.workload.arrival.kind == "trace" and scn.workload.arrival.format == "plain"
