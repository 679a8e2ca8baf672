"""Sweeps for the app: the knobs a page offers, validation of a sweep as asked, and the job that runs it
(no Streamlit).

Wraps :mod:`simulator.sweep` (docs/sweep.md).  The scenario arrives as the Home page's dict; it and
every varied copy are sandboxed like any scenario the app runs (:func:`app.services.scenarios.sandbox`),
and validated by the scenario schema.  Every mistake is an :class:`InputError` naming the field, the
value and the fix.  The job runs its points one after another in the job's own worker process
(:class:`app.services.jobs.Job`; a daemon process starts no further processes).
"""

from __future__ import annotations

import time
from pathlib import Path

from app.services.scenarios import USER_ERRORS, InputError, sandbox, to_scenario
from simulator.sweep.ladder import POINTS
from simulator.sweep.points import SweepError
from simulator.sweep.prepare import Prepared, prepare
from simulator.sweep.run import SweepResult, run_sweep

# Per-pool knobs: field -> (what it is, values to suggest)
POOL_KNOBS = {
    "instances": ("instances", "1,2,3,4"),
    "tp": ("tensor-parallel degree", "1,2,4,8"),
    "gpu": ("GPU", "H100,H200,L40S"),
    "dtype": ("weight format", "bf16,fp8"),
    "engine.max_num_seqs": ("max_num_seqs", "64,128,256,512"),
    "engine.max_num_batched_tokens": ("max_num_batched_tokens", "2048,4096,8192,16384"),
}
OPS_KNOBS = {
    "operations.startup.compile_cache": ("torch.compile cache", "none,pod,persistent"),
    "operations.startup.provisioning_s": ("node provisioning delay (s)", "0,60,300,600"),
}
AUTOSCALE_KNOBS = {
    "target_queue": ("scale-up threshold: waiting requests per instance", "1,2,4,8"),
    "max_instances": ("autoscaler's most instances", "2,4,8,16"),
}


def knobs(d: dict) -> dict[str, tuple[str, str]]:
    """The common knobs of scenario dict ``d``: dotted path -> (label, suggested values)."""
    out = {}
    for i, p in enumerate(d.get("pools") or []):
        name = p.get("name", "main") if isinstance(p, dict) else "?"
        for field, (what, values) in POOL_KNOBS.items():
            out[f"pools[{i}].{field}"] = (f"{name}: {what}", values)
    arrival = (d.get("workload") or {}).get("arrival") or {}
    if arrival.get("kind") == "closed":
        out["workload.arrival.concurrency"] = ("users of the closed loop", "8,16,32,64")
    ops = d.get("operations")
    if isinstance(ops, dict):
        out |= OPS_KNOBS
        for pool in ops.get("autoscale") or {}:
            for field, (what, values) in AUTOSCALE_KNOBS.items():
                out[f"operations.autoscale.{pool}.{field}"] = (f"{pool}: {what}", values)
    return out


def check(
    d: dict,
    *,
    rates: str | None = None,
    knob: str | None = None,
    points: int = POINTS,
    num_requests: int | None = None,
    folder: Path | None = None,
) -> Prepared:
    """The sweep of scenario ``d`` as asked (``rates``: ``"1,2,4"`` or ``"auto"``; or ``knob``:
    ``"pools[0].tp=1,2,4"``), validated; raises :class:`InputError`."""
    scn = to_scenario(d, folder=folder, sandboxed=True)
    try:
        prep = prepare(scn, rates=rates, knob=knob, points=points, num_requests=num_requests)
    except (SweepError, *USER_ERRORS) as exc:
        raise InputError(_page_words(str(exc))) from None
    for p in prep.points:
        sandbox(p.data, folder, p.origin)
    return prep


def _page_words(text: str) -> str:
    """A message of the command line's options in the page's words."""
    return (
        text.replace("--rates auto", "the auto ladder")
        .replace("--rates", "rates")
        .replace("--knob", "knob")
        .replace("--num-requests", "requests per point")
    )


def run(
    d: dict,
    *,
    rates: str | None = None,
    knob: str | None = None,
    points: int = POINTS,
    num_requests: int | None = None,
    folder: Path | None = None,
    progress=None,
) -> SweepResult:
    """Run the sweep (a job function, :func:`app.services.jobs.Job`): progress reports n/N points and
    the time left, estimated from the mean time per finished point."""
    prep = check(d, rates=rates, knob=knob, points=points, num_requests=num_requests, folder=folder)
    t0 = time.monotonic()

    def step(done: int, total: int, stage: str) -> None:
        if progress is None:
            return
        left = (time.monotonic() - t0) / done * (total - done) if done else None
        eta = f", about {left:.0f} s left" if left is not None and done < total else ""
        progress(done, total, f"{done}/{total} points{eta}")

    try:
        return run_sweep(
            str(d.get("name") or "scenario"),
            prep.knob,
            list(prep.points),
            list(prep.scenarios),
            workers=1,
            progress=step,
            auto=prep.auto,
        )
    except USER_ERRORS as exc:
        raise InputError(str(exc)) from None


def csv_bytes(res: SweepResult) -> bytes:
    """The sweep's records as CSV (SI units), as ``epdsim sweep --out`` writes ``sweep.csv``."""
    return res.frame().to_csv(index=False).encode()
