"""Resume that stays truthful: a killed harness, its manifest, its /metrics records, and validation.

* SIGTERM: the harness stops the server, scrapes /metrics for the cut segment (``partial``) and
  writes ``interrupted`` itself; SIGKILL: nothing can be written then, so the next reader finds
  the run ``running`` with its process gone and marks it ``interrupted``.  A resume after either
  completes every request, each with one ok record.
* ``--resume`` on a finished bundle says so and exits 0 without starting a server.
* ``validate`` computes per-step figures (ITL histogram, engine steps) only over the segments that
  have a /metrics record, and says so.
The harness runs as a subprocess against the fake server of tests/fixtures/calibration.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import hwdb
from calibration import cli
from calibration.fit.command import fit_bundle
from calibration.fit.report import write_outputs
from calibration.harness.bundle import Bundle
from calibration.harness.client import CompletionClient, RequestSpec, as_interrupt
from calibration.harness.interrupt import interruptible, run_stoppable, stop_requested
from calibration.harness.loadgen import run_open_loop
from calibration.harness.server import ServerProcess
from calibration.validation.command import validate
from tests.synthetic_bundle import CPU_TRUTH, TINY_CONFIG, make_bundle, write_truth_hwdb
from tests.test_calibration_harness import fake_cmd, free_port

REPO = Path(__file__).resolve().parents[1]
PHASE = "load_poisson_r20"


def _argv(out: Path, port: int, *extra: str, serve: list[str] | None = None) -> list[str]:
    cmd = serve or fake_cmd(port, "--token-delay", "0.02")
    return [
        "run",
        "--out",
        str(out),
        "--serve-cmd",
        " ".join(cmd),
        "--url",
        f"http://127.0.0.1:{port}",
        "--ready-timeout",
        "30",
        "--phases",
        "load",
        "--load-rates",
        "20",
        "--load-requests",
        "40",
        "--load-prompt",
        "8:16",
        "--load-output",
        "8:12",
        *extra,
    ]


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start(out: Path, port: int, sigint_ignored: bool = False) -> subprocess.Popen:
    """The harness as a subprocess; ``sigint_ignored``: started as a script's ``cmd &`` starts it (a
    shell without job control leaves SIGINT ignored in background jobs)."""
    return subprocess.Popen(
        [sys.executable, "-m", "calibration.cli", *_argv(out, port)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )


def _wait_for_requests(out: Path, n: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Until the load phase holds ``n`` ok request records (the condition the kill needs)."""
    f = out / "records" / f"{PHASE}.jsonl"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"the harness ended early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        if f.exists() and sum('"kind":"request"' in ln and '"ok":true' in ln for ln in f.read_text().splitlines()) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"no {n} requests in {f} within {timeout} s")


def _kill_server(out: Path) -> None:
    """The harness was SIGKILLed: its server (own process group) is left; end it by its id."""
    pid = json.loads((out / "manifest.json").read_text())["launches"][-1]["pid"]
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _resume_and_check(out: Path, port: int, capsys) -> Bundle:
    rc = cli.main(_argv(out, port, "--resume"))
    assert rc == 0, capsys.readouterr().err
    b = Bundle.open(out)
    oks = [r for r in b.records(PHASE, "request") if r.get("ok")]
    assert len(oks) == 40 and len({r["id"] for r in oks}) == 40  # every request, none measured twice
    assert b.phase_done(PHASE) and b.manifest["runs"][-1]["status"] == "completed"
    # sent_s is on the plan's clock in a resumed segment too: no request goes before its schedule
    resumed = [r for r in oks if r["segment"] >= 1]
    assert resumed and min(r["sent_s"] - r["scheduled_s"] for r in resumed) > -0.01
    return b


def test_sigkill_then_next_read_marks_interrupted_and_resume_completes(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    out, port = tmp_path / "b", free_port()
    proc = _start(out, port)
    try:
        _wait_for_requests(out, 5, proc)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        _kill_server(out)
    raw = json.loads((out / "manifest.json").read_text())
    assert raw["runs"][-1]["status"] == "running"  # what the kill left
    b = Bundle.open(out)  # the next reader settles it
    run = b.manifest["runs"][-1]
    assert run["status"] == "interrupted" and f"process {proc.pid} gone" in run["interrupted_by"]
    assert json.loads((out / "manifest.json").read_text())["runs"][-1]["status"] == "interrupted"
    assert run["conditions"]["before"]["cores"] >= 1 and "cpu" in b.manifest["hardware"]["server"]
    assert b.records(PHASE, "metrics") == []  # a SIGKILL leaves no /metrics record
    capsys.readouterr()
    assert cli.main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "last status interrupted" in shown and "1-min load before / after: run 0 " in shown
    assert "server host: " in shown and " cores" in shown  # the host the harness recorded
    b = _resume_and_check(out, port, capsys)
    metrics = b.records(PHASE, "metrics")
    assert [m["segment"] for m in metrics] == [1] and "partial" not in metrics[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT-from-a-script"])
def test_a_stop_signal_keeps_a_partial_metrics_record_and_resume_completes(tmp_path, capsys, sig):
    """SIGTERM, and SIGINT sent to a harness started with SIGINT ignored (a script's background job)."""
    out, port = tmp_path / "b", free_port()
    proc = _start(out, port, sigint_ignored=sig == signal.SIGINT)
    try:
        _wait_for_requests(out, 5, proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            _kill_server(out)
    assert proc.returncode == 130, err
    b = Bundle.open(out)
    assert b.manifest["runs"][-1]["status"] == "interrupted" and b.manifest["runs"][-1]["conditions"]["after"]
    (m0,) = b.records(PHASE, "metrics")
    assert m0["segment"] == 0 and m0["partial"] and m0["interrupted"] == "cancelled (Ctrl-C, SIGINT or SIGTERM)"
    assert m0["histograms"]["vllm:time_to_first_token_seconds"][0]["count"] >= 5
    b = _resume_and_check(out, port, capsys)
    assert [m["segment"] for m in b.records(PHASE, "metrics")] == [0, 1]


def test_a_resumed_segments_sends_are_on_the_plans_clock(tmp_path):
    """A cut open loop's remaining requests (planned from 30 s on) go at once and keep their gaps; each
    one's ``sent_s`` is on the plan's clock, as its ``scheduled_s`` is (docs/calibration.md, records), so
    their difference is the lateness, not the 30 s the segment started after the phase."""
    port = free_port()
    specs = [RequestSpec(f"r{i}", [5] * 8, 2, 30.0 + 0.1 * i) for i in range(5)]
    with ServerProcess(fake_cmd(port), f"http://127.0.0.1:{port}", tmp_path / "s.log") as srv:
        srv.wait_ready(timeout=30, poll=0.1)

        async def go():
            async with CompletionClient(srv.base_url, "fake-model") as c:
                return await run_open_loop(c, specs)

        t0 = time.monotonic()
        res = asyncio.run(go())
        wall = time.monotonic() - t0
    assert wall < 10  # the first remaining request went at once
    assert sorted(r.id for r in res) == [s.id for s in specs] and all(r.ok for r in res)
    for r in res:
        assert r.scheduled_s >= 30.0 and -1e-6 <= r.sent_s - r.scheduled_s < 0.25, (r.id, r.sent_s, r.scheduled_s)


def test_resume_of_a_finished_bundle_starts_no_server(tmp_path, capsys):
    out, port = tmp_path / "b", free_port()
    assert cli.main(_argv(out, port)) == 0
    runs = len(Bundle.open(out).manifest["runs"])
    capsys.readouterr()
    marker = tmp_path / "launched"
    # a server command that would leave a trace if it were started
    serve = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"]
    assert cli.main(_argv(out, port, "--resume", serve=serve)) == 0
    err = capsys.readouterr().err
    assert "nothing to resume (no server started)" in err
    assert not marker.exists() and not (out / "server-1.log").exists()
    assert len(Bundle.open(out).manifest["runs"]) == runs


def test_validate_per_step_figures_only_over_segments_with_metrics(tmp_path):
    tiny = tmp_path / "tiny-llama"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tiny / "epdsim.yaml").write_text(yaml.safe_dump({"name": "tiny-llama", "source": "test copy"}))
    bundle = make_bundle(tmp_path / "b", write_truth_hwdb(tmp_path / "truth", tiny, CPU_TRUTH, hwdb.load()), tiny)
    hw = tmp_path / "hw"
    write_outputs(fit_bundle(bundle), hw)
    full = validate(bundle, hw, out=tmp_path / "v-full")
    (ph_full,) = full["phases"]
    assert ph_full["per_step_scope"] == "all segments"
    # the later half of the load test becomes a resumed segment 1 that lost its /metrics record
    f = next((bundle / "records").glob("load_*.jsonl"))
    recs = [json.loads(x) for x in f.read_text().splitlines()]
    sends = sorted(r["t_send"] for r in recs if r["kind"] == "request")
    cut = sends[len(sends) // 2]
    for r in recs:
        if r["kind"] == "request" and r["t_send"] >= cut:
            r["segment"] = 1
    f.write_text("".join(json.dumps(r) + "\n" for r in recs))
    part = validate(bundle, hw, out=tmp_path / "v-part")
    (ph,) = part["phases"]
    assert ph["per_step_scope"].startswith("segment(s) 0 of 0, 1")
    itl = next(r for r in ph["rows"] if r["metric"] == "ITL" and r["stat"] == "mean")
    assert itl["note"] == "segments 0 only"
    assert 0 < ph["engine_steps"]["simulated"] < ph_full["engine_steps"]["simulated"]
    assert "per-step figures over segment(s) 0 of 0, 1" in (tmp_path / "v-part" / "report.md").read_text()


def test_an_interrupt_wrapped_in_a_task_group_is_still_an_interrupt():
    """SIGTERM lands anywhere, including inside httpx's connect task group, which wraps it in an
    exception group: the run must still be marked interrupted and exit 130, not end in a traceback."""
    kb = KeyboardInterrupt("SIGTERM")
    assert as_interrupt(BaseExceptionGroup("connect", [kb])) is kb
    assert as_interrupt(BaseExceptionGroup("outer", [ValueError("x"), BaseExceptionGroup("inner", [kb])])) is kb
    other = BaseExceptionGroup("connect", [OSError("refused")])
    assert as_interrupt(other) is other
    plain = RuntimeError("boom")
    assert as_interrupt(plain) is plain


def test_a_stop_inside_the_event_loop_cancels_its_task_instead_of_raising_there():
    """Under :func:`interruptible`, a signal that lands inside the loop's own code does not raise there (a raise
    between a future's completion and its waiter's wake-up left asyncio's shutdown waiting forever: a SIGTERMed
    harness hung in CI): :func:`run_stoppable` cancels the task, whose ``finally`` still awaits, and raises
    ``KeyboardInterrupt`` naming the signal once the loop has unwound."""
    seen: list[str] = []

    def in_the_loop():
        signal.raise_signal(signal.SIGTERM)
        seen.append("the callback went on")  # a handler that raised would not get here

    async def measured():
        asyncio.get_running_loop().call_soon(in_the_loop)
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.01)  # a cleanup that awaits (the harness scrapes /metrics here)
            seen.append("cleaned up")

    with interruptible():
        assert stop_requested() is None
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            run_stoppable(measured())
        assert time.monotonic() - t0 < 10 and seen == ["the callback went on", "cleaned up"]
        assert stop_requested() == "SIGTERM"
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):  # outside a loop it raises where it lands
            signal.raise_signal(signal.SIGTERM)
    assert stop_requested() is None  # the previous handlers are back
    assert run_stoppable(asyncio.sleep(0, "done")) == "done"  # without interruptible(): asyncio.run


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the drop is the point
def test_a_stop_whose_raise_python_dropped_before_the_loop_still_stops_it():
    """A stop handled inside a ``__del__`` (Python drops the KeyboardInterrupt there): the handler remembers
    it, and the next :func:`run_stoppable` does not start its work."""

    class Drops:
        def __del__(self):
            signal.raise_signal(signal.SIGTERM)

    started: list[bool] = []

    async def work():
        started.append(True)

    with interruptible():
        Drops()  # "Exception ignored in ... KeyboardInterrupt: SIGTERM": nothing raised here
        assert stop_requested() == "SIGTERM"
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            run_stoppable(work())
    assert started == []
