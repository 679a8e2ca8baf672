"""The app's services without Streamlit: jobs (progress, cancel, errors), scenario hashing and caching,
uploads parsed safely, phase breakdowns that add up, costs, layouts, compare, saturation, exports and the
`epdsim app` command.  Charts and HTML reports: tests/test_app_reports.py."""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pandas as pd
import pytest
import yaml

from app import cli
from app.services import builder, compare, exports, jobs, scenarios, views
from simulator.saturation import saturation
from simulator.scenario import parse_scenario
from tests.app_runs import res_fixture, small  # noqa: F401 - res_fixture: the pytest fixture res, used by name
from tests.conftest import REPO


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
