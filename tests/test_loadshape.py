"""Time-varying load (simulator/loadshape.py): thinning gives the shape's rate, deterministically."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.errors import WorkloadError
from simulator.loadshape import ShapedArrivals, shaped_arrivals
from simulator.run import simulate
from simulator.scenario import ScenarioError
from tests.conftest import scenario


def arrivals(shape: dict, duration: float, seed: int = 0) -> np.ndarray:
    arr = ShapedArrivals(shape=shape)
    return shaped_arrivals(arr, duration, None, np.random.default_rng(seed), 10**8)


def count(t: np.ndarray, a: float, b: float) -> int:
    return int(((t >= a) & (t < b)).sum())


def within(n: int, expected: float, sigmas: float = 5.0) -> bool:
    """Poisson count ``n`` within ``sigmas`` standard deviations of its mean."""
    return abs(n - expected) <= sigmas * math.sqrt(expected) + 1


def test_step_rates_before_and_after():
    t = arrivals({"kind": "step", "before": 5, "after": 50, "at_s": 200}, 400)
    assert within(count(t, 0, 200), 5 * 200) and within(count(t, 200, 400), 50 * 200)
    assert (np.diff(t) >= 0).all() and t[-1] < 400


def test_ramp_integrates_linearly():
    t = arrivals({"kind": "ramp", "start_rate": 0, "end_rate": 100, "start_s": 100, "end_s": 300}, 400)
    assert count(t, 0, 100) == 0
    assert within(count(t, 100, 200), 0.5 * 50 * 100)  # mean rate 25 over the first half
    assert within(count(t, 200, 300), 75 * 100)
    assert within(count(t, 300, 400), 100 * 100)


def test_diurnal_peaks_and_troughs():
    day = 1000.0
    t = arrivals({"kind": "diurnal", "mean": 40, "amplitude": 0.9, "period_s": day}, day)
    # quarter periods: the sine's integral over [0, T/4] is T/(2 pi)
    q = day / 4
    peak = 40 * (q + 0.9 * day / (2 * math.pi))
    trough = 40 * (q - 0.9 * day / (2 * math.pi))
    assert within(count(t, 0, q), peak) and within(count(t, 2 * q, 3 * q), trough)
    assert within(len(t), 40 * day)


def test_piecewise_and_trace_rate(tmp_path):
    t = arrivals({"kind": "piecewise", "times_s": [0, 100], "rates": [10, 30]}, 200)
    assert within(count(t, 0, 100), 2000) and within(count(t, 100, 200), 3000)
    trace = tmp_path / "t.csv"
    # a trace with 1 request/s for 60 s, then 5/s for 60 s
    ts = list(np.arange(0, 60, 1.0)) + list(60 + np.arange(0, 60, 0.2))
    trace.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{x:.3f},10,10\n" for x in ts))
    t = arrivals({"kind": "trace", "path": str(trace), "bin_s": 60, "scale": 10}, 120)
    assert within(count(t, 0, 60), 600) and within(count(t, 60, 120), 3000)


def test_same_seed_same_times_and_workload_integration():
    shape = {"kind": "step", "before": 1, "after": 3, "at_s": 10}
    assert np.array_equal(arrivals(shape, 50, 7), arrivals(shape, 50, 7))
    assert not np.array_equal(arrivals(shape, 50, 7), arrivals(shape, 50, 8))
    wl = {
        "arrival": {"kind": "shaped", "shape": shape},
        "duration_s": 50,
        "input_length": {"kind": "fixed", "value": 64},
        "output_length": {"kind": "fixed", "value": 8},
    }
    a, b = simulate(scenario(workload=wl)), simulate(scenario(workload=wl))
    assert a.requests.equals(b.requests) and a.summary["requests"] > 50


@pytest.mark.parametrize(
    "arrival, match",
    [
        (
            {"kind": "shaped", "shape": {"kind": "ramp", "start_rate": 1, "end_rate": 2, "start_s": 5, "end_s": 5}},
            "end_s=5.0 must be after start_s=5.0",
        ),
        ({"kind": "shaped", "shape": {"kind": "piecewise", "times_s": [0, 1], "rates": [1]}}, "one rate per time"),
        ({"kind": "shaped", "shape": {"kind": "diurnal", "mean": 1, "amplitude": 1.5}}, "amplitude"),
        ({"kind": "shaped", "shape": {"kind": "step", "before": -1, "after": 1, "at_s": 0}}, "before"),
    ],
)
def test_bad_shapes_name_the_field(arrival, match):
    wl = {
        "arrival": arrival,
        "duration_s": 10,
        "input_length": {"kind": "fixed", "value": 8},
        "output_length": {"kind": "fixed", "value": 8},
    }
    with pytest.raises(ScenarioError, match=match):
        scenario(workload=wl)


def test_shaped_needs_a_duration():
    with pytest.raises(WorkloadError, match="needs duration_s"):
        shaped_arrivals(
            ShapedArrivals(shape={"kind": "step", "before": 1, "after": 1, "at_s": 0}),
            None,
            10,
            np.random.default_rng(0),
            10**6,
        )
    with pytest.raises(WorkloadError, match="rate is 0 everywhere"):
        arrivals({"kind": "step", "before": 0, "after": 0, "at_s": 1}, 10)
