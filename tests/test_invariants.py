"""Invariants over random scenarios (hypothesis), determinism and monotonicity.

Small KV caches and tight budgets force chunked prefills and preemptions, the
paths where bookkeeping goes wrong.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.resolved import resolve
from simulator.run import simulate
from tests.conftest import pool, scenario


def util_for_kv_tokens(kv_tokens: int, engine: dict) -> float:
    """The memory fraction that leaves about ``kv_tokens`` tokens of KV cache (8B on H100); every engine's KV
    bytes are linear in it (simulator/memory.py), so two probes give it."""

    def mem(f):
        return resolve(scenario(pools=pool(engine={**engine, "gpu_memory_utilization": f}))).pools[0].memory

    lo, hi = mem(0.5), mem(1.0)
    return 0.5 + 0.5 * ((kv_tokens + 64) * hi.kv_bytes_per_token - lo.kv_bytes) / (hi.kv_bytes - lo.kv_bytes)


def check_invariants(res) -> None:
    req, steps = res.requests, res.steps
    # Every request ends exactly once, as completed or rejected (no time limit here).
    assert set(req["outcome"].astype(str)) <= {"completed", "rejected"}
    done = req[req["outcome"] == "completed"]
    # Tokens generated equal tokens requested.
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    # Token conservation across the step log: every emitted token belongs to a completed request
    # (a prefill instance's max_tokens=1 token is discarded by the PD proxy, so it does not count).
    serving = [p["name"] for p in res.info["pools"] if p["role"] != "prefill"]
    steps = steps[steps["pool"].isin(serving)]
    emitted = int(steps["decode_tokens"].sum() + steps["first_tokens"].sum())
    assert emitted == int(done["output_tokens"].sum())
    # KV blocks never negative nor over capacity (every pool).
    assert (res.steps["kv_blocks_used"] >= 0).all()
    assert (res.steps["kv_occupancy"] <= 1.0 + 1e-12).all()
    # Batch limits hold.
    info = res.info
    assert (steps["batch_size"] <= info["max_num_seqs"]).all()
    assert (steps["decode_tokens"] + steps["prefill_tokens"] <= info["max_num_batched_tokens"]).all()
    # Time never runs backwards: per instance, steps are ordered and do not overlap.
    for _, g in steps.groupby("instance"):
        start, dur = g["start_s"].to_numpy(), g["duration_s"].to_numpy()
        assert (dur > 0).all()
        assert (start[1:] >= start[:-1] + dur[:-1] - 1e-9).all()
    # And each request's timestamps are ordered.
    a, s, f1, fin = (done[c].to_numpy() for c in ("arrival_s", "scheduled_s", "first_token_s", "finish_s"))
    assert (s >= a - 1e-12).all() and (f1 > s).all() and (fin >= f1).all()


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    instances=st.integers(1, 3),
    max_num_seqs=st.sampled_from([1, 2, 8, 64]),
    budget_extra=st.sampled_from([0, 64, 512, 4096]),
    block_size=st.sampled_from([8, 16, 32]),
    kv_tokens=st.sampled_from([2048, 4096, 16384]),
    rate=st.floats(1.0, 200.0),
    in_hi=st.integers(1, 3000),
    out_hi=st.integers(1, 600),
    router=st.sampled_from(["round_robin", "least_outstanding", "least_kv"]),
    seed=st.integers(0, 2**16),
    engine_name=st.sampled_from(["vllm-v1", "sglang", "trtllm"]),  # none, decaying and whole reserves
)
def test_invariants_random_scenarios(
    instances, max_num_seqs, budget_extra, block_size, kv_tokens, rate, in_hi, out_hi, router, seed, engine_name
):
    engine = {
        "engine": engine_name,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": max(max_num_seqs, 16) + budget_extra,
        "block_size": block_size,
        "max_model_len": 2048,
    }
    engine["gpu_memory_utilization"] = util_for_kv_tokens(kv_tokens, engine)
    scn = scenario(
        seed=seed,
        pools=pool(instances=instances, router=router, engine=engine),
        workload={
            "arrival": {"kind": "poisson", "rate": rate},
            "input_length": {"kind": "uniform", "low": 1, "high": in_hi},
            "output_length": {"kind": "uniform", "low": 1, "high": out_hi},
            "num_requests": 150,
        },
    )
    check_invariants(simulate(scn))


def test_preemption_path_is_exercised_and_consistent():
    engine = {"max_num_seqs": 64, "max_num_batched_tokens": 512, "max_model_len": 2048}
    engine["gpu_memory_utilization"] = util_for_kv_tokens(6000, engine)
    scn = scenario(
        pools=pool(engine=engine),
        workload={
            "arrival": {"kind": "poisson", "rate": 50.0},
            "input_length": {"kind": "uniform", "low": 200, "high": 1500},
            "output_length": {"kind": "uniform", "low": 100, "high": 500},
            "num_requests": 400,
        },
    )
    res = simulate(scn)
    assert res.summary["preemptions"] > 0
    assert res.summary["max_kv_occupancy"] > 0.9
    check_invariants(res)


def _bytes(res) -> bytes:
    buf = io.BytesIO()
    res.requests.to_parquet(buf, index=False)
    res.steps.to_parquet(buf, index=False)
    return buf.getvalue()


def test_same_seed_same_bytes_and_replications_differ():
    scn = scenario(
        workload={
            "arrival": {"kind": "gamma", "rate": 20.0, "cv": 3.0},
            "input_length": {"kind": "lognormal", "mean": 500, "cv": 1.5},
            "output_length": {"kind": "lognormal", "mean": 100, "cv": 1.0},
            "num_requests": 500,
        }
    )
    a, b = simulate(scn), simulate(scn)
    assert _bytes(a) == _bytes(b)
    assert a.summary == b.summary
    assert _bytes(simulate(scn, replication=1)) != _bytes(a)


def _mean_ttft(rate=None, instances=1, reps=4) -> float:
    vals = []
    for r in range(reps):
        scn = scenario(
            pools=pool(instances=instances, engine={"max_num_seqs": 64}),
            workload={
                "arrival": {"kind": "poisson", "rate": rate},
                "input_length": {"kind": "uniform", "low": 100, "high": 3000},
                "output_length": {"kind": "uniform", "low": 10, "high": 300},
                "num_requests": 600,
            },
        )
        vals.append(simulate(scn, replication=r).requests["ttft_s"].mean())
    return float(np.mean(vals))


def test_more_load_never_lowers_mean_ttft():
    ttft = [_mean_ttft(rate=r) for r in (5.0, 15.0, 30.0, 45.0)]
    assert all(b >= a for a, b in zip(ttft, ttft[1:], strict=False)), ttft
    assert ttft[-1] > 2 * ttft[0]


def test_more_instances_never_raise_mean_ttft():
    ttft = [_mean_ttft(rate=60.0, instances=n) for n in (1, 2, 4)]
    assert all(b <= a for a, b in zip(ttft, ttft[1:], strict=False)), ttft
    assert ttft[0] > 2 * ttft[-1]


@pytest.mark.parametrize("concurrency", [1, 8])
def test_closed_loop_keeps_concurrency(concurrency):
    scn = scenario(
        workload={
            "arrival": {"kind": "closed", "concurrency": concurrency},
            "input_length": {"kind": "fixed", "value": 128},
            "output_length": {"kind": "fixed", "value": 16},
            "num_requests": 80,
        }
    )
    res = simulate(scn)
    check_invariants(res)
    assert res.steps["batch_size"].max() == concurrency
    req = res.requests.sort_values("arrival_s")
    # The k-th request of each client is sent when that client's previous one finished.
    sends = np.sort(req["arrival_s"].to_numpy())
    assert (sends[:concurrency] == 0).all()
    finishes = np.sort(req["finish_s"].to_numpy())
    assert np.allclose(sends[concurrency:], finishes[:-concurrency])
