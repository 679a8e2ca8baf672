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


def _raise(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def interruptible():
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` inside the block (main thread only; elsewhere
    signals cannot be handled and the block runs as it is); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in previous:
        signal.signal(s, _raise)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
