"""Stopping a measurement from outside: Ctrl-C, ``kill -INT`` and ``kill -TERM`` all unwind it.

A shell that starts a job in the background without job control (a script's ``cmd &``) starts it
with SIGINT ignored, and Python then leaves SIGINT ignored too; a scheduler stops jobs with SIGTERM,
which Python does not handle at all.  While :func:`interruptible` is active both stop the run: in plain
code they raise ``KeyboardInterrupt`` in the main thread; while :func:`run_stoppable` runs an event
loop they cancel its main task instead, and ``KeyboardInterrupt`` is raised once the loop has unwound.
Either way the launched servers stop and the bundle's manifest says ``interrupted`` (nothing measured
is lost: records are appended as they come)."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Coroutine
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


class StopHandler:
    """The handler :func:`interruptible` installs; it remembers the signal (:func:`stop_requested`).

    Outside an event loop it raises ``KeyboardInterrupt`` where the main thread is.  Inside one it must
    not: a raise that lands in the loop's own code (between a future's completion and the wake-up of
    the task awaiting it) leaves that task asleep for good, and the loop's shutdown, which waits for
    every task, never ends (seen in CI: a SIGTERMed harness that did not exit in 60 s).  There it calls
    ``on_stop``, which cancels the loop's main task, as ``asyncio.Runner`` does for Ctrl-C."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.on_stop: Callable[[], Any] | None = None

    def __call__(self, signum, frame):
        self.received = signal.Signals(signum).name
        if self.on_stop is not None:
            self.on_stop()
            return
        raise KeyboardInterrupt(self.received)


def stop_requested() -> str | None:
    """The name of the stop signal the active :class:`StopHandler` received (None: none, or none active)."""
    handler = signal.getsignal(signal.SIGTERM)
    return handler.received if isinstance(handler, StopHandler) else None


def run_stoppable(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, where a stop signal under :func:`interruptible` cancels the coroutine's task
    (its ``except``/``finally`` blocks run in the loop, awaits included) and then raises
    ``KeyboardInterrupt`` naming the signal.  Without :func:`interruptible` it is ``asyncio.run``."""
    handler = signal.getsignal(signal.SIGTERM)
    if not isinstance(handler, StopHandler):
        return asyncio.run(coro)
    try:
        with asyncio.Runner() as runner:
            loop = runner.get_loop()
            task = loop.create_task(coro)

            def stop() -> None:  # the handler runs in the main thread, so nothing closes the loop meanwhile
                if not loop.is_closed():
                    loop.call_soon_threadsafe(task.cancel)  # threadsafe: it may land in the loop's bookkeeping

            handler.on_stop = stop
            if handler.received:  # a stop came before the loop ran (its raise was dropped)
                task.cancel()
            try:
                return loop.run_until_complete(task)
            except asyncio.CancelledError:
                if handler.received:
                    raise KeyboardInterrupt(handler.received) from None
                raise
    finally:
        handler.on_stop = None


@contextmanager
def interruptible():
    """SIGINT and SIGTERM stop the block (main thread only; elsewhere signals cannot be handled and the
    block runs as it is); the previous handlers come back after."""
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
