"""The measurements a fit compares with the simulator: one :class:`Point` per lone prefill request and
per decode-sweep request (server-side timings where the server kept them), aggregated into medians."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from calibration.harness.bundle import Bundle


# ============================================================================ measurements
@dataclass(frozen=True)
class Point:
    """One measurement the fit compares with a prediction (seconds)."""

    kind: str  # "prefill" (time of the prefill steps) or "decode" (TPOT)
    phase: str
    request: str
    prompt: int
    output: int
    measured_s: float
    source: str  # "server" or "client"
    batch: float = 1.0  # decode: sequences the engine decoded per step
    mix: float = 0.0  # decode: fraction of steps that also prefill another request
    client_s: float | None = None  # prefill: the client's TTFT
    weight: float = 1.0  # of its log-residual
    n: int = 1  # requests behind the point (a median of several, see aggregate())
    spread: float = 0.0  # their median |t / median - 1|


def _metrics_totals(b: Bundle, phase: str) -> dict | None:
    """Summed /metrics deltas of a phase's segments: steps, generation tokens, requests."""
    steps = gen = n = 0.0
    found = False
    for rec in b.records(phase, "metrics"):
        h, c = rec.get("histograms"), rec.get("counters")
        if not h or c is None:
            continue
        it = (h.get("vllm:iteration_tokens_total") or [{}])[0]
        e2e = (h.get("vllm:e2e_request_latency_seconds") or [{}])[0]
        if not it.get("count"):
            continue
        found = True
        steps += it["count"]
        n += e2e.get("count", 0.0)
        gen += sum(v for k, v in c.items() if k.startswith("vllm:generation_tokens_total"))
    return {"steps": steps, "generation_tokens": gen, "requests": n} if found else None


def engine_batch(b: Bundle, phase: dict) -> tuple[float, str]:
    """Sequences per decode step the engine really ran in a decode phase, and how it was found."""
    conc = float(phase.get("concurrency") or 1)
    tot = _metrics_totals(b, phase["name"])
    if tot and tot["steps"] > 0:
        be = (tot["generation_tokens"] - tot["requests"]) / tot["steps"]
        return min(max(be, 1.0), conc), (
            f"/metrics: ({tot['generation_tokens']:.0f} generated - "
            f"{tot['requests']:.0f} requests) / {tot['steps']:.0f} steps = {be:.2f}"
        )
    return conc, "client concurrency (no /metrics deltas)"


def server_ttft_s(r: dict) -> float | None:
    """Server-side time from the engine's queue to the first token (queue + prefill), seconds."""
    sm = r.get("server_metrics") or {}
    if sm.get("time_to_first_token_ms") is None:
        return None
    return (sm["time_to_first_token_ms"] + (sm.get("queue_time_ms") or 0.0)) / 1e3


def measurement_points(b: Bundle) -> tuple[list[Point], dict]:
    """Prefill and decode points of a bundle, plus notes (batch estimates, sources)."""
    pts: list[Point] = []
    notes: dict[str, Any] = {"decode_batch": {}}
    for ph in b.manifest["plan"]:
        recs = b.requests(ph["name"])
        if ph["kind"] == "prefill":
            for r in recs:
                sm = r.get("server_metrics") or {}
                if r.get("output_tokens") != 1 and r.get("max_tokens") != 1:
                    continue
                if sm.get("time_to_first_token_ms") is not None:
                    meas, src = sm["time_to_first_token_ms"] / 1e3, "server"
                elif r.get("ttft_s"):
                    meas, src = r["ttft_s"], "client"
                else:
                    continue
                pts.append(
                    Point(
                        "prefill", ph["name"], r["id"], int(r["prompt_tokens"]), 1, meas, src, client_s=r.get("ttft_s")
                    )
                )
        elif ph["kind"] == "decode":
            be, how = engine_batch(b, ph)
            notes["decode_batch"][ph["name"]] = {"concurrency": ph.get("concurrency"), "engine_batch": be, "how": how}
            for r in recs:
                o = int(r.get("output_tokens") or 0)
                if o < 2:
                    continue
                sm = r.get("server_metrics") or {}
                if sm.get("mean_itl_ms"):
                    meas, src = sm["mean_itl_ms"] / 1e3, "server"
                elif r.get("e2e_s") and r.get("ttft_s") is not None:
                    meas, src = (r["e2e_s"] - r["ttft_s"]) / (o - 1), "client"
                else:
                    continue
                pts.append(
                    Point(
                        "decode",
                        ph["name"],
                        r["id"],
                        int(r["prompt_tokens"]),
                        o,
                        meas,
                        src,
                        batch=be,
                        mix=min(1.0, (be - 1.0) / o),
                    )
                )
    notes["requests"] = {
        "prefill": sum(p.kind == "prefill" for p in pts),
        "decode": sum(p.kind == "decode" for p in pts),
    }
    return pts, notes


def aggregate(points: list[Point]) -> list[Point]:
    """One point per prompt length (prefill) and per decode phase: the median of its requests.

    Medians make the fit robust to the transient slowdowns of a shared host (a whole repeat of the
    sweep 50% slower, one request 3x slower), and give every prompt length and every batch size the
    same weight, however many requests measured it.  ``spread`` keeps the requests' relative median
    absolute deviation, the repeat-to-repeat noise of that point."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        key = (p.kind, p.phase, p.prompt) if p.kind == "prefill" else (p.kind, p.phase)
        groups.setdefault(key, []).append(p)
    out = []
    for ps in groups.values():
        t = np.array([p.measured_s for p in ps])
        med = float(np.median(t))
        cl = [p.client_s for p in ps if p.client_s is not None]
        first = ps[0]
        out.append(
            dataclasses.replace(
                first,
                request=f"median of {len(ps)}",
                measured_s=med,
                prompt=int(np.median([p.prompt for p in ps])),
                output=int(np.median([p.output for p in ps])),
                client_s=float(np.median(cl)) if len(cl) == len(ps) else None,
                n=len(ps),
                spread=float(np.median(np.abs(t / med - 1.0))),
            )
        )
    return out
