"""Is a run overloaded, and which pool is the bottleneck?  For the app's banner and the CLI.

A request's life splits into waits (queue before the prefill, the encoder's queue, the wait for a
KV transfer or for a decode slot) and service (everything else).  A run is called saturated when
requests wait much longer than they are served, when a wait keeps growing over the run (the last
quarter of arrivals waits several times longer than the first: arrivals outpace the pool), when
most requests miss the SLO while waiting dominates, or when requests are rejected or left
unfinished.  The bottleneck is the pool in front of the wait that is longest at the end of the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from simulator import fmt

if TYPE_CHECKING:
    from simulator.engine.results import Results

# wait phase -> (role of the pool it queues for, what is waited for)
WAITS = {
    "queue_s": ("front", "a prefill slot"),
    "encode_queue_s": ("encoder", "the encoder"),
    "transfer_wait_s": ("link", "the KV-transfer link"),
    "decode_admission_s": ("decode", "a decode slot"),
}
WAIT_OVER_SERVICE = 2.0  # mean wait more than twice the mean service time
LOW_ATTAINMENT = 0.5
GROWTH = 3.0  # last quarter's mean wait over the first quarter's
GROWTH_MIN_SHARE = 0.1  # ... and at least this share of the mean service time (not noise)


def _mean(df: pd.DataFrame, col: str) -> float:
    if col not in df:
        return 0.0
    v = df[col].to_numpy(dtype=float)
    v = v[np.isfinite(v)]
    return float(v.mean()) if len(v) else 0.0


def _pool_for(role: str, info: dict) -> str:
    pools = info.get("pools", [])
    if role == "front":
        p = next((p for p in pools if p["role"] in ("prefill", "colocated")), None)
    elif role == "link":
        kv = info.get("kv_transfer") or {}
        return f"link {kv.get('link', '?')}"
    else:
        p = next((p for p in pools if p["role"] == role), None)
    if p is None:
        return role
    return f"{p['name']} ({p['instances']}x {p['gpu']} TP{p['tp']}, {p['role']})"


def saturation(res: Results) -> dict | None:
    """None when the run keeps up; else {pool, phase, wait_s, service_s, attainment, message}."""
    req, s = res.requests, res.summary
    done = req[req["outcome"] == "completed"] if "outcome" in req else req
    lost = int(s.get("rejected", 0)) + int(s.get("unfinished", 0))
    waits = {c: _mean(done, c) for c in WAITS if c in done}
    if not waits and not lost:
        return None
    order = done.sort_values("arrival_s") if "arrival_s" in done else done
    k = max(1, len(order) // 4)
    first = {c: _mean(order.iloc[:k], c) for c in waits}
    last = {c: _mean(order.iloc[-k:], c) for c in waits}
    phase = max(waits, key=lambda c: (last[c], waits[c])) if waits else "queue_s"
    wait = waits.get(phase, 0.0)
    total_wait = sum(waits.values())
    service = max(_mean(done, "e2e_s") - total_wait, 1e-9)
    att = float(s.get("slo_attainment", float("nan")))
    label = phase.removesuffix("_s").replace("_", " ")
    reasons = []
    if wait > WAIT_OVER_SERVICE * service:
        reasons.append(
            f"mean {label} {fmt.duration(wait)} is {wait / service:,.0f}x the {fmt.duration(service)} of service"
        )
    elif (
        len(order) >= 8
        and last.get(phase, 0) >= GROWTH * first.get(phase, 0)
        and last.get(phase, 0) >= GROWTH_MIN_SHARE * service
    ):
        reasons.append(
            f"the {label} grows from {fmt.duration(first[phase])} (first quarter of arrivals) to "
            f"{fmt.duration(last[phase])} (last quarter)"
        )
    if att < LOW_ATTAINMENT and total_wait > 0.5 * (total_wait + service):
        reasons.append(f"SLO attainment {fmt.percent(att)}")
    if lost > 0.01 * max(1, int(s.get("requests", len(req)))):
        reasons.append(f"{lost:,} of {int(s.get('requests', len(req))):,} requests rejected or unfinished")
    if not reasons:
        return None
    role, what = WAITS[phase]
    pool = _pool_for(role, res.info)
    if not any(r.startswith("SLO attainment") for r in reasons):
        reasons.append(f"SLO attainment {fmt.percent(att)}")
    msg = (
        f"Overloaded: {'; '.join(reasons)}. Bottleneck: {pool} — requests wait for {what}. "
        "Lower the rate or add instances or GPUs to that pool."
    )
    return {
        "pool": pool,
        "phase": phase.removesuffix("_s"),
        "wait_s": wait,
        "service_s": service,
        "attainment": att,
        "message": msg,
    }
