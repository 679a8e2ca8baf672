"""Where candidate simulations run: in this process, in local worker processes, or on a Ray cluster.

Each executor maps a top-level function over plain-dict tasks and calls
``on_done(result)`` as each finishes (completion order), so that callers can
record results incrementally.  Ctrl-C (KeyboardInterrupt) stops the
submission, cancels what has not started and returns the results finished so
far with ``interrupted=True``; nothing finished is lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait


class ExecutorError(RuntimeError):
    """The requested executor cannot run (e.g. Ray is not installed)."""


def default_workers() -> int:
    """Worker processes for local runs: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _worker_init() -> None:
    """Workers leave Ctrl-C to the parent, which cancels them and keeps what finished."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _hold_further_interrupts() -> None:
    """After the first Ctrl-C, ignore the next ones until the finished results are assembled and written
    (:func:`interrupt_guard` restores the handler)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def interrupt_guard():
    """Restore the SIGINT handler on exit (an interrupted run ignores repeated Ctrl-C meanwhile)."""
    main = threading.current_thread() is threading.main_thread()
    old = signal.getsignal(signal.SIGINT) if main else None
    try:
        yield
    finally:
        if main and old is not None:
            signal.signal(signal.SIGINT, old)


def run_local(fn: Callable[[dict], dict], tasks: list[dict], workers: int, on_done: Callable[[dict], None]) -> bool:
    """Run ``tasks`` on ``workers`` processes (1: here, serially).  Returns True if interrupted."""
    if workers <= 1 or len(tasks) <= 1:
        try:
            for t in tasks:
                on_done(fn(t))
        except KeyboardInterrupt:
            _hold_further_interrupts()
            return True
        return False
    pool = ProcessPoolExecutor(max_workers=min(workers, len(tasks)), initializer=_worker_init)
    pending = {pool.submit(fn, t) for t in tasks}
    try:
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                on_done(f.result())
    except KeyboardInterrupt:
        _hold_further_interrupts()
        for f in pending:
            f.cancel()
        # Running simulations are abandoned: end their processes rather than wait for them.
        for proc in list(getattr(pool, "_processes", {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        return True
    pool.shutdown()
    return False


def run_ray(fn: Callable[[dict], dict], tasks: list[dict], address: str, on_done: Callable[[dict], None]) -> bool:
    """Run ``tasks`` as Ray tasks on the cluster at ``address`` ("local" starts a local Ray instance;
    an already initialised Ray session is used as it is).  Returns True if interrupted."""
    try:
        import ray  # noqa: PLC0415 - optional extra, only with --ray
    except ImportError:
        raise ExecutorError(
            f"--ray {address}: Ray is not installed; install the extra with "
            "`pip install -e '.[ray]'` or run without --ray (local processes)"
        ) from None
    if not ray.is_initialized():
        try:
            ray.init(address=None if address == "local" else address, ignore_reinit_error=True, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ExecutorError(
                f"--ray {address}: cannot connect to a Ray cluster there ({exc}); "
                "check the address (ray://HOST:10001 or HOST:6379) or use --ray local"
            ) from None
    remote = ray.remote(fn)
    refs = [remote.remote(t) for t in tasks]
    try:
        while refs:
            done, refs = ray.wait(refs, num_returns=1)
            for r in done:
                on_done(ray.get(r))
    except KeyboardInterrupt:
        _hold_further_interrupts()
        for r in refs:
            ray.cancel(r)
        return True
    return False
