"""Issue 32: the CLI and the app give the same cost for the same scenario, each cost named.

For an autoscaling example both the static cost (the configured GPUs at their price) and the mean billed
cost (the GPU-hours billed as instances came and went) apply: `epdsim simulate`'s totals table and the
app's Home cards show both, from one function (app/services/costs.py: named_costs).
"""

from __future__ import annotations

import pytest
import yaml
from rich.console import Console
from streamlit.testing.v1 import AppTest

from app.services import costs, scenarios
from simulator import fmt
from simulator.cli.simulate import totals_table
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "autoscale_step_load.yaml"


@pytest.fixture(scope="module")
def run():
    return scenarios.run(yaml.safe_load(EXAMPLE.read_text()))


def test_named_costs_of_an_autoscaling_run(run):
    s, o = run.summary, run.summary["operations"]
    named = costs.named_costs(s)
    assert list(named) == [costs.STATIC, costs.BILLED] and costs.headline(named) == costs.BILLED
    assert named[costs.STATIC]["usd_per_hour"] == pytest.approx(4.25)  # one H100 as configured
    assert named[costs.STATIC]["usd_per_million_output_tokens"] == pytest.approx(
        s["cost_usd_per_million_output_tokens"]
    )
    billed = named[costs.BILLED]
    assert billed["usd"] == pytest.approx(o["cost_usd"]) and billed["gpu_hours"] == pytest.approx(o["gpu_hours"])
    assert billed["usd_per_hour"] == pytest.approx(o["cost_usd"] / (o["end_s"] / 3600.0))
    assert billed["usd_per_hour"] > 2 * named[costs.STATIC]["usd_per_hour"]  # scaled out to 6 for minutes
    # the app's cost is that function's, headline and both names
    app = scenarios.cost(run)
    assert app["named"] == named and app["usd_per_hour"] == billed["usd_per_hour"]


def test_cli_and_app_show_the_same_named_costs(run):
    named = scenarios.cost(run)["named"]
    console = Console(width=400, record=True, color_system=None)
    console.print(totals_table(run))
    cli = console.export_text()
    for name, c in named.items():
        assert (
            f"${c['usd_per_hour']:,.2f}/h, ${c['usd_per_million_output_tokens']:,.3f} per M output tokens "
            f"({name}:" in cli
        ), cli
    at = AppTest.from_file(str(REPO / "app" / "Home.py"), default_timeout=240)
    at.session_state["scenario"] = yaml.safe_load(EXAMPLE.read_text())
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    m = {x.label: x.value for x in at.metric}
    billed, static = named[costs.BILLED], named[costs.STATIC]
    assert m["cost per hour"] == fmt.usd(billed["usd_per_hour"])
    assert m["$ per M output tokens"] == fmt.usd(billed["usd_per_million_output_tokens"], 3)
    captions = [c.value for c in at.caption]
    assert f"static: {fmt.usd(static['usd_per_hour'])}/h ({costs.MEANING[costs.STATIC]})" in captions, captions
    assert f"static: {fmt.usd(static['usd_per_million_output_tokens'], 3)}" in captions


def test_a_run_without_operations_has_the_static_cost_only():
    d = scenarios.default_scenario()
    d["workload"]["num_requests"] = 200
    res = scenarios.run(d)
    named = scenarios.cost(res)["named"]
    assert list(named) == [costs.STATIC] and named[costs.STATIC]["usd_per_hour"] == pytest.approx(8.5)
    assert costs.cost_text(named).startswith("$8.50/h, ") and "(static: configured GPUs" in costs.cost_text(named)
