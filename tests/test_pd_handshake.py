"""A PD pair that cannot shake hands is reported, not waited on; the ports the harness gives its servers stay
out of the kernel's ephemeral range, where an outgoing connection could take one before its server binds it
(CI: a NIXL side channel failed with "Address already in use" and the run hung until the test's timeout)."""

from __future__ import annotations

import asyncio
import socket
import sys
import time

import pytest

from calibration.harness.launch_env import ephemeral_range, free_port
from calibration.harness.server import ServerError, ServerProcess
from calibration.pd import run as pd_run
from calibration.pd.launch import HandshakeTimeout, log_errors


def test_ephemeral_range_is_read_from_the_kernel_file(tmp_path):
    f = tmp_path / "range"
    f.write_text("20000\t30000\n")
    assert ephemeral_range(str(f)) == (20000, 30000)
    assert ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)  # Linux's default
    f.write_text("not numbers")
    assert ephemeral_range(str(f)) == (32768, 60999)


def test_ports_are_below_the_ephemeral_range_distinct_and_free():
    lo, _ = ephemeral_range()
    given: set[int] = set()
    for _ in range(12):
        port = free_port(exclude=given)
        assert port not in given and 1024 <= port < lo
        given.add(port)
        with socket.socket() as s:  # nothing listens there: a server can bind it
            s.bind(("127.0.0.1", port))


def test_a_handshake_that_never_completes_is_an_error_naming_it(monkeypatch, tmp_path):
    """The first request through the router waits on the decode server's NIXL handshake; a prefill server whose
    side channel never listens leaves it waiting for good: the run stops at HANDSHAKE_TIMEOUT_S instead."""

    async def warm_up(base_url, seed=0):
        if seed == 1:  # the request through the router: the handshake that never answers
            await asyncio.Event().wait()

    monkeypatch.setattr(pd_run, "warm_up", warm_up)
    monkeypatch.setattr(pd_run, "HANDSHAKE_TIMEOUT_S", 0.3)
    t0 = time.monotonic()
    with pytest.raises(HandshakeTimeout, match="did not finish within 0.3 s: the decode server's NIXL handshake"):
        asyncio.run(pd_run.drive("http://127.0.0.1:9", "http://127.0.0.1:9", {}, tmp_path, nixl=True))
    assert time.monotonic() - t0 < 10
    assert issubclass(HandshakeTimeout, ServerError)  # calibrate exits 3, "server error: ..."


def test_log_errors_quotes_each_servers_last_error_lines(tmp_path):
    script = (
        "import sys; print('INFO starting'); "
        "print('Exception in thread nixl_handshake_listener:'); "
        "print(\"zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:34495')\")"
    )
    prefill = ServerProcess([sys.executable, "-c", script], "http://127.0.0.1:9", tmp_path / "prefill.log").start()
    decode = ServerProcess([sys.executable, "-c", "print('INFO up')"], "http://127.0.0.1:9", tmp_path / "decode.log")
    decode.start()
    for srv in (prefill, decode):
        srv.proc.wait(timeout=30)
        srv.log_tail()  # the log reader has written every line
    text = log_errors([prefill, decode])
    assert "prefill log" in text and "Address already in use" in text and "nixl_handshake_listener" in text
    assert f"decode log {tmp_path / 'decode.log'}: no error line" in text
