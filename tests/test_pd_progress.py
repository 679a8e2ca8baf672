"""PD runs always make progress: tiny decode batches and KV caches never leave requests stuck.

A decode instance holds KV blocks for prompts it has pulled (or is pulling) but not yet
started; with a batch of one or two sequences and a cache that fits little more than one
request, those idle blocks can starve the running decode.  Without ``max_time_s`` every
request must still end completed or rejected.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.run import simulate
from simulator.scenario import parse_scenario
from tests.test_pd import check_pd


def pd_tiny_decode(decode_engine: dict, workload: dict, seed: int = 1, n_p: int = 1, n_d: int = 1, flow: str = "vllm"):
    return parse_scenario(
        {
            "name": "pd-tiny-decode",
            "seed": seed,
            "model": "Llama-3.1-8B",
            "pools": [
                {"name": "p", "role": "prefill", "gpu": "H100", "tp": 1, "instances": n_p},
                {"name": "d", "role": "decode", "gpu": "H100", "tp": 1, "instances": n_d, "engine": decode_engine},
            ],
            "kv_transfer": {"connector": "nixl", "fabric": "ib-ndr", "flow": flow},
            "workload": workload,
        }
    )


def test_one_seq_decode_with_small_cache_finishes_every_request():
    """Issue 17's case: the running decode needs a block while every free block belongs to
    prompts that arrived but cannot start (the batch of one is full)."""
    wl = {
        "arrival": {"kind": "poisson", "rate": 10.0},
        "num_requests": 40,
        "input_length": {"kind": "uniform", "low": 100, "high": 3000},
        "output_length": {"kind": "uniform", "low": 1, "high": 200},
    }
    res = simulate(pd_tiny_decode({"max_num_seqs": 1, "num_gpu_blocks_override": 1200, "max_model_len": 8192}, wl))
    assert res.requests["outcome"].value_counts().to_dict().get("unfinished", 0) == 0
    assert res.summary["completed"] == 40
    check_pd(res)
    # Pulled KV never sits idle while the batch is full, so the lone sequence is never preempted.
    assert res.summary["preemptions"] == 0


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_p=st.integers(1, 2),
    n_d=st.integers(1, 2),
    seqs=st.integers(1, 4),
    in_hi=st.integers(16, 3000),
    out_hi=st.integers(1, 300),
    spare_blocks=st.integers(0, 300),
    rate=st.floats(2.0, 60.0),
    flow=st.sampled_from(["vllm", "sglang"]),
    seed=st.integers(0, 1000),
)
def test_pd_tiny_decode_batches_and_caches_never_stall(n_p, n_d, seqs, in_hi, out_hi, spare_blocks, rate, flow, seed):
    # Enough blocks for the largest request drawn, plus a few: often less than two requests.
    blocks = -(-(in_hi + out_hi) // 16) + spare_blocks
    engine = {"max_num_seqs": seqs, "num_gpu_blocks_override": blocks, "max_model_len": blocks * 16}
    wl = {
        "arrival": {"kind": "poisson", "rate": rate},
        "num_requests": 40,
        "input_length": {"kind": "uniform", "low": 1, "high": in_hi},
        "output_length": {"kind": "uniform", "low": 1, "high": out_hi},
    }
    res = simulate(pd_tiny_decode(engine, wl, seed=seed, n_p=n_p, n_d=n_d, flow=flow))
    outcomes = set(res.requests["outcome"].astype(str))
    assert outcomes <= {"completed", "rejected"}, res.requests["outcome"].value_counts().to_dict()
    check_pd(res)
