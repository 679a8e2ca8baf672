"""The app's charts and HTML reports without Streamlit: one trace per pool and SLO lines, self-contained
reports in the app's palette that embed their scenario (or plan request), Plotly from the CDN on request,
downsampled link charts, log axes and legends, and `epdsim simulate --report`."""

from __future__ import annotations

import html as htmllib
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import plotly.io as pio
import pytest
import yaml

from app import charts, report, tool_charts
from app.services import builder, compare, scenarios, views
from simulator.plan import run_plan
from simulator.plan.bands import verdict
from simulator.plan.request import parse_plan_request
from simulator.scenario import parse_scenario
from tests.app_runs import res_fixture, small  # noqa: F401 - res_fixture: the pytest fixture res, used by name
from tests.conftest import REPO
from tests.test_plan import request


def test_charts_have_one_trace_per_pool_and_slo_lines(res):
    figs = charts.results_figures("x", res, 0.5, 0.05)
    assert figs["cdf_ttft"].layout.shapes[0].x0 == pytest.approx(500.0)  # SLO line in ms
    assert len(figs["batch"].data) == 1 and figs["batch"].data[0].name == "main"
    y = np.asarray(figs["cdf_e2e"].data[0].y)
    assert np.all(np.diff(y) >= 0) and y[-1] == pytest.approx(1.0)


def test_html_report_is_self_contained(res):
    html = report.results_html(res)
    assert html.count('class="plotly-graph-div"') == 11
    assert "<script src=" not in html and "<link " not in html  # nothing loaded from elsewhere
    assert html.count("<script") >= 12 and len(html) > 3_000_000  # plotly.js inlined once, then 11 figures
    assert res.scenario.name in html and "SLO attainment" in html


def _figure_scripts(html: str) -> list[str]:
    """The figures' own JSON in a report (after Plotly's inlined JavaScript, which has colours of its own)."""
    return [part.split("</script>")[0] for part in html.split('class="plotly-graph-div"')[1:]]


def test_reports_draw_in_the_app_palette_under_streamlit(res, monkeypatch):
    """In the app's process Streamlit makes its template Plotly's default; its colours are placeholders
    (#000001, #000002, ...) that only its frontend replaces, so a downloaded report drew every series black."""
    monkeypatch.setattr(pio.templates, "default", pio.templates.default)  # restored after the test
    # importing it makes the "streamlit" template Plotly's default: only here, after the monkeypatch saved the old one
    import streamlit.elements.plotly_chart  # noqa: F401, PLC0415 - imported for that effect, at this point

    pio.templates.default = "streamlit"
    other = scenarios.run(small(rate=30.0))
    results = {"a": res, "b": other}
    for html in (report.results_html(res), report.comparison_html(results, compare.metrics_frame(results))):
        figs = _figure_scripts(html)
        assert figs and not [m for f in figs for m in re.findall(r"#0000(?!00)[0-9]{2}\b", f)]
        assert figs and all(f'"colorway":["{charts.PALETTE[0]}","{charts.PALETTE[1]}"' in f for f in figs)


def test_cli_simulate_report_and_report_errors(tmp_path):
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump(small(200)))
    out = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "simulate", str(scn), "--report", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert "plotly-graph-div" in (tmp_path / "r.html").read_text()
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulator.cli",
            "report",
            "validation",
            str(tmp_path),
            "--out",
            str(tmp_path / "v.html"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 2 and "validation.json" in bad.stderr and "Traceback" not in bad.stderr


def test_reports_embed_the_scenario_yaml_and_can_load_plotly_from_the_cdn(res, tmp_path):
    page = report.results_html(res)
    text = re.search(r"<pre id='scenario-yaml'>(.*?)</pre>", page, re.S).group(1)
    assert parse_scenario(yaml.safe_load(htmllib.unescape(text))) == res.scenario
    cmp = report.comparison_html({"a": res, "b": res}, compare.metrics_frame({"a": res, "b": res}))
    assert "scenario-yaml-0" in cmp and "scenario-yaml-1" in cmp
    small_page = report.results_html(res, plotly="cdn")
    assert len(small_page) < len(page) / 4 and 'src="https://cdn.plot.ly/' in small_page
    assert small_page.count('class="plotly-graph-div"') == page.count('class="plotly-graph-div"')
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump(small(100)))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulator.cli",
            "simulate",
            str(scn),
            "--report",
            str(tmp_path / "r.html"),
            "--report-plotly",
            "cdn",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "r.html").stat().st_size < 1_000_000 and "cdn.plot.ly" in (tmp_path / "r.html").read_text()


def test_plan_report_states_target_slo_workload_and_embeds_the_request():
    req = parse_plan_request(
        request(
            search={
                "verify": 1,
                "borderline": 0,
                "verify_front": 0,
                "replications": 1,
                "requests": 200,
                "goodput_iterations": 1,
            }
        )
    )
    result = run_plan(req, workers=1)
    page = report.plan_html(result, plotly="cdn")
    assert "Target 10 req/s" in page and "TTFT &lt;= 1.00 s, TPOT &lt;= 50.0 ms" in page and "poisson" in page
    said = verdict(result)  # the recommendation's band and whether the SLO holds at its edge
    assert "band" in said and htmllib.escape(said) in page
    text = re.search(r"<pre id='plan-yaml'>(.*?)</pre>", page, re.S).group(1)
    assert parse_plan_request(yaml.safe_load(htmllib.unescape(text))) == req


def test_link_chart_is_downsampled_and_keeps_the_busy_time():
    """Issue 18 item 6: thousands of busy/idle change points become a few hundred bins; the area (busy
    link-seconds) is the same."""
    pd_res = scenarios.run(builder.with_layout(small(1500), "pd"))
    links = pd_res.links
    assert len(links) > 1000
    fig = charts.link_figure(links)
    assert fig.data and all(len(tr.x) <= 200 for tr in fig.data)
    series = views.link_series(links, bins=200)
    for name, g in links.sort_values("time_s").groupby("link"):
        t = np.append(g["time_s"].to_numpy(), links["time_s"].max())
        exact = float((g["utilisation"].to_numpy() * np.diff(t)).sum())
        s_ = series[series["link"] == name]
        width = (links["time_s"].max() - links["time_s"].min()) / 200
        assert float(s_["utilisation"].sum() * width) == pytest.approx(exact, rel=1e-6)
        assert ((s_["utilisation"] >= 0) & (s_["utilisation"] <= 1 + 1e-9)).all()
    ts = views.throughput_series(pd_res.requests)
    width = ts["t_s"].diff().median()
    assert float(ts["requests_per_s"].sum() * width) == pytest.approx(pd_res.summary["completed"], rel=1e-6)


def test_log_axes_pareto_titles_target_line_and_legends(res):
    figs = charts.results_figures("r", res, 0.5, 0.05, log=True)
    assert figs["cdf_ttft"].layout.xaxis.type == "log" and figs["queue"].layout.yaxis.type == "log"
    assert charts.results_figures("r", res, 0.5, 0.05, which=("cdf_ttft",))["cdf_ttft"].layout.xaxis.type != "log"
    m = compare.metrics_frame({"a": res, "b": res})
    assert charts.compare_figure(m, ["TTFT p50 (s)"], log_y=True).layout.yaxis.type == "log"
    cand = pd.DataFrame(
        {"cost_usd_per_hour": [4.0, 8.0, 12.0], "goodput_rps": [5.0, 11.0, 18.0], "layout": ["a", "b", "c"]}
    )
    fig = tool_charts.pareto_figure(
        cand,
        cand,
        "cost_usd_per_hour",
        "goodput_rps",
        {"cost_usd_per_hour": 8.0, "goodput_rps": 11.0},
        label="layout",
        target_rate=10.0,
    )
    assert fig.layout.xaxis.title.text == "cost ($/h)" and fig.layout.yaxis.title.text.startswith("goodput (req/s")
    assert [sh.y0 for sh in fig.layout.shapes] == [10.0] and fig.layout.showlegend
    phases = pd.DataFrame({"case": ["cold"] * 2, "label": ["pull", "load"], "seconds": [10.0, 20.0]})
    cs = tool_charts.coldstart_figure(phases)
    assert cs.layout.legend.y >= 1 and cs.layout.showlegend  # above the plot, clear of the axis title
    att = pd.DataFrame({"attempt": [1], "start_s": [0.0], "end_s": [30.0], "outcome": ["serving"]})
    assert tool_charts.attempts_figure(att, 60).layout.showlegend  # one outcome still says what its colour is


def test_reports_say_how_sure_each_pool_is(res):
    """The HTML report carries each pool's calibration status and error band (docs/validation/e2e.md)."""
    html_text = report.results_html(res)
    assert "confidence (" in html_text and "kernel-fitted" in html_text
