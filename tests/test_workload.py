"""Workload configs and request generation.

Arrival processes are checked against their theory (mean gap 1/rate, CV of
gaps), length distributions against their bounds and means, and generation
against its contracts: determinism per generator, independence of arrivals
from lengths, and vectorised speed.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from simulator.errors import WorkloadError
from simulator.workload import Requests, generate
from simulator.workload_config import (
    ClosedLoop,
    EmpiricalLength,
    FixedLength,
    Gamma,
    LengthPairs,
    LognormalLength,
    Poisson,
    TraceArrivals,
    UniformLength,
    WorkloadConfig,
)

FIXTURES = Path(__file__).parent / "fixtures"
SHARED_TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"
needs_shared = pytest.mark.skipif(not SHARED_TRACES.is_dir(), reason=f"shared traces not present at {SHARED_TRACES}")
FIXED = {"input_length": FixedLength(value=100), "output_length": FixedLength(value=10)}


def gen(cfg: WorkloadConfig, seed_arr: int = 1, seed_len: int = 2) -> Requests:
    return generate(cfg, np.random.default_rng(seed_arr), np.random.default_rng(seed_len))


def gap_stats(req: Requests) -> tuple[float, float]:
    gaps = np.diff(req.arrival_s)
    return float(gaps.mean()), float(gaps.std() / gaps.mean())


# ------------------------------------------------------------ arrivals


def test_poisson_gaps_have_mean_one_over_rate_and_cv_one():
    req = gen(WorkloadConfig(arrival=Poisson(rate=8.0), num_requests=100_000, **FIXED))
    mean, cv = gap_stats(req)
    assert mean == pytest.approx(1 / 8.0, rel=0.02)
    assert cv == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 4.0])
def test_gamma_gaps_match_requested_cv(cv):
    # The sample CV of very bursty gaps converges slowly (kurtosis 6 cv^2), hence 10^6.
    req = gen(WorkloadConfig(arrival=Gamma(rate=20.0, cv=cv), num_requests=1_000_000, **FIXED))
    mean, got = gap_stats(req)
    assert mean == pytest.approx(1 / 20.0, rel=0.03)
    assert got == pytest.approx(cv, rel=0.03)


def test_arrivals_start_at_zero_sorted_float64():
    req = gen(WorkloadConfig(arrival=Gamma(rate=3.0, cv=2.0), num_requests=1000, **FIXED))
    assert req.arrival_s[0] == 0.0 and req.arrival_s.dtype == np.float64
    assert np.all(np.diff(req.arrival_s) >= 0) and np.isfinite(req.arrival_s).all()
    assert len(req) == 1000 and req.input_tokens.dtype == req.output_tokens.dtype == np.int64


@pytest.mark.parametrize("arrival", [Poisson(rate=50.0), Gamma(rate=50.0, cv=3.0)])
def test_duration_bounds_the_arrivals(arrival):
    req = gen(WorkloadConfig(arrival=arrival, duration_s=200.0, **FIXED))
    assert req.arrival_s[-1] < 200.0
    assert len(req) == pytest.approx(50 * 200, rel=0.1)


def test_num_requests_and_duration_take_whichever_comes_first():
    few = gen(WorkloadConfig(arrival=Poisson(rate=10.0), num_requests=50, duration_s=1e4, **FIXED))
    short = gen(WorkloadConfig(arrival=Poisson(rate=10.0), num_requests=10**6, duration_s=5.0, **FIXED))
    assert len(few) == 50
    assert short.arrival_s[-1] < 5.0 and 20 < len(short) < 100


def test_single_request():
    req = gen(WorkloadConfig(arrival=Poisson(rate=1.0), num_requests=1, **FIXED))
    assert len(req) == 1 and req.arrival_s.tolist() == [0.0]


def test_closed_loop_carries_concurrency_and_think_time():
    req = gen(WorkloadConfig(arrival=ClosedLoop(concurrency=16, think_time_s=0.5), num_requests=300, **FIXED))
    assert req.is_closed_loop and req.concurrency == 16 and req.think_time_s == 0.5
    assert len(req) == 300 and not req.arrival_s.any()


# ------------------------------------------------------------ lengths


def test_uniform_lengths_inclusive_bounds_and_mean():
    cfg = WorkloadConfig(
        arrival=Poisson(rate=1.0),
        num_requests=100_000,
        input_length=UniformLength(low=10, high=20),
        output_length=UniformLength(low=7, high=7),
    )
    req = gen(cfg)
    assert req.input_tokens.min() == 10 and req.input_tokens.max() == 20
    assert req.input_tokens.mean() == pytest.approx(15, rel=0.01)
    assert (req.output_tokens == 7).all()


def test_lognormal_mean_and_cv():
    dist = LognormalLength(mean=1000, cv=1.0)
    req = gen(WorkloadConfig(arrival=Poisson(rate=1.0), num_requests=200_000, input_length=dist, output_length=dist))
    x = req.input_tokens
    assert x.mean() == pytest.approx(1000, rel=0.02)
    assert x.std() / x.mean() == pytest.approx(1.0, rel=0.05)
    assert x.min() >= 1


def test_lognormal_clip():
    dist = LognormalLength(mean=500, cv=2.0, low=64, high=2048)
    req = gen(
        WorkloadConfig(
            arrival=Poisson(rate=1.0), num_requests=50_000, input_length=dist, output_length=FixedLength(value=1)
        )
    )
    assert req.input_tokens.min() == 64 and req.input_tokens.max() == 2048


@settings(max_examples=40, deadline=None)
@given(
    mean=st.floats(1, 1e5),
    cv=st.floats(0.01, 5),
    low=st.integers(1, 50),
    span=st.integers(0, 10_000),
    seed=st.integers(0, 2**32 - 1),
)
def test_length_bounds_hold_for_any_parameters(mean, cv, low, span, seed):
    cfg = WorkloadConfig(
        arrival=Poisson(rate=1.0),
        num_requests=500,
        input_length=LognormalLength(mean=mean, cv=cv, low=low, high=low + span),
        output_length=UniformLength(low=low, high=low + span),
    )
    req = gen(cfg, seed, seed + 1)
    for x in (req.input_tokens, req.output_tokens):
        assert x.min() >= low and x.max() <= low + span


def test_empirical_values_and_file():
    req = gen(
        WorkloadConfig(
            arrival=Poisson(rate=1.0),
            num_requests=5000,
            input_length=EmpiricalLength(values=(3, 5, 8)),
            output_length=EmpiricalLength(path=FIXTURES / "sharegpt_lengths_head.csv", column="num_decode_tokens"),
        )
    )
    assert set(req.input_tokens.tolist()) == {3, 5, 8}
    assert set(req.output_tokens.tolist()) <= {918, 905, 711, 950, 787, 742, 855, 311, 390, 572, 433, 363, 290, 894}


def test_pairs_sample_whole_rows():
    path = FIXTURES / "sharegpt_lengths_head.csv"
    rows = {tuple(map(int, line.split(",")[:2])) for line in path.read_text().splitlines()[1:]}
    req = gen(
        WorkloadConfig(
            arrival=Poisson(rate=1.0),
            num_requests=2000,
            lengths=LengthPairs(path=path, input_column="num_prefill_tokens", output_column="num_decode_tokens"),
        )
    )
    pairs = set(zip(req.input_tokens.tolist(), req.output_tokens.tolist(), strict=True))
    assert pairs <= rows and len(pairs) == len(rows)


def test_empirical_file_errors_are_trace_errors():
    cfg = WorkloadConfig(
        arrival=Poisson(rate=1.0),
        num_requests=5,
        input_length=EmpiricalLength(path=FIXTURES / "sharegpt_lengths_head.csv", column="prompt_len"),
        output_length=FixedLength(value=1),
    )
    with pytest.raises(ValueError, match="prompt_len"):
        gen(cfg)


# ------------------------------------------------------------ determinism and streams


def _mixed() -> WorkloadConfig:
    return WorkloadConfig(
        arrival=Gamma(rate=5.0, cv=2.0),
        num_requests=10_000,
        input_length=LognormalLength(mean=800, cv=1.5, high=8192),
        output_length=UniformLength(low=1, high=512),
    )


def test_same_seeds_give_identical_bytes():
    a, b = gen(_mixed(), 7, 8), gen(_mixed(), 7, 8)
    for name in ("arrival_s", "input_tokens", "output_tokens"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes()
    assert gen(_mixed(), 9, 8).arrival_s.tobytes() != a.arrival_s.tobytes()


def test_changing_lengths_leaves_arrivals_unchanged():
    other = _mixed().model_copy(
        update={"input_length": FixedLength(value=3), "output_length": LognormalLength(mean=50, cv=0.3)}
    )
    a, b = gen(_mixed(), 7, 8), gen(other, 7, 8)
    assert a.arrival_s.tobytes() == b.arrival_s.tobytes()
    assert a.input_tokens.tobytes() != b.input_tokens.tobytes()


def test_generating_100k_requests_is_fast():
    cfg = _mixed().model_copy(update={"num_requests": 100_000})
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        req = gen(cfg)
        best = min(best, time.perf_counter() - t0)
    assert len(req) == 100_000 and best < 0.1


def test_requests_are_immutable():
    req = gen(_mixed())
    with pytest.raises(ValueError):
        req.arrival_s[0] = 1.0
    with pytest.raises(AttributeError):
        req.arrival_s = np.zeros(3)  # type: ignore[misc]


# ------------------------------------------------------------ traces

AZURE = FIXTURES / "azure_conv_head.csv"
MOONCAKE = FIXTURES / "mooncake_conv_head.jsonl"


def test_trace_replay_supplies_arrivals_and_lengths():
    req = gen(WorkloadConfig(arrival=TraceArrivals(path=AZURE)))
    assert len(req) == 15 and req.input_tokens[0] == 374 and req.output_tokens[1] == 109
    assert req.arrival_s[1] == pytest.approx(4.314579)


def test_trace_time_scale_and_rate():
    base = gen(WorkloadConfig(arrival=TraceArrivals(path=AZURE)))
    slow = gen(WorkloadConfig(arrival=TraceArrivals(path=AZURE, time_scale=2.0)))
    fast = gen(WorkloadConfig(arrival=TraceArrivals(path=AZURE, rate=30.0), num_requests=10))
    assert np.allclose(slow.arrival_s, 2 * base.arrival_s)
    assert (len(fast) - 1) / (fast.arrival_s[-1] - fast.arrival_s[0]) == pytest.approx(30.0)
    assert np.allclose(fast.arrival_s / fast.arrival_s[-1], base.arrival_s[:10] / base.arrival_s[9])


def test_trace_limits_and_duration():
    assert len(gen(WorkloadConfig(arrival=TraceArrivals(path=AZURE, limit=4)))) == 4
    req = gen(WorkloadConfig(arrival=TraceArrivals(path=AZURE), duration_s=5.0))
    assert len(req) == 4 and req.arrival_s[-1] < 5.0
    with pytest.raises(WorkloadError, match="has 15 requests"):
        gen(WorkloadConfig(arrival=TraceArrivals(path=AZURE), num_requests=16))


def test_trace_rate_needs_a_time_span():
    with pytest.raises(WorkloadError, match="all arrive at once"):
        gen(WorkloadConfig(arrival=TraceArrivals(path=MOONCAKE, rate=2.0), num_requests=10))


def test_trace_hash_ids_and_overrides():
    req = gen(WorkloadConfig(arrival=TraceArrivals(path=MOONCAKE)))
    assert req.hash_block_tokens == 512 and len(req.hash_ids) == 14
    out = gen(WorkloadConfig(arrival=TraceArrivals(path=MOONCAKE), output_length=FixedLength(value=2)))
    assert (out.output_tokens == 2).all() and out.hash_ids == req.hash_ids
    assert (out.input_tokens == req.input_tokens).all()
    inp = gen(WorkloadConfig(arrival=TraceArrivals(path=MOONCAKE), input_length=FixedLength(value=9)))
    assert inp.hash_ids is None and (inp.output_tokens == req.output_tokens).all()


@needs_shared
def test_full_azure_trace_rescaled_to_target_rate():
    path = SHARED_TRACES / "azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
    req = gen(WorkloadConfig(arrival=TraceArrivals(path=path, rate=20.0)))
    assert len(req) == 19366
    assert (len(req) - 1) / req.arrival_s[-1] == pytest.approx(20.0, rel=1e-9)


@needs_shared
def test_full_sharegpt_pairs():
    path = SHARED_TRACES / "sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
    req = gen(
        WorkloadConfig(
            arrival=Poisson(rate=1.0),
            num_requests=100_000,
            lengths=LengthPairs(path=path, input_column="num_prefill_tokens", output_column="num_decode_tokens"),
        )
    )
    assert req.input_tokens.mean() == pytest.approx(2340.0, rel=0.02)
    assert req.output_tokens.mean() == pytest.approx(438.7, rel=0.02)


# ------------------------------------------------------------ validation

BAD = [
    ({"arrival": {"kind": "poisson", "rate": 0}}, "arrival.poisson.rate", "from 1e-6 to 1e7 requests/s"),
    ({"arrival": {"kind": "gamma", "rate": 1, "cv": 0}}, "arrival.gamma.cv", "from 0.001 to 100"),
    ({"arrival": {"kind": "poisson", "rate": float("inf")}}, "rate", "from 1e-6 to 1e7"),
    ({"arrival": {"kind": "poison", "rate": 1}}, "arrival", "'poisson', 'gamma', 'trace', 'closed'"),
    ({"arrival": {"kind": "closed", "concurrency": 0}}, "concurrency", "from 1 to 5e7 users"),
    ({"arrival": {"kind": "closed", "concurrency": 2, "think_time_s": -1}}, "think_time_s", "0"),
    ({"num_requests": 0}, "num_requests", "from 1 to 5e7 requests"),
    ({"input_length": {"kind": "uniform", "low": 9, "high": 3}}, "input_length.uniform", "make low <= high"),
    (
        {"input_length": {"kind": "lognormal", "mean": 100, "cv": 1, "low": 9, "high": 3}},
        "input_length.lognormal",
        "make low <= high",
    ),
    ({"output_length": {"kind": "fixed", "value": 0}}, "output_length.fixed.value", "1"),
    ({"output_length": {"kind": "normal", "mean": 3}}, "output_length", "'fixed', 'uniform', 'lognormal', 'empirical'"),
    ({"input_length": {"kind": "empirical", "path": "x.csv"}}, "input_length.empirical", "column is required"),
    (
        {"input_length": {"kind": "empirical", "values": [1, 2], "path": "x.csv"}},
        "input_length.empirical",
        "exactly one of",
    ),
    ({"input_length": {"kind": "empirical", "values": []}}, "values", "at least 1"),
    (
        {"arrival": {"kind": "trace", "path": "t.csv", "rate": 2, "time_scale": 3}},
        "arrival.trace",
        "either time_scale or rate",
    ),
    (
        {"arrival": {"kind": "trace", "path": "t.csv", "format": "csv"}},
        "format",
        "'azure', 'mooncake', 'plain' or 'auto'",
    ),
    ({"extra": 1}, "extra", "Extra inputs are not permitted"),
    ({"output_length": None}, "", "needs lengths: give input_length and output_length"),
    ({"num_requests": None}, "", "needs num_requests, duration_s or both"),
    ({"arrival": {"kind": "closed", "concurrency": 2}, "num_requests": None}, "", "closed loop needs num_requests"),
    ({"lengths": {"kind": "pairs", "path": "p.csv", "input_column": "a", "output_column": "b"}}, "", "not both"),
]


@pytest.mark.parametrize("change, field, phrase", BAD, ids=[str(i) for i in range(len(BAD))])
def test_invalid_configs_name_the_field_and_the_fix(change, field, phrase):
    data = {
        "arrival": {"kind": "poisson", "rate": 1.0},
        "num_requests": 10,
        "input_length": {"kind": "fixed", "value": 5},
        "output_length": {"kind": "fixed", "value": 5},
    }
    data.update(change)
    with pytest.raises(ValidationError) as info:
        WorkloadConfig.model_validate(data)
    assert field in str(info.value) and phrase in str(info.value)


def test_config_is_frozen_and_round_trips():
    cfg = _mixed()
    with pytest.raises(ValidationError):
        cfg.num_requests = 5  # type: ignore[misc]
    assert WorkloadConfig.model_validate(cfg.model_dump()) == cfg
    assert WorkloadConfig.model_validate_json(cfg.model_dump_json()) == cfg
