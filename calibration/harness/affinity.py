"""Give a launched vLLM server's engine core the engine's CPUs (Linux), for small hosts.

vLLM serves from an API server process, an engine-core process (the scheduler) and, on CPU, a worker
process; ``VLLM_CPU_OMP_THREADS_BIND`` binds only the worker's OpenMP threads, and the rest run where
the server was started.  The engine core waits for each step's result in a busy loop (vLLM's
shared-memory message queue yields and polls for a second after each read:
``vllm/distributed/device_communicators/shm_broadcast.py``, ``SpinCondition``), so it takes CPU from
whatever shares its core.  Measured on the 2-vCPU VM, worker on core 0 (docs/validation/cpu.md):

* engine core beside the API server and the measuring client on core 1: it used 1.4 s of CPU in a
  4.5 s trace replay, the harness sent requests up to 110 ms late, and a decode sweep at 8 users kept
  an engine batch of 1.0;
* the same at the lowest priority (nice 19): sends at most 2.3 ms late, but under the trace's bursts
  the API server's streaming held up the engine core between steps, and server TPOT p50 came out
  7-29% above the fit in three launches of four;
* engine core on core 0 with the worker, whose steps it waits for: sends at most 3.2 ms late, engine
  batches 1.94, 3.82 and 7.64 at 2, 4 and 8 users, and server TPOT p50 within 16% in every launch.

So :func:`pin_below` moves it to the engine's CPUs.  With several engine CPUs it floats among the
OpenMP threads' cores; that layout was not measured here.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")
MAX_CPU_ID = 1 << 16  # Linux CPU ids stay below CONFIG_NR_CPUS (at most 8,192 today)


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """The processes below ``pid`` (children, their children, ...), from ``/proc/*/stat``."""
    children: dict[int, list[int]] = {}
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return sorted(out)


def pin_below(pid: int, cpus: set[int], proc: Path = PROC) -> list[int]:
    """Set every thread of every process below ``pid`` (not ``pid`` itself: the API server stays where
    it is) to run on ``cpus``, except threads already bound within ``cpus`` (the worker's OpenMP
    threads keep their one core each).  Returns the thread ids moved.  Raises ``OSError`` when the
    kernel refuses (a CPU set this process may not use)."""
    moved = []
    for child in descendants(pid, proc):
        try:
            tids = [int(t.name) for t in (proc / str(child) / "task").iterdir()]
        except OSError:
            continue
        for tid in tids:
            try:
                if os.sched_getaffinity(tid) <= cpus:
                    continue
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                continue
            moved.append(tid)
    return moved


def cpu_list(cpus) -> str:
    """``{0, 1, 2, 5}`` as ``"0,1,2,5"`` (the form ``VLLM_CPU_OMP_THREADS_BIND`` and ``taskset -c`` read)."""
    return ",".join(str(c) for c in sorted(cpus))


def _cpus(text: str, side: str, spec: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            a, b = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(
                f"--pin {spec}: the {side} CPUs {text!r} are not a CPU list; give e.g. 0 or 0-3,8"
            ) from None
        if a < 0 or b < a:
            raise ValueError(f"--pin {spec}: {part!r} of the {side} CPUs is not a CPU range; give e.g. 0-3")
        if b >= MAX_CPU_ID:  # before building the set: a hostile range must not take the memory
            raise ValueError(
                f"--pin {spec}: CPU {b} of the {side} CPUs is beyond any CPU id (below {MAX_CPU_ID}); "
                "give the CPUs this machine has (nproc, taskset -p $$)"
            )
        out.update(range(a, b + 1))
    return frozenset(out)


def parse_pin(spec: str, available=None) -> tuple[frozenset[int], frozenset[int]]:
    """``ENGINE:FRONT`` CPU lists (e.g. ``0:1`` or ``0-5:6,7``) as (engine CPUs, front CPUs): the
    worker and the engine core get the first, the API server and the harness the second.  Both must be
    non-empty, disjoint and CPUs this process may use (``available``, default its affinity)."""
    engine, sep, front = spec.partition(":")
    if not sep or not engine.strip() or not front.strip():
        raise ValueError(
            f"--pin {spec!r}: give ENGINE:FRONT CPU lists, e.g. --pin 0:1 (engine on CPU 0, the API "
            "server and this harness on CPU 1)"
        )
    e, f = _cpus(engine, "engine", spec), _cpus(front, "front", spec)
    if e & f:
        raise ValueError(
            f"--pin {spec}: CPU {cpu_list(e & f)} is on both sides; the engine's CPUs and the front end's must differ"
        )
    avail = set(os.sched_getaffinity(0) if available is None else available)
    if not (e | f) <= avail:
        raise ValueError(
            f"--pin {spec}: CPU {cpu_list((e | f) - avail)} is not available to this process (it may use "
            f"{cpu_list(avail)}); choose CPUs from that list"
        )
    return e, f
