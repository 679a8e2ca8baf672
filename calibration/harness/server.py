"""Launch a vLLM server (or attach to a running one), wait until it serves, stop it.

Launch mode runs a configurable command (``vllm serve MODEL --port 8000 ...`` on a GPU node;
``python -m calibration.harness.vllm_launcher serve ...`` with the CPU wheel) in its own process
group, copies its output line by line into a log file (each line stamped with its arrival time
in memory) and reports a dead server as :class:`ServerDied` with the exit code and the log tail.
Attach mode only talks to a URL.

:meth:`ServerProcess.startup` reads the start-up phases from the stamped lines
(:mod:`calibration.harness.startup_log`).
"""

from __future__ import annotations

import ctypes  # at the top: no import between fork and exec (_die_with_parent)
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from calibration.harness.startup_log import parse_startup_log


class ServerError(RuntimeError):
    """The server is not usable."""


class ServerDied(ServerError):
    """The launched server process exited."""

    def __init__(self, returncode: int, log_tail: str, log_path: Path | None = None, when: str = ""):
        self.returncode = returncode
        self.log_tail = log_tail
        self.log_path = log_path
        if returncode < 0:
            try:
                how = f"was killed by signal {signal.Signals(-returncode).name} (exit code {returncode})"
            except ValueError:
                how = f"exited with code {returncode}"
        else:
            how = f"exited with code {returncode}"
        where = f"; full log: {log_path}" if log_path else ""
        super().__init__(
            f"vLLM server {how}{' ' + when if when else ''}{where}\n--- last lines of its log ---\n{log_tail}"
        )


class EndpointUnreachable(ServerError):
    """An attached endpoint (or a launched one that still runs) does not answer."""


class ReadyTimeout(ServerError):
    pass


# ---------------------------------------------------------------------------- servers
def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: SIGTERM the server when the harness dies without stopping it (e.g. SIGKILL)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _get(url: str, timeout: float) -> httpx.Response:
    return httpx.get(url, timeout=timeout)


def probe_ready(base_url: str, timeout: float = 5.0) -> dict | None:
    """``/health`` answers 200 and ``/v1/models`` lists a model: return the models JSON."""
    try:
        if _get(base_url + "/health", timeout).status_code != 200:
            return None
        r = _get(base_url + "/v1/models", timeout)
        if r.status_code != 200:
            return None
        data = r.json()
        return data if data.get("data") else None
    except (httpx.HTTPError, ValueError):
        return None


@dataclass
class Endpoint:
    """A server reachable at ``base_url`` that the harness did not start (attach mode)."""

    base_url: str
    launched: bool = field(default=False, init=False)
    ready_s: float | None = field(default=None, init=False)

    def __post_init__(self):
        self.base_url = self.base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[:-3]

    def wait_ready(self, timeout: float = 60.0, poll: float = 1.0) -> dict:
        t0 = time.monotonic()
        while True:
            models = probe_ready(self.base_url)
            if models:
                self.ready_s = time.monotonic() - t0
                return models
            if time.monotonic() - t0 > timeout:
                raise EndpointUnreachable(
                    f"{self.base_url} did not answer /health and /v1/models within {timeout:.0f} s"
                )
            time.sleep(poll)

    def check(self, when: str = "") -> None:
        """Raise if the server is gone (attach mode: /health does not answer); ``when`` says what the
        harness was doing, for a launched server's message."""
        try:
            ok = _get(self.base_url + "/health", 5.0).status_code == 200
        except httpx.HTTPError as exc:
            raise EndpointUnreachable(f"{self.base_url} stopped answering: {exc}") from None
        if not ok:
            raise EndpointUnreachable(f"{self.base_url}/health no longer answers 200")

    def alive(self) -> bool:
        return True

    def stop(self, grace: float = 20.0) -> int | None:
        """Nothing to stop (the harness did not start it): no exit code."""
        return None

    def startup(self) -> dict:
        return {"events": [], "summary": {}}


class ServerProcess(Endpoint):
    """A server started by the harness as a subprocess (its own process group)."""

    def __init__(
        self,
        command: Sequence[str],
        base_url: str,
        log_path: str | Path,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        tail_lines: int = 40,
    ):
        super().__init__(base_url)
        self.launched = True
        self.command = [str(c) for c in command]
        self.log_path = Path(log_path)
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.lines: list[tuple[float, str]] = []
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._reader: threading.Thread | None = None
        self._t0 = 0.0
        self.started_at: float | None = None  # wall clock

    # -- life cycle
    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(self.env or {})
        env.setdefault("PYTHONUNBUFFERED", "1")
        self._t0 = time.monotonic()
        self.started_at = time.time()
        try:
            self.proc = subprocess.Popen(
                self.command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        except OSError as exc:
            raise ServerError(f"cannot start the server command {self.command[0]!r}: {exc}") from None
        self._reader = threading.Thread(target=self._pump, name="vllm-log", daemon=True)
        self._reader.start()
        return self

    def _pump(self) -> None:
        assert self.proc and self.proc.stdout
        with open(self.log_path, "ab", buffering=0) as log:
            for raw in iter(self.proc.stdout.readline, b""):
                t = time.monotonic() - self._t0
                log.write(raw)
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                self.lines.append((t, line))
                self._tail.append(line)

    def log_tail(self, n: int = 25) -> str:
        if self._reader is not None:
            self._reader.join(timeout=2.0)  # let the last lines of a dead process arrive
        return "\n".join(list(self._tail)[-n:])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check(self, when: str = "") -> None:
        if self.proc is None:
            raise ServerError("server not started")
        rc = self.proc.poll()
        if rc is not None:
            raise ServerDied(rc, self.log_tail(), self.log_path, when)
        try:
            super().check()
        except EndpointUnreachable as exc:
            # a process that is being killed may not be reaped yet: give it a moment to say so
            try:
                rc = self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                raise EndpointUnreachable(
                    f"{exc} (the server process {self.proc.pid} still runs; log: {self.log_path})"
                ) from None
            raise ServerDied(rc, self.log_tail(), self.log_path, when) from None

    def wait_ready(self, timeout: float = 600.0, poll: float = 1.0) -> dict:
        """Poll until ready; :class:`ServerDied` if the process exits, :class:`ReadyTimeout` after
        ``timeout`` seconds (the process is left running: call :meth:`stop`)."""
        if self.proc is None:
            self.start()
        proc = self.proc
        assert proc is not None  # start() set it or raised
        while True:
            rc = proc.poll()
            if rc is not None:
                raise ServerDied(rc, self.log_tail(), self.log_path, "before it was ready")
            models = probe_ready(self.base_url, timeout=min(5.0, poll * 5))
            if models:
                self.ready_s = time.monotonic() - self._t0
                return models
            if time.monotonic() - self._t0 > timeout:
                raise ReadyTimeout(
                    f"vLLM server not ready after {timeout:.0f} s ({self.base_url}); "
                    f"log: {self.log_path}\n--- last lines ---\n{self.log_tail()}"
                )
            time.sleep(poll)

    def stop(self, grace: float = 20.0) -> int | None:
        """SIGTERM to the process group, then SIGKILL after ``grace`` seconds; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=10)
        # children (engine core, workers) left behind by a crash of the API process
        self._signal(signal.SIGKILL, quiet=True)
        if self._reader is not None:
            self._reader.join(timeout=5)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, as an OOM kill would look)."""
        self._signal(signal.SIGKILL)

    def _signal(self, sig, quiet: bool = False) -> None:
        if self.proc is None:
            raise ServerError("server not started")
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            if not quiet and self.proc.poll() is None:
                self.proc.send_signal(sig)

    def startup(self) -> dict:
        res = parse_startup_log(list(self.lines))
        if self.ready_s is not None:
            res["summary"]["ready_s"] = round(self.ready_s, 3)
        return res

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
