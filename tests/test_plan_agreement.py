"""Issue 16 must-show: how well the planner's analytic screen agrees with the discrete-event simulation.

Each shipped plan example (``examples/plan*.yaml``) is planned as shipped; for every candidate the
simulation verified, the screen's goodput is compared with the simulated one (``est/des - 1``).
Candidates whose simulated goodput hit the search ceiling (``goodput_capped``) are left out: their
simulated figure is only a lower bound.  The simulated goodput is itself a bisection's lower end (one
step, a few per cent, below the true value), so part of the screen's optimism is that step.

Measured (this commit, all three examples, 24 uncapped candidates): PD -4 .. +25 % (median +5 %; the +25 %
is plan_hetero_pd's 1p1d with one H100 prefill instance for 6,000-token prompts, since issue 31's refit of
vLLM's end-to-end terms; the rest within +9 %), colocated -1 .. +27 % (H100/H200 on Llama-8B within 4 %,
L40S and the VL model's 17-27 %), EPD -6 .. +24 %; median |error| over all 8 %; the screen is optimistic in
21 of 24.  The bounds below hold those figures with a little room; docs/planner.md ("Limits") quotes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simulator.plan import load_plan_request, run_plan

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(REPO.glob("examples/plan*.yaml"))
BOUND = {"pd": 0.30, "colocated": 0.35, "epd": 0.30}  # max |est/des - 1| per family


@pytest.fixture(scope="module")
def agreement() -> dict[str, list[tuple[str, str, float]]]:
    out = {}
    for path in EXAMPLES:
        df = run_plan(load_plan_request(path), workers=1).candidates
        v = df[df["verified"] & ~df["goodput_capped"] & (df["goodput_rps"] > 0)]
        out[path.name] = [
            (r["family"], r["id"], r["est_goodput_rps"] / r["goodput_rps"] - 1.0) for _, r in v.iterrows()
        ]
    for name, rows in out.items():
        print(f"\n{name}")
        for fam, cid, rel in rows:
            print(f"  {fam:10s} {cid:60s} {rel:+.3f}")
    return out


@pytest.mark.slow
def test_screen_goodput_agrees_with_the_simulation_within_the_measured_bounds(agreement):
    rows = [r for rs in agreement.values() for r in rs]
    assert len(rows) >= 15, "too few uncapped verified candidates to measure the screen"
    for fam, cid, rel in rows:
        assert abs(rel) <= BOUND[fam], f"{cid}: screen goodput {rel:+.1%} off the simulated one"
    errors = np.abs([rel for _, _, rel in rows])
    assert np.median(errors) <= 0.12
    # The screen ranks; it may be optimistic (the simulation rejects), but a pessimistic screen would
    # drop good candidates before verification: that side stays small.
    assert min(rel for _, _, rel in rows) >= -0.10
    assert {"pd", "colocated", "epd"} <= {fam for fam, _, _ in rows}
