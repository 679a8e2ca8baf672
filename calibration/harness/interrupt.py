"""Stopping a measurement from outside: Ctrl-C, ``kill -INT`` and ``kill -TERM`` all unwind it.

A shell that starts a job in the background without job control (a script's ``cmd &``) starts it
with SIGINT ignored, and Python then leaves SIGINT ignored too; a scheduler stops jobs with SIGTERM,
which Python does not handle at all.  While :func:`interruptible` is active both raise
``KeyboardInterrupt`` in the main thread, so the launched servers stop and the bundle's manifest
says ``interrupted`` (nothing measured is lost: records are appended as they come)."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


class StopHandler:
    """The handler :func:`interruptible` installs: it raises ``KeyboardInterrupt`` where the main thread is,
    and remembers the signal.  Python drops an exception raised inside a weakref callback or a ``__del__``
    (a stop was lost that way once, in asyncio's WeakSet, and the run went on to the end), so a loop that
    polls (the phase watchdog, calibration/harness/phase_run.py) asks :func:`stop_requested` as well."""

    def __init__(self) -> None:
        self.received: str | None = None

    def __call__(self, signum, frame):
        self.received = signal.Signals(signum).name
        raise KeyboardInterrupt(self.received)


def stop_requested() -> str | None:
    """The name of the stop signal the active :class:`StopHandler` received (None: none, or none active)."""
    handler = signal.getsignal(signal.SIGTERM)
    return handler.received if isinstance(handler, StopHandler) else None


@contextmanager
def interruptible():
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` inside the block (main thread only; elsewhere
    signals cannot be handled and the block runs as it is); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    stop = StopHandler()
    for s in previous:
        signal.signal(s, stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
