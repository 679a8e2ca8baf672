"""The plan's per-family verdict (issue 32): each family is represented by its cheapest candidate that
meets the SLO (simulated if one does, else by the screen, and the verdict says which), and only a
family where nothing meets the SLO falls back to its closest candidate, saying so.

The rows are built by hand in the shape that ``runner._run_plan`` gives ``rank.assemble`` (screen
figures per candidate, simulation records for the verified ones), so no simulation runs here."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from simulator.plan import parse_plan_request
from simulator.plan.rank import assemble

SLO = {"ttft_s": 1.0, "tpot_s": 0.05, "attainment": 0.9}


def _request(families=("colocated", "pd")):
    return parse_plan_request(
        {
            "name": "verdict",
            "model": "Llama-3.1-8B",
            "workload": {
                "arrival": {"kind": "poisson", "rate": 10.0},
                "input_length": {"kind": "fixed", "value": 1000},
                "output_length": {"kind": "fixed", "value": 200},
                "num_requests": 200,
            },
            "slo": SLO,
            "gpus": [{"name": "H100"}, {"name": "H200"}],
            "constraints": {"families": list(families)},
            "search": {"replications": 2},
        }
    )


def _row(cid: str, family: str, layout: str, cost: float, goodput: float, passes: bool, reason: str = "") -> dict:
    """A screened candidate: ``passes`` the screen at the target rate (10 req/s) or not, with ``reason``."""
    return {
        "id": cid,
        "family": family,
        "layout": layout,
        "gpus": 0,
        "cost_usd_per_hour": cost,
        "percentile": 90,
        "est_ttft_s": 0.4 if passes else 3.0,
        "est_tpot_s": 0.03 if passes else 0.08,
        "est_goodput_rps": goodput,
        "est_meets_slo": passes,
        "rejected_reason": "" if passes else (reason or "ttft: 3 s > 1 s at 10 req/s"),
    }


def _memory(cid: str, family: str, cost: float) -> dict:
    """A candidate ruled out before screening (the model does not fit)."""
    r = _row(cid, family, cid, cost, 0.0, False, "memory: weights do not fit")
    r.update(est_ttft_s=float("inf"), est_tpot_s=float("inf"))
    return r


def _sim(cid: str, goodput: float, meets: bool) -> dict:
    """A simulation record, as ``verify_task`` returns it, at the target rate."""
    return {
        "id": cid,
        "des_ttft_s": 0.5 if meets else 2.5,
        "des_tpot_s": 0.03 if meets else 0.07,
        "des_goodput_rps": goodput,
        "des_meets_slo": meets,
        "des_attainment": 0.97 if meets else 0.4,
        "des_attainment_ci95": 0.01,
        "des_goodput_capped": False,
        "des_runs": 2,
    }


def _verdict(rows, sims, families=("colocated", "pd")):
    ctx = SimpleNamespace(stats=SimpleNamespace(mean_out=200.0))
    res = assemble(_request(families), ctx, rows, {s["id"]: s for s in sims}, {})
    return res, res.families.set_index("family")


def test_issue_32_cheapest_screen_passing_colocated_not_the_highest_goodput():
    """The reported case: the family's cheapest screen-accepted candidate failed its simulation, so no
    colocated candidate is verified to pass; the verdict named the 16x H200 ($163.20/h, highest
    goodput) although 6x H100 at $51/h passes the screen."""
    rows = [
        _row("pd-a", "pd", "2x H100 prefill + 2x H100 decode", 40.0, 12.0, True),
        _row("co-4h100", "colocated", "4x H100 TP2 fp8", 34.0, 11.0, True),
        _row("co-6h100", "colocated", "6x H100 TP2 fp8", 51.0, 16.0, True),
        _row("co-16h200", "colocated", "16x H200 TP2 fp8", 163.20, 60.0, True),
        _row("co-2h100", "colocated", "2x H100 TP2 fp8", 17.0, 5.0, False),
    ]
    sims = [_sim("pd-a", 12.5, True), _sim("co-4h100", 8.0, False)]
    res, fam = _verdict(rows, sims)
    assert res.recommended["id"] == "pd-a"
    co = fam.loc["colocated"]
    assert co["best_id"] == "co-6h100" and co["layout"] == "6x H100 TP2 fp8"
    assert co["cost_usd_per_hour"] == 51.0
    assert co["basis"] == "screen"
    assert "passes the screen, not simulated" in co["lost_because"]
    assert "$11.00/h more" in co["lost_because"]  # than the $40/h recommendation
    assert fam.loc["pd", "lost_because"] == "recommended" and fam.loc["pd", "basis"] == "simulated"


def test_a_simulated_pass_represents_the_family_before_a_cheaper_screen_pass():
    rows = [
        _row("pd-a", "pd", "pd a", 40.0, 12.0, True),
        _row("co-cheap-screen", "colocated", "co screen only", 45.0, 14.0, True),
        _row("co-80", "colocated", "co verified cheap", 80.0, 15.0, True),
        _row("co-120", "colocated", "co verified big", 120.0, 40.0, True),
    ]
    sims = [_sim("pd-a", 12.5, True), _sim("co-80", 15.5, True), _sim("co-120", 41.0, True)]
    _, fam = _verdict(rows, sims)
    co = fam.loc["colocated"]
    assert co["best_id"] == "co-80" and co["basis"] == "simulated"
    assert co["lost_because"] == "meets the SLO (simulated); lost on cost: $40.00/h more"


def test_without_a_recommendation_the_cheapest_screen_pass_asks_for_more_verification():
    rows = [
        _row("pd-a", "pd", "pd a", 40.0, 12.0, True),
        _row("co-6h100", "colocated", "6x H100 TP2 fp8", 51.0, 16.0, True),
        _row("co-16h200", "colocated", "16x H200 TP2 fp8", 163.20, 60.0, True),
    ]
    sims = [_sim("pd-a", 7.0, False)]
    res, fam = _verdict(rows, sims)
    assert res.recommended is None
    co = fam.loc["colocated"]
    assert co["best_id"] == "co-6h100" and co["basis"] == "screen"
    assert co["lost_because"] == "passes the screen, not simulated; raise search.verify to simulate it"
    # pd's only candidate failed its simulation: none of that family passes
    assert fam.loc["pd", "basis"] == "none"
    assert fam.loc["pd", "lost_because"].startswith("no pd candidate meets the SLO")


def test_a_family_where_nothing_passes_says_so_and_shows_its_closest_candidate():
    rows = [
        _row("pd-a", "pd", "pd a", 40.0, 12.0, True),
        _memory("co-mem", "colocated", 10.0),
        _row("co-sim-fail", "colocated", "co simulated, fails", 60.0, 11.0, True),
        _row("co-screen-fail", "colocated", "co screen fails", 30.0, 6.0, False),
        _row("co-slow", "colocated", "co slow", 20.0, 2.0, False),
    ]
    sims = [_sim("pd-a", 12.5, True), _sim("co-sim-fail", 9.0, False)]
    _, fam = _verdict(rows, sims)
    co = fam.loc["colocated"]
    assert co["basis"] == "none"
    assert co["lost_because"].startswith("no colocated candidate meets the SLO (simulated or screen)")
    # the closest: the highest goodput among the screened rows (the simulated 9 req/s), with its limit
    assert co["best_id"] == "co-sim-fail"
    assert "simulated: attainment" in co["lost_because"]
    assert "cost" not in co["lost_because"]


def test_a_family_ruled_out_before_screening_falls_back_to_its_cheapest_row():
    rows = [
        _row("pd-a", "pd", "pd a", 40.0, 12.0, True),
        _memory("co-mem-big", "colocated", 30.0),
        _memory("co-mem-small", "colocated", 10.0),
    ]
    _, fam = _verdict(rows, [_sim("pd-a", 12.5, True)])
    co = fam.loc["colocated"]
    assert co["basis"] == "none" and co["best_id"] == "co-mem-small"
    assert co["lost_because"].endswith("limited by: memory: weights do not fit")


def test_an_allowed_family_without_candidates():
    rows = [_row("pd-a", "pd", "pd a", 40.0, 12.0, True)]
    _, fam = _verdict(rows, [_sim("pd-a", 12.5, True)])
    assert fam.loc["colocated", "lost_because"] == "no candidates" and pd.isna(fam.loc["colocated", "best_id"])
