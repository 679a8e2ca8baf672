"""``epdsim app`` stopped by a signal sent to epdsim alone (issue 32: ``kill PID`` left Streamlit running and
holding the port): the signal is passed on to the Streamlit server, epdsim waits for it, and the port is free;
``kill -INT`` too when epdsim was started with SIGINT ignored, as a shell script's background job is."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.browser import free_port, wait_health
from tests.conftest import REPO


def port_free(port: int) -> bool:
    """Nothing listens on ``port`` and a new server can take it (SO_REUSEADDR, as Streamlit's own socket: the
    health checks' connections may linger in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["TERM", "INT", "HUP"])
def test_a_stop_signal_to_epdsim_stops_the_streamlit_server(tmp_path, sig):
    port = free_port()
    env = {**os.environ, "HOME": str(tmp_path)}
    # a session of its own, as a script's background job: the signal reaches epdsim only, never the server;
    # and SIGINT ignored, as a non-interactive shell starts a background job (Python keeps it ignored)
    proc = subprocess.Popen(
        [sys.executable, "-m", "simulator.cli", "app", "--port", str(port), "--address", "127.0.0.1", "--headless"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        wait_health(f"http://127.0.0.1:{port}/_stcore/health", proc)
        assert not port_free(port)
        os.kill(proc.pid, sig)
        rc = proc.wait(timeout=60)
        assert rc == 0
        end = time.monotonic() + 30  # a bound: the server has exited with epdsim, so this is immediate
        while not port_free(port) and time.monotonic() < end:
            time.sleep(0.2)
        assert port_free(port), "the Streamlit server still holds the port after epdsim stopped"
        assert subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True).returncode == 1, (
            "a process of epdsim's session is still running"
        )
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever epdsim's session left: not into the next test
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
