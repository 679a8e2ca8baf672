"""The app's services, charts and reports without Streamlit: jobs (progress, cancel, errors), scenario
hashing and caching, uploads parsed safely, phase breakdowns that add up, costs, HTML reports and the CLI."""

from __future__ import annotations

import argparse
import copy
import html as htmllib
import io
import json
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pandas as pd
import plotly.io as pio
import pytest
import yaml

from app import charts, cli, report, tool_charts
from app.services import builder, compare, exports, jobs, scenarios, views
from simulator.plan import run_plan
from simulator.plan.bands import verdict
from simulator.plan.request import parse_plan_request
from simulator.saturation import saturation
from simulator.scenario import parse_scenario
from tests.conftest import REPO
from tests.test_plan import request


def small(n: int = 300, rate: float = 20.0) -> dict:
    d = scenarios.default_scenario()
    return builder.set_workload(d, rate=rate, num_requests=n)


@pytest.fixture(scope="module")
def res():
    return scenarios.run(small())


def forever(progress=None):
    """A job that never ends on its own (stands for a long simulation)."""
    progress(0, 1, "started")
    while True:
        sum(range(10_000))


def test_job_cancel_terminates_the_worker():
    job = jobs.Job(forever).start()
    while job.stage != "started":  # the worker is running the function
        assert job.poll(1.0) == "running"
    job.cancel()
    assert job.state == "cancelled" and not job._p.is_alive()


def user_folder(progress=None):
    """The user hardware folder a job sees (stands for a run reading EPDSIM_HWDB)."""
    return str(scenarios.user_hwdb_dir())


def test_a_job_sees_the_apps_environment_of_its_start_not_the_forkservers(tmp_path, monkeypatch):
    # The forkserver keeps the environment it started with; a job must read the one the page reads now.
    assert jobs.Job(user_folder).start().wait(120) == "done"  # the forkserver is up
    monkeypatch.setenv("EPDSIM_HWDB", str(tmp_path / "later"))
    job = jobs.Job(user_folder).start()
    assert job.wait(120) == "done" and job.result == str(tmp_path / "later")


def test_job_reports_progress_and_result():
    job = jobs.Job(jobs.run_scenarios, ({"a": small(200), "b": small(200, rate=30.0)},)).start()
    assert job.wait(300) == "done"
    assert (job.done, job.total) == (2, 2)
    assert set(job.result) == {"a", "b"}
    assert job.result["b"].summary["throughput_rps"] > job.result["a"].summary["throughput_rps"]


def test_job_user_error_is_a_message_not_a_traceback():
    d = small()
    d["pools"][0]["tp"] = 3
    job = jobs.Job(jobs.run_one, (d,)).start()
    assert job.wait(120) == "failed" and job.user_error
    assert "tp=3" in job.error and "KV heads" in job.error


def test_scenario_hash_and_cache(tmp_path):
    d = small()
    h = scenarios.scenario_hash(scenarios.to_scenario(d))
    assert h == scenarios.scenario_hash(scenarios.to_scenario(copy.deepcopy(d)))
    assert h != scenarios.scenario_hash(scenarios.to_scenario(builder.set_workload(d, rate=21.0)))
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,20,5\n")
    t = {**d, "workload": scenarios.trace_workload(trace, None, None)}
    h1 = scenarios.scenario_hash(scenarios.to_scenario(t))
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,10,5\n1,20,5\n2,30,5\n")
    assert scenarios.scenario_hash(scenarios.to_scenario(t)) != h1  # same path, new content
    cache = scenarios.RunCache(size=2)
    r1 = scenarios.run(d, cache)
    assert scenarios.run(d, cache) is r1
    for rate in (21.0, 22.0):
        scenarios.run(builder.set_workload(d, rate=rate), cache)
    assert len(cache) == 2 and scenarios.run(d, cache) is not r1  # least recently used dropped


@pytest.mark.parametrize(
    "data, expect",
    [
        (b"model: [unclosed", "not valid YAML at line 1"),
        (pickle.dumps({"model": "x"}), "binary file"),
        (b"!!python/object/apply:os.system ['true']", "not valid YAML"),
        (b"- a\n- b\n", "expected a mapping"),
        (
            b"model: Llama-3.1-8B\npools: [{gpu: H100, tp: 0}]\nworkload: {arrival: {kind: poisson, rate: 1}, "
            b"num_requests: 5, input_length: {kind: fixed, value: 5}, output_length: {kind: fixed, value: 5}}\n",
            "pools[0].tp",
        ),
    ],
)
def test_bad_scenario_uploads(data, expect):
    with pytest.raises(scenarios.InputError) as e:
        scenarios.parse_yaml_upload("up.yaml", data)
    assert expect in str(e.value)


def test_upload_size_limit_and_file_names(tmp_path):
    with pytest.raises(scenarios.InputError, match="upload limit"):
        scenarios.parse_yaml_upload("big.yaml", b"#" * (scenarios.MAX_UPLOAD_BYTES + 1))
    p = scenarios.save_upload("traces", "../../etc/evil.csv", b"x", folder=tmp_path)
    assert p.name == "evil.csv" and tmp_path in p.parents
    with pytest.raises(scenarios.InputError, match="not valid JSON"):
        scenarios.model_from_config_upload("config.json", b"{not json")


def test_phases_add_up_to_e2e_and_new_phases_appear(res):
    ph = views.phase_frame(res.requests)
    assert list(ph["phase"]) == ["frontend", "queue", "prefill", "decode"]  # colocated: no transfer phases
    done = res.requests[res.requests["outcome"] == "completed"]
    assert ph["mean_s"].sum() == pytest.approx(done["e2e_s"].mean(), rel=1e-9)
    req = res.requests.assign(encode_s=0.001, encoded_at_s=res.requests["arrival_s"] + 5.0)
    assert "encode" in list(views.phase_frame(req)["phase"])  # an EPD-style phase column
    assert "encoded_at" not in list(views.phase_frame(req)["phase"])  # a timestamp, not a phase


def test_weighted_ecdf_closed_form():
    e = views.ecdf(np.array([2.0, 1.0, np.nan]), np.array([3.0, 1.0, 1.0]))
    assert list(e["value"]) == [1.0, 2.0] and list(e["fraction"]) == [0.25, 1.0]


def test_cost_overrides(res):
    c = scenarios.cost(res)
    assert c["usd_per_hour"] == pytest.approx(res.summary["cost_usd_per_hour"])
    assert c["usd_per_million_output_tokens"] == pytest.approx(res.summary["cost_usd_per_million_output_tokens"])
    half = scenarios.cost(res, scenarios.Prices((("H100-SXM-80GB", 4.25 / 2),)))
    assert half["usd_per_hour"] == pytest.approx(c["usd_per_hour"] / 2)


def test_layout_switch_keeps_gpus():
    d = builder.set_pool(small(), 0, instances=5)
    pd_ = builder.with_layout(d, "pd")
    assert [(p["role"], p["instances"]) for p in pd_["pools"]] == [("prefill", 2), ("decode", 3)]
    back = builder.with_layout(pd_, "colocated")
    assert back["pools"][0]["instances"] == 5 and "kv_transfer" not in back
    assert compare.variants(d, "RDMA vs TCP (PD)")["TCP (10 GbE, host-staged)"]["kv_transfer"]["fabric"] == "tcp-10gbe"


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


def test_epdsim_app_serves_without_a_terminal_or_headless_flag(tmp_path):
    """The README's main command ends with a plain ``epdsim app``: on a fresh machine Streamlit's first-run
    email prompt would wait on stdin before the server listens. With stdin closed it must still serve."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}  # a home without ~/.streamlit credentials
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", "app", "--port", str(port), "--address", "127.0.0.1"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        end, answer = time.monotonic() + 60, None
        while time.monotonic() < end and proc.poll() is None and answer is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                    answer = r.read().decode().strip()
            except OSError:
                time.sleep(0.5)
        assert answer == "ok", f"no health answer; exit {proc.poll()}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # epdsim and the streamlit server it started
        out = proc.communicate(timeout=30)[0]
    assert "Email:" not in out, out[-2000:]


def test_epdsim_app_hides_streamlits_deploy_button(monkeypatch):
    """The toolbar's Deploy button opens a Streamlit Cloud dialog that means nothing to a planner's user."""
    calls = []

    class Finished:
        """A server that has already exited 0: records the command it was started with."""

        returncode = 0

        def __init__(self, cmd, env=None):
            calls.append(cmd)

        def poll(self):
            return 0

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(cli.subprocess, "Popen", Finished)
    assert cli.cmd_app(argparse.Namespace(port=8599, address="127.0.0.1", headless=True)) == 0
    cmd = calls[0]
    assert cmd[cmd.index("--client.toolbarMode") + 1] == "viewer"


def test_compare_rows_read_in_units_and_float_noise_does_not_win():
    """Issue 18 item 7: Compare's table in the one formatter's units; "best" needs a real difference."""
    assert compare.row_formatter("TTFT p50 (s)")(0.0123) == "12.3 ms"
    assert compare.row_formatter("E2E p50 (s)")(144.492) == "144 s"
    assert compare.row_formatter("SLO attainment")(0.9872) == "98.7%"
    assert compare.row_formatter("cost $/h")(8.5) == "$8.50"

    class R:
        def __init__(self, s):
            self.summary = s

    base = scenarios.run(small(100))
    a, b = R(dict(base.summary)), R(dict(base.summary))
    b.summary["throughput_rps"] = a.summary["throughput_rps"] * (1 + 1e-9)  # float noise
    b.summary["slo_attainment"] = 0.5
    for r in (a, b):
        r.scenario, r.info, r.requests, r.steps = base.scenario, base.info, base.requests, base.steps
    df = compare.metrics_frame({"a": a, "b": b})
    assert df.loc["throughput (req/s)", "best"] == ""  # a tie, not a win for b
    assert df.loc["SLO attainment", "best"] == "a"
    assert isinstance(df, pd.DataFrame)


def test_saturation_names_the_bottleneck_pool_only_when_overloaded(res):
    assert saturation(res) is None  # 20 req/s on 2x H100: keeps up
    over = scenarios.run(small(600, rate=400.0))
    sat = saturation(over)
    assert sat is not None and sat["pool"].startswith("main (2x H100-SXM-80GB TP1")
    assert sat["phase"] == "queue" and "Bottleneck: main" in sat["message"] and "SLO attainment" in sat["message"]
    pd_over = scenarios.run(
        builder.set_workload(builder.with_layout(scenarios.default_scenario(), "pd"), rate=400.0, num_requests=600)
    )
    sat = saturation(pd_over)
    assert sat is not None and ("prefill" in sat["pool"] or "decode" in sat["pool"]), sat


def test_exports_hold_every_request_and_reload():
    """Issue 18 item 8: the downloads are the whole run, not the 1,000 rows the page shows."""
    big = scenarios.run(small(1500))
    assert len(pd.read_csv(io.BytesIO(exports.requests_csv(big)))) == 1500
    assert len(pd.read_parquet(io.BytesIO(exports.requests_parquet(big)))) == 1500
    data = json.loads(exports.summary_json(big))
    assert data["summary"]["requests"] == 1500 and data["serving"]["successful_requests"] == big.summary["completed"]
    assert data["serving"]["slo_ttft_s"] == big.scenario.slo.ttft_s
    assert parse_scenario(data["scenario"]) == big.scenario
    assert parse_scenario(yaml.safe_load(exports.scenario_yaml(big))) == big.scenario
    metrics = compare.metrics_frame({"a": big, "b": big})
    table = pd.read_csv(io.BytesIO(exports.comparison_csv(metrics)), index_col="metric")
    assert list(table.index) == list(metrics.index) and {"a", "b", "best"} <= set(table.columns)


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
