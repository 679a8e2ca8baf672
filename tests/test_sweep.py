"""Sweeps (simulator.sweep): the knee against the physics of a queue, the rules on planted records,
knob paths and values, the auto ladder, and Ctrl-C keeping the finished points."""

from __future__ import annotations

import math

import pytest

import hwdb
from simulator.scenario import load_scenario
from simulator.sweep.knee import find_knee
from simulator.sweep.ladder import capacity_rps, extension, ladder
from simulator.sweep.points import SweepError, knob_points, parse_knob, parse_rates, rate_points
from simulator.sweep.prepare import prepare
from simulator.sweep.run import COLUMNS, run_sweep
from tests.conftest import REPO

CHAT = REPO / "examples" / "llama8b_h100_chat.yaml"


@pytest.fixture(scope="module")
def chat():
    scn = load_scenario(CHAT)
    return scn, hwdb.load(scn.hwdb)


@pytest.fixture(scope="module")
def rate_sweep(chat):
    """Llama-3.1-8B on 2x H100 from far below to far above its capacity (about 60 req/s), one seed."""
    scn, db = chat
    prep = prepare(scn, rates="5,10,20,40,60,80,120,200", num_requests=2000, db=db)
    return run_sweep(scn.name, prep.knob, list(prep.points), list(prep.scenarios), workers=2, db=db)


def test_sweep_follows_the_physics_of_a_queue(rate_sweep, chat):
    """With common random numbers the arrivals at two rates are one pattern scaled, so waiting only grows
    with the offered rate; below capacity completions follow arrivals; above it they cannot exceed the
    service capacity, and the knee lies near that capacity."""
    rows = rate_sweep.rows
    assert [r["offered_rps"] for r in rows] == [5, 10, 20, 40, 60, 80, 120, 200]
    assert set(rows[0]) == set(COLUMNS)
    ttft = [r["ttft_p90_s"] for r in rows]
    assert all(b >= a for a, b in zip(ttft[:-1], ttft[1:], strict=True)), ttft
    for r in rows[:3]:  # at most a third of the capacity: the deployment keeps up
        assert abs(r["achieved_rps"] / r["offered_rps"] - 1) < 0.06, r
        assert r["achieved_share"] > 0.95 and r["slo_attainment"] == 1.0
    cap = capacity_rps(chat[0], chat[1])
    assert 40 < cap < 90
    assert max(r["achieved_rps"] for r in rows) < 1.25 * cap
    top = rows[-1]  # 200 req/s, three times the capacity
    assert top["achieved_rps"] < 0.6 * top["offered_rps"] and top["ttft_p90_s"] > 10 * rows[0]["ttft_p90_s"]
    k = rate_sweep.knee
    assert k.reached and k.rate_rps is not None and cap / 4 <= k.rate_rps <= 1.25 * cap
    below = [r for r in rows if r["offered_rps"] <= k.rate_rps]
    assert all(r["achieved_share"] >= 0.9 and r["ttft_p90_s"] <= k.limit_ttft_p90_s for r in below)
    assert k.saturation_rps is not None and k.saturation_rps > k.rate_rps
    past = next(r for r in rows if r["offered_rps"] == k.saturation_rps)
    assert past["achieved_rps"] < 0.9 * past["offered_rps"]
    assert rate_sweep.notes == [] and not rate_sweep.interrupted
    assert rows[0]["cost_usd_per_hour"] == pytest.approx(8.5)  # 2 x H100 at $4.25/h


def _row(rate, ttft, share=1.0):
    return {"offered_rps": rate, "ttft_p90_s": ttft, "achieved_share": share}


def test_knee_rules_on_planted_records():
    rows = [_row(1, 0.1), _row(2, 0.12), _row(4, 0.25), _row(8, 0.5, 0.7), _row(16, 0.2, 0.5)]
    k = find_knee(rows)  # latency bound 3 x 0.1 s; 8 req/s breaks both rules
    assert (k.rate_rps, k.latency_rps, k.following_rps, k.saturation_rps) == (4, 4, 4, 8)
    assert k.reached and k.limit_ttft_p90_s == pytest.approx(0.3) and "3x" in k.rule
    k = find_knee(rows, slo_ttft_s=0.2)  # the SLO is tighter than 3 x the low-load value
    assert k.rate_rps == 2 and k.limit_ttft_p90_s == 0.2 and "knee at 2 req/s" in k.text()
    # a pass above the first failure does not count (16 req/s is back under the latency bound)
    k = find_knee([_row(1, 0.1), _row(2, 0.5), _row(4, 0.1)])
    assert k.latency_rps == 1 and k.rate_rps == 1
    k = find_knee([_row(1, 0.1), _row(2, 0.11)])
    assert not k.reached and k.rate_rps == 2 and "raise the rates" in k.text()
    k = find_knee([_row(1, 0.1, 0.5), _row(2, 0.1, 0.4)])
    assert k.rate_rps is None and k.saturation_rps == 1 and k.text().startswith("no knee")
    assert find_knee([]) is None
    assert find_knee(rows, factor=6.0).latency_rps == 16  # every TTFT p90 within 6 x 0.1 s
    k = find_knee(rows, factor=6.0, tolerance=0.6)
    assert k.rate_rps == 16 and not k.reached


def test_knob_paths_set_one_field_by_index_or_pool_name(chat):
    data = chat[0].model_dump(mode="json")
    pts = knob_points(data, "pools[main].instances", ["1", "3"])
    assert [p.data["pools"][0]["instances"] for p in pts] == [1, 3] and data["pools"][0]["instances"] == 2
    assert pts[1].origin == "--knob pools[main].instances=3"
    pts = knob_points(data, "pools[0].gpu", ["8", "H200"])  # a text field keeps text
    assert [p.value for p in pts] == ["8", "H200"]
    pts = knob_points(data, "pools[0].engine.enforce_eager", ["false", "true"])
    assert [p.value for p in pts] == [False, True]
    pts = knob_points(data, "operations.startup.compile_cache", ["none", "persistent"])
    assert pts[1].data["operations"]["startup"]["compile_cache"] == "persistent"
    assert [p.value for p in knob_points(data, "workload.arrival.rate", ["4", "2"])] == [2.0, 4.0]


@pytest.mark.parametrize(
    "path, values, words",
    [
        ("pools[0].tpp", ["1"], "has no field 'tpp' (did you mean tp?)"),
        ("pools[2].tp", ["1"], "pools has 1 entry, so [2] is out of range"),
        ("pools[decode].tp", ["1"], "no entry named 'decode'; the names are main"),
        ("pools[0].tp", ["two"], "holds a number (now 1); 'two' is not one"),
        ("pools[0].tp", [".nan"], "not a finite number"),
        ("pools[0].engine.enforce_eager", ["1"], "is true or false"),
        ("pools[0].engine", ["1"], "a section, not one value"),
        ("pools", ["1"], "a list, not one value"),
        ("operations.autoscale.main.target_queue", ["2"], "operations.autoscale has no field 'main'"),
        ("pools[0].tp=", ["1"], "is not a field name"),
        ("workload.arrival.rate", ["auto"], "the auto ladder is --rates auto"),
    ],
)
def test_bad_knobs_name_the_path_and_the_fix(chat, path, values, words):
    with pytest.raises(SweepError) as err:
        knob_points(chat[0].model_dump(mode="json"), path, values)
    assert words in str(err.value) and "--knob" in str(err.value)


def test_values_are_validated_by_the_scenario_schema_and_resolve(chat):
    for knob, words in (
        ("pools[0].tp=1,3", "--knob pools[0].tp=3: pools[main].tp=3 neither divides"),
        ("pools[0].instances=1,2.5", "--knob pools[0].instances=2.5: invalid scenario"),
        ("pools[0].gpu=H100,NoSuchGPU", "--knob pools[0].gpu=NoSuchGPU"),
    ):
        with pytest.raises(SweepError) as err:
            prepare(chat[0], knob=knob, db=chat[1])
        assert str(err.value).startswith(words), str(err.value)


def test_rate_lists_and_ladders():
    assert parse_rates("4, 1,2") == [1.0, 2.0, 4.0] and parse_rates(" Auto ") is None
    for text, words in (
        ("0,1", "positive, finite"),
        ("nan", "positive, finite"),
        ("-1", "positive"),
        ("", "no values"),
        ("1,,2", "empty item"),
        ("1,1", "more than once"),
        ("x", "not a number"),
        (",".join(map(str, range(1, 66))), "more than the 64"),
    ):
        with pytest.raises(SweepError, match=words):
            parse_rates(text)
    with pytest.raises(SweepError, match="give PATH=V1,V2"):
        parse_knob("pools[0].tp")
    rates = ladder(60.0, 10)
    assert len(rates) == 10 and rates[0] == 7.5 and rates[-1] == 90.0
    ratios = [b / a for a, b in zip(rates[:-1], rates[1:], strict=True)]
    assert max(ratios) / min(ratios) < 1.01  # geometric, to 3 significant figures
    assert extension(90.0) == [135.0, 202.0]


def test_rate_sweeps_refuse_arrivals_without_a_rate():
    closed = load_scenario(REPO / "examples" / "qwen3_moe_h200_closed_loop.yaml").model_dump(mode="json")
    with pytest.raises(SweepError, match="closed loop of users has no arrival rate; sweep its users"):
        rate_points(closed, [1.0])
    shaped = load_scenario(REPO / "examples" / "autoscale_step_load.yaml").model_dump(mode="json")
    with pytest.raises(SweepError, match="follows a shape over time"):
        rate_points(shaped, [1.0])


def test_auto_ladder_spans_the_knee_and_extends_while_the_top_keeps_up(chat):
    scn, db = chat
    prep = prepare(scn, rates="auto", points=4, num_requests=600, db=db)
    assert prep.auto and 40 < prep.capacity_rps < 90
    assert prep.points[0].value < prep.capacity_rps / 4 and prep.points[-1].value > prep.capacity_rps
    # a ladder stopped far below the capacity keeps up at its top: it is extended above it
    low = prepare(scn, rates="1,2", num_requests=300, db=db)
    res = run_sweep(scn.name, low.knob, list(low.points), list(low.scenarios), workers=1, auto=True, db=db)
    assert res.planned == 6 and [r["offered_rps"] for r in res.rows] == [1.0, 2.0, 3.0, 4.5, 6.75, 10.1]
    assert sum("extended" in n for n in res.notes) == 2 and not res.knee.reached


def test_ctrl_c_keeps_the_finished_points(chat):
    scn, db = chat
    prep = prepare(scn, rates="5,10,20", num_requests=200, db=db)
    seen = []

    def progress(done, total, stage):
        seen.append(done)
        if done == 2:
            raise KeyboardInterrupt

    res = run_sweep(scn.name, prep.knob, list(prep.points), list(prep.scenarios), workers=1, progress=progress)
    assert res.interrupted and [r["offered_rps"] for r in res.rows] == [5.0, 10.0] and res.planned == 3
    assert any(n.startswith("interrupted: 2 of 3 points") for n in res.notes)
    assert res.knee is not None and not math.isnan(res.knee.baseline_ttft_p90_s)
