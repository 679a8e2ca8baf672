"""Stepping without SimPy events changes no result.

Instances advance their clock inline when no other event is due before a step ends, and colocated
open-loop pools step ahead of SimPy up to the next arrival, and the decode instances of a static PD run
step lazily, when a hand-off or a landing of KV catches them up (the run's clock policy,
simulator/engine/stepping.py).  Decode-only steps also take a shorter path.  ``simulate(...,
shortcuts=False)`` switches all of it off to get the plain step with one SimPy event per step, the
reference every table (and the resume gaps, in order) must equal.
"""

from __future__ import annotations

import pandas as pd
import pytest

from simulator import run
from simulator.engine.results import summarize
from simulator.engine.stepping import choose
from simulator.run import simulate, simulate_requests
from simulator.scenario import load_scenario, parse_scenario
from tests.conftest import REPO


def _scenario(**over) -> dict:
    data = {
        "name": "run-ahead",
        "seed": 11,
        "model": "Llama-3.1-8B",
        "pools": [{"gpu": "H100", "tp": 1, "instances": 3, "router": "least_kv"}],
        "workload": {
            "arrival": {"kind": "poisson", "rate": 30.0},
            "num_requests": 600,
            "input_length": {"kind": "lognormal", "mean": 900, "cv": 1.0, "low": 8, "high": 6000},
            "output_length": {"kind": "lognormal", "mean": 300, "cv": 1.0, "low": 2, "high": 2000},
        },
    }
    for key, value in over.items():
        if key == "engine":
            data["pools"][0]["engine"] = value
        elif key == "arrival":
            data["workload"]["arrival"] = value
        else:
            data[key] = value
    return data


CASES = {
    "colocated": _scenario(),
    # 500 KV blocks (8,000 tokens) per instance: the batch outgrows the cache, so requests are preempted and resumed.
    "preemptions": _scenario(engine={"num_gpu_blocks_override": 500, "max_model_len": 8000}),
    "time limit": _scenario(simulation={"max_time_s": 9.0}),
    "closed loop": _scenario(arrival={"kind": "closed", "concurrency": 40}),
    "pd": {
        **_scenario(),
        "pools": [
            {"name": "p", "role": "prefill", "gpu": "H100", "tp": 1, "instances": 1},
            {"name": "d", "role": "decode", "gpu": "H100", "tp": 1, "instances": 2},
        ],
        "kv_transfer": {"connector": "nixl", "fabric": "ib-ndr"},
    },
}
# PD runs whose decode instances step lazily (instance_state.py, catch_up): preempting decode pools,
# a time limit, the SGLang flow (decode chosen at arrival), and a least-KV decode router over three
# instances with two prefill instances, fabric jitter and a P2pNccl receive buffer that spills to host.
_PD = CASES["pd"]
CASES["pd preemptions"] = {
    **_PD,
    "pools": [_PD["pools"][0], {**_PD["pools"][1], "engine": {"num_gpu_blocks_override": 700, "max_model_len": 8000}}],
}
CASES["pd time limit"] = {**_PD, "simulation": {"max_time_s": 9.0}}
CASES["pd sglang"] = {**_PD, "kv_transfer": {**_PD["kv_transfer"], "flow": "sglang"}}
CASES["pd least kv, buffer"] = {
    **_PD,
    "pools": [{**_PD["pools"][0], "instances": 2}, {**_PD["pools"][1], "instances": 3, "router": "least_kv"}],
    "kv_transfer": {"connector": "p2pnccl", "fabric": "ib-ndr", "jitter_mean_s": 0.002, "kv_buffer_size": 5e6},
}


def _run(data: dict, monkeypatch, inline: bool):
    """The results, and the resume gaps in the order the recorder holds them."""
    seen = []

    def spy(req, steps, resume_gaps, **kw):
        seen.append(list(resume_gaps))
        return summarize(req, steps, resume_gaps, **kw)

    monkeypatch.setattr(run, "summarize", spy)
    res = simulate(parse_scenario(data), shortcuts=inline)
    return res, seen[0]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_tables_equal_one_event_per_step(case, monkeypatch):
    ref, ref_gaps = _run(CASES[case], monkeypatch, False)
    fast, fast_gaps = _run(CASES[case], monkeypatch, True)
    assert len(ref.steps) > 1000
    assert fast_gaps == ref_gaps
    pd.testing.assert_frame_equal(fast.requests, ref.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.steps, ref.steps, check_exact=True)
    assert fast.summary == ref.summary or str(fast.summary) == str(ref.summary)  # NaN != NaN


@pytest.mark.parametrize("pre,limit", [("preemptions", "time limit"), ("pd preemptions", "pd time limit")])
def test_the_preemption_case_preempts_and_the_limit_case_stops_early(pre, limit, monkeypatch):
    res, gaps = _run(CASES[pre], monkeypatch, True)
    assert res.summary["preemptions"] > 10 and len(gaps) > 10
    assert len(set(res.requests["instance"])) == (3 if pre == "preemptions" else 2)
    lim = _run(CASES[limit], monkeypatch, True)[0].summary
    assert lim["unfinished"] > 0


@pytest.mark.parametrize(
    "case",
    [
        "colocated",
        "time limit",
        "pd",
        "pd time limit",
        "pd sglang",
        "closed loop",
        "examples/epd_images_epd.yaml",
        "examples/fp8_decode_crashes_pd.yaml",
    ],
    ids=str,
)
def test_requests_alone_are_the_requests_of_the_whole_run(case):
    """The goodput probes run simulate_requests, which keeps no step log and builds no step table, summary
    or link table (with operations the log is kept: the lifecycle counts steps on it)."""
    scn = load_scenario(REPO / case) if case.endswith(".yaml") else parse_scenario(CASES[case])
    if case.endswith(".yaml"):
        scn = scn.model_copy(update={"workload": scn.workload.model_copy(update={"num_requests": 300})})
    pd.testing.assert_frame_equal(simulate_requests(scn, 1), simulate(scn, 1).requests, check_exact=True)


@pytest.mark.parametrize(
    "run, gate, lazy",
    [
        ({}, True, False),  # a static colocated open loop runs ahead
        ({"pd": True}, False, True),  # a static PD open loop steps its decode instances lazily
        ({"pd": True, "decode_dp": 2}, False, False),  # not with lock-stepped decode ranks
        ({"static": False}, False, False),  # operations react to every step
        ({"pd": True, "static": False}, False, False),
        ({"epd": True}, False, False),  # encoders react to steps
        ({"closed_loop": True}, False, False),  # clients are woken by finishes
        ({"shortcuts": False}, False, False),  # the reference: one event per step
    ],
    ids=str,
)
def test_the_clock_policy_is_chosen_once_from_what_reacts_to_steps(run, gate, lazy):
    args = {"static": True, "pd": False, "epd": False, "closed_loop": False, "decode_dp": 1, "step_log": True}
    s = choose(**{**args, **run})
    assert (s.gate is not None, s.lazy_decode, s.inline) == (gate, lazy, run.get("shortcuts", True))
    assert s.gate is None or s.gate == [float("-inf")]
