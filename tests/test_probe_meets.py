"""A probe's verdict alone (goodput.probe_meets) is the full probe's verdict, and stops runs it has settled.

The early stop is exact by construction (a bound on the attainment that only falls as misses are counted);
checked here against the full probe over rates from idle to overloaded, colocated and PD, with one to
three replications, judged whole or in steady state, and with TTFT-only and TPOT-only SLOs.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import goodput
from simulator.goodput import Decided, probe, probe_meets, with_rate
from simulator.scenario import parse_scenario


def _scenario(pd_: bool, slo: dict) -> dict:
    data = {
        "name": "verdict",
        "seed": 5,
        "model": "Llama-3.1-8B",
        "pools": [{"gpu": "H100", "tp": 1, "instances": 2}],
        "slo": slo,
        "workload": {
            "arrival": {"kind": "poisson", "rate": 10.0},
            "num_requests": 300,
            "input_length": {"kind": "lognormal", "mean": 2000, "cv": 1.0, "low": 8, "high": 8000},
            "output_length": {"kind": "lognormal", "mean": 300, "cv": 1.0, "low": 1, "high": 1500},
        },
    }
    if pd_:
        data["pools"] = [
            {"name": "p", "role": "prefill", "gpu": "H100", "tp": 1, "instances": 1},
            {"name": "d", "role": "decode", "gpu": "H100", "tp": 1, "instances": 1},
        ]
        data["kv_transfer"] = {"connector": "nixl", "fabric": "ib-ndr"}
    return data


SLOS = [
    {"ttft_s": 1.0, "tpot_s": 0.03, "attainment": 0.9},
    {"ttft_s": 0.5, "attainment": 0.5},
    {"tpot_s": 0.025, "attainment": 0.99},
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pd_=st.booleans(),
    slo=st.sampled_from(SLOS),
    rate=st.floats(1.0, 80.0),
    reps=st.integers(1, 3),
    trim=st.sampled_from([None, 5.0]),
)
def test_the_verdict_is_the_full_probes(pd_, slo, rate, reps, trim):
    scn = with_rate(parse_scenario(_scenario(pd_, slo)), rate)
    assert probe_meets(scn, reps, steady_trim_s=trim) == probe(scn, reps, steady_trim_s=trim).meets(scn.slo)


@pytest.mark.parametrize("pd_", [False, True], ids=["colocated", "pd"])
def test_runs_stop_once_settled(pd_, monkeypatch):
    """Overloaded: inside the first replication ("no").  Meeting the SLO: the first replication stops
    when its last judged request ends (the drain after it cannot change the figures), the second when
    the "yes" is settled, at the latest at the same point."""
    stopped, ended = [], []
    real = goodput.simulate_requests

    def spy(scn, r, db=None, watch=None):
        try:
            req = real(scn, r, db, watch=watch)
        except Decided as d:
            stopped.append((r, d.verdict))
            raise
        ended.append(r)
        return req

    monkeypatch.setattr(goodput, "simulate_requests", spy)
    scn = parse_scenario(_scenario(pd_, SLOS[0]))
    assert not probe_meets(with_rate(scn, 60.0), 2, steady_trim_s=5.0)
    assert stopped == [(0, False)] and ended == []
    stopped.clear()
    assert probe_meets(with_rate(scn, 1.0), 2, steady_trim_s=5.0)
    assert ended == [] and stopped[0] == (0, None) and stopped[1] in [(1, True), (1, None)] and len(stopped) == 2


def test_operations_runs_go_to_their_end(monkeypatch):
    """Where the requests table may differ from the recorder (operations restore re-prefilled requests),
    no watch is attached, and the verdict is still the full probe's."""
    data = _scenario(False, SLOS[0]) | {"operations": {"queue_timeout_s": 1000.0}}
    scn = with_rate(parse_scenario(data), 60.0)
    seen = []
    real = goodput.VerdictWatch.__init__

    def spy(self, *a, **kw):
        seen.append(1)
        real(self, *a, **kw)

    monkeypatch.setattr(goodput.VerdictWatch, "__init__", spy)
    assert probe_meets(scn, 1) == probe(scn, 1).meets(scn.slo)
    assert not seen


@pytest.mark.parametrize("pd_", [False, True], ids=["colocated", "pd"])
def test_a_rate_sweep_crosses_the_slo_with_the_same_verdicts(pd_):
    scn = parse_scenario(_scenario(pd_, SLOS[0]))
    full = [probe(with_rate(scn, r), 2, steady_trim_s=5.0).meets(scn.slo) for r in (1.0, 4.0, 8.0, 16.0, 32.0, 64.0)]
    fast = [probe_meets(with_rate(scn, r), 2, steady_trim_s=5.0) for r in (1.0, 4.0, 8.0, 16.0, 32.0, 64.0)]
    assert fast == full
    assert set(full) == {True, False}
