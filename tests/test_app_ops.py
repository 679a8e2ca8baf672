"""Issue 18 item 3: an operations run (autoscaling, crashes, retries) is visible in the app: instances
over time with scale events and crash markers, failed and retried requests, GPU-hours, and a cost that
counts the instances that came and went (not the initial deployment's price per hour)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import yaml
from streamlit.testing.v1 import AppTest

from app import charts, report
from app.services import opsviews, scenarios
from simulator import fmt
from tests.conftest import REPO


def _array(v) -> list:
    """A Plotly JSON array: a list, or a typed array ({"dtype", "bdata"}) as Plotly writes numpy data."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)


def expected_ops(name: str) -> dict[str, str]:
    """The operations cards of an example as the app formats them, from the services' own run of it."""
    res = scenarios.run(_example(name))
    o, c = res.summary["operations"], opsviews.ops_cost(res)
    return {
        "crashes": f"{o['crashes']:,}",
        "GPU-hours": f"{o['gpu_hours']:,.2f}",
        "scale-ups": f"{len(o['scale_ups']):,}",
        "cost per hour": fmt.usd(c["usd_per_hour"]),
        "caption": f"mean billed: {fmt.usd(c['usd'])} for {c['gpu_hours']:,.2f} GPU-hours",
    }


def _example(name: str) -> dict:
    return yaml.safe_load((REPO / "examples" / name).read_text())


@pytest.fixture(scope="module")
def autoscale():
    return scenarios.run(_example("autoscale_step_load.yaml"))


@pytest.fixture(scope="module")
def crashes():
    return scenarios.run(_example("fp8_decode_crashes_pd.yaml"))


def test_instance_counts_follow_the_scale_up_and_the_drain(autoscale):
    o = autoscale.summary["operations"]
    s = opsviews.instances_series(o)
    assert s["serving"].max() == o["peak_instances"]["main"] == 6

    def at(t, col):
        return int(s[s["t_s"] <= t][col].iloc[-1])

    # Before the scale-up decision one instance serves; the five new ones are billed from their node's
    # provisioning (30 s after the decision) but serve only after their cold start.
    up = o["scale_ups"][0]
    assert at(up["decided_s"] + 1, "serving") == 1
    assert at(up["decided_s"] + 31, "billed") == 6 and at(up["decided_s"] + 31, "serving") == 1
    assert at(up["serving_s"], "serving") == 6
    assert at(o["end_s"], "serving") == 1  # scaled back down after the load step
    ev = opsviews.events_frame(o)
    assert list(ev["event"]) == ["scale-up", "scale-down"]


def test_cost_counts_the_billed_gpu_hours_not_the_initial_deployment(autoscale):
    o = autoscale.summary["operations"]
    c = scenarios.cost(autoscale)
    assert c["with_scaling"] and c["usd"] == pytest.approx(o["cost_usd"], rel=1e-9)
    assert c["gpu_hours"] == pytest.approx(o["gpu_hours"], rel=1e-9)
    # 1 instance at $4.25/h is what the deployment alone says; scaling to 6 for minutes costs more
    assert autoscale.summary["cost_usd_per_hour"] == pytest.approx(4.25)
    assert c["usd_per_hour"] == pytest.approx(o["cost_usd"] / (o["end_s"] / 3600.0))
    assert c["usd_per_hour"] > 2 * autoscale.summary["cost_usd_per_hour"]
    cs = opsviews.cost_series(o, opsviews.pool_prices(autoscale))
    assert cs["cost_usd"].iloc[-1] == pytest.approx(o["cost_usd"], rel=1e-9)
    assert cs["cost_usd"].is_monotonic_increasing and cs["gpus"].max() == 6
    # a price override applies to the billed hours
    half = scenarios.cost(autoscale, scenarios.Prices((("H100-SXM-80GB", 4.25 / 2),)))
    assert half["usd"] == pytest.approx(o["cost_usd"] / 2, rel=1e-9)


def test_crash_markers_and_retried_requests(crashes):
    o = crashes.summary["operations"]
    assert o["crashes"] >= 1 and o["retried_requests"] >= 1
    ev = opsviews.events_frame(o)
    assert (ev["event"] == "crash").sum() == o["crashes"]
    fails = opsviews.failures_series(crashes.requests)
    assert fails["retried"].sum() == o["retried_requests"] and fails["failed"].sum() == o["failed"]
    s = opsviews.instances_series(o)
    dec = s[s["pool"] == "decode"]
    t_crash = o["crash_log"][0]["time_s"]
    assert int(dec[dec["t_s"] <= t_crash]["serving"].iloc[-1]) == 2  # one of three decode instances down
    assert int(dec[dec["t_s"] <= t_crash]["billed"].iloc[-1]) == 3  # its restart is billed from the crash
    figs = charts.results_figures("crash", crashes, 2.0, 0.05, which=charts.GROUPS["Operations"])
    assert set(figs) == {"instances", "failures", "cost"}
    crash_traces = [t for t in figs["instances"].data if t.name == "crash"]
    assert crash_traces and list(crash_traces[0].x) == pytest.approx([c["time_s"] for c in o["crash_log"]])
    retried = next(t for t in figs["failures"].data if t.name == "retried")
    assert sum(retried.y) == o["retried_requests"]


def test_runs_without_operations_offer_no_operations_view():
    res = scenarios.run(
        {**scenarios.default_scenario(), "workload": {**scenarios.default_scenario()["workload"], "num_requests": 200}}
    )
    assert "Operations" not in charts.groups(res)
    assert "with_scaling" not in scenarios.cost(res)
    assert not set(charts.results_figures("x", res, 0.5, 0.05)) & set(charts.GROUPS["Operations"])


def test_report_of_an_operations_run_has_its_timelines_and_figures(crashes):
    html = report.results_html(crashes, plotly="cdn")
    for text in (
        "Instances over time",
        "Failed and retried requests",
        "Cost with scaling",
        "GPU-hours",
        "retried requests (re-sends)",
        "mean billed",
    ):
        assert text in html, text


def test_home_shows_operations_cards_and_timelines():
    at = AppTest.from_file(str(REPO / "app" / "Home.py"), default_timeout=240)
    at.session_state["scenario"] = _example("autoscale_step_load.yaml")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    m = {x.label: x.value for x in at.metric}
    # The cards show what the simulation itself bills: its GPU-hours at the pool's price, averaged over the
    # run (about $16.6/h for $3.7 over 800 s), not the single instance's $4.25/h.
    want = expected_ops("autoscale_step_load.yaml")
    assert m["scale-ups"] == want["scale-ups"] and m["GPU-hours"] == want["GPU-hours"] and m["availability"] == "100.0%"
    assert m["cost per hour"] == want["cost per hour"] and 14.0 < float(want["cost per hour"][1:]) < 19.0
    assert any(c.value.startswith(want["caption"]) for c in at.caption)
    assert "Operations" in at.radio(key="view").options
    at.radio(key="view").set_value("Operations").run()
    assert not at.exception, [e.value for e in at.exception]
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    titles = [s["layout"]["title"]["text"] for s in specs]
    assert sorted(titles) == [
        "Cost with scaling",
        "Failed and retried requests (by arrival time)",
        "Instances over time",
    ]
    inst = specs[titles.index("Instances over time")]
    serving = next(t for t in inst["data"] if t["name"] == "main serving")
    assert max(_array(serving["y"])) == 6
    events = at.dataframe[-1].value
    assert list(events["event"]) == ["scale-up", "scale-down"]
    # back to a scenario without operations: the view falls back instead of failing
    at.session_state["scenario"] = scenarios.default_scenario()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert "Operations" not in at.radio(key="view").options and "scale-ups" not in {x.label for x in at.metric}


def test_operations_page_opens_an_operations_run_on_home():
    at = AppTest.from_file(str(REPO / "app" / "Home.py"), default_timeout=240).run()
    at.switch_page("pages/3_Operations.py").run()
    assert not at.exception, [e.value for e in at.exception]
    at.button(key="ops-open-fp8_decode_crashes_pd.yaml").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.radio(key="view").value == "Operations"
    m = {x.label: x.value for x in at.metric}
    assert m["crashes"] == expected_ops("fp8_decode_crashes_pd.yaml")["crashes"] and int(m["crashes"]) >= 1
    assert int(m["retried requests"]) >= 1
    assert {json.loads(c.proto.spec)["layout"]["title"]["text"] for c in at.get("plotly_chart")} >= {
        "Instances over time",
        "Cost with scaling",
    }
