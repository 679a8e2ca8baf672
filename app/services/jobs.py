"""Long runs in a worker process: progress messages and cancellation (no Streamlit).

A :class:`Job` runs ``fn(*args, progress=callback)`` in a separate process so that the page can
keep drawing a progress bar and a Cancel button; :meth:`Job.cancel` terminates the process (a
simulation cannot be interrupted from inside).  Workers come from a forkserver that has
already imported the simulator, so a job starts in tens of milliseconds after the first.

The function and its result travel between our own processes by multiprocessing; nothing a
user uploads is ever unpickled.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import sys
import threading
import time
import traceback
import types
from dataclasses import dataclass, field

from app.services.scenarios import USER_ERRORS, InputError, run

PRELOAD = ["simulator.run", "app.services.scenarios", "app.services.compare"]
_START_LOCK = threading.Lock()  # serialises the brief swap of __main__ in Job.start


def _context():
    try:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    except ValueError:  # platforms without forkserver
        return mp.get_context("spawn")


def _worker(fn, args, kwargs, q, env: dict[str, str]) -> None:
    # A forkserver child inherits the environment the forkserver started with, not the app's at the time
    # of the job: take the app's (EPDSIM_HWDB, the bundle roots, HOME), so the job reads what the page does.
    os.environ.clear()
    os.environ.update(env)

    def progress(done: float, total: float, stage: str = "") -> None:
        q.put(("progress", float(done), float(total), str(stage)))

    try:
        q.put(("done", fn(*args, progress=progress, **kwargs)))
    except Exception as exc:  # noqa: BLE001 - sent to the page, which decides what to show
        kind = "input_error" if isinstance(exc, (InputError,)) or _is_user_error(exc) else "error"
        q.put((kind, str(exc), traceback.format_exc()))


def _is_user_error(exc: Exception) -> bool:
    return isinstance(exc, USER_ERRORS)


@dataclass
class Job:
    """One background computation.  States: running, done, failed, cancelled."""

    fn: object
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    state: str = "new"
    done: float = 0.0
    total: float = 0.0
    stage: str = ""
    result: object = None
    error: str | None = None
    user_error: bool = False
    traceback: str | None = None  # the worker's traceback of an unexpected error (for bug reports)
    started_at: float = 0.0

    def start(self) -> Job:
        ctx = _context()
        self._q = ctx.Queue()
        self._p = ctx.Process(
            target=_worker, args=(self.fn, self.args, self.kwargs, self._q, dict(os.environ)), daemon=True
        )
        self.started_at = time.monotonic()
        # A forkserver child re-imports the parent's __main__ by path; under Streamlit that is the page
        # script itself, which must not run again in the worker.  The job's function lives in a real
        # module, so the child gets an empty __main__ instead.
        with _START_LOCK:
            saved = sys.modules.get("__main__")
            sys.modules["__main__"] = types.ModuleType("__main__")
            try:
                self._p.start()
            finally:
                if saved is not None:
                    sys.modules["__main__"] = saved
        self.state = "running"
        return self

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_at

    @property
    def fraction(self) -> float | None:
        return min(1.0, self.done / self.total) if self.total > 0 else None

    def poll(self, timeout_s: float = 0.1) -> str:
        """Take the worker's messages (waiting up to ``timeout_s`` for the first); returns the state."""
        if self.state != "running":
            return self.state
        try:
            msg = self._q.get(timeout=timeout_s)
            while True:
                self._take(msg)
                if self.state != "running":
                    break
                msg = self._q.get_nowait()
        except queue.Empty:
            if not self._p.is_alive() and self.state == "running":
                self.state, self.error = "failed", f"the worker process exited with code {self._p.exitcode}"
        if self.state != "running":
            self._p.join(timeout=5)
        return self.state

    def _take(self, msg) -> None:
        if msg[0] == "progress":
            _, self.done, self.total, self.stage = msg
        elif msg[0] == "done":
            self.state, self.result = "done", msg[1]
        else:
            self.state, self.error, self.user_error = "failed", msg[1], msg[0] == "input_error"
            self.traceback = msg[2]

    def wait(self, timeout_s: float = 600.0) -> str:
        end = time.monotonic() + timeout_s
        while self.poll(0.2) == "running" and time.monotonic() < end:
            pass
        return self.state

    def cancel(self) -> None:
        """Stop the worker now (idempotent)."""
        if self.state == "running":
            self._p.terminate()
            self._p.join(timeout=5)
            self.state = "cancelled"


def run_scenarios(named: dict, progress=None, replication: int = 0, folder=None) -> dict:
    """Simulate several scenario dicts in turn, reporting progress; returns {name: Results}.
    ``folder``: the session's upload folder, where the scenarios may read files (scenarios.run)."""
    out = {}
    n = len(named)
    for i, (name, d) in enumerate(named.items()):
        if progress:
            progress(i, n, f"simulating {name}")
        out[name] = run(d, replication=replication, folder=folder)
    if progress:
        progress(n, n, "done")
    return out


def run_one(d: dict, progress=None, replication: int = 0, folder=None):
    """Simulate one scenario dict (a job function); ``folder`` as for :func:`run_scenarios`."""
    if progress:
        progress(0, 1, "simulating")
    res = run(d, replication=replication, folder=folder)
    if progress:
        progress(1, 1, "done")
    return res
