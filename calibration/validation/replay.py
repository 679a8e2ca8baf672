"""The replay behind ``calibrate validate``: a load test's measured requests, the same requests served
by the simulator, and the comparison rows (server-side checks, client-side information).  See
:mod:`calibration.validation.command` for what is compared and why."""

from __future__ import annotations

import json
import math
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from calibration.fit.inputs import FitInputError
from calibration.fit.points import server_ttft_s
from calibration.harness.bundle import Bundle
from calibration.harness.metrics import histogram_quantile
from simulator.run import simulate
from simulator.scenario import ScenarioError, parse_scenario

if TYPE_CHECKING:
    from simulator.engine.results import Results

PCTS = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2e")
LABEL = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}


# ============================================================================ measured
def _sum_histograms(b: Bundle, phase: str, name: str, segments: list[int] | None = None) -> dict | None:
    """A histogram delta summed over the phase's segments (those in ``segments`` when given):
    {count, sum, buckets}."""
    tot: dict[str, Any] | None = None
    for rec in b.records(phase, "metrics"):
        if segments is not None and rec.get("segment", 0) not in segments:
            continue
        series = (rec.get("histograms") or {}).get(name) or []
        for s in series:
            if tot is None:
                tot = {"count": 0.0, "sum": 0.0, "buckets": [[le, 0.0] for le, _ in s["buckets"]]}
            tot["count"] += s["count"]
            tot["sum"] += s["sum"]
            if [le for le, _ in s["buckets"]] == [le for le, _ in tot["buckets"]]:
                for i, (_, c) in enumerate(s["buckets"]):
                    tot["buckets"][i][1] += c
    return tot


def _bucket_width(q_value: float, buckets: list) -> float:
    prev = 0.0
    for le, _ in buckets:
        le = math.inf if le == "+Inf" else float(le)
        if q_value <= le:
            return le - prev
        prev = le
    return math.inf


def measured_phase(b: Bundle, phase: str) -> tuple[list[dict], dict]:
    """Per-request measurements (sorted by send time) and phase-level notes."""
    recs = [
        r
        for r in b.requests(phase)
        if r.get("t_send") is not None and r.get("prompt_tokens") and r.get("output_tokens")
    ]
    recs.sort(key=lambda r: (r["t_send"], str(r["id"])))
    if not recs:
        return [], {}
    t0 = recs[0]["t_send"]
    rows = []
    for r in recs:
        sm = r.get("server_metrics") or {}
        o = int(r["output_tokens"])
        srv_ttft = server_ttft_s(r)
        gen = sm.get("generation_time_ms")
        tt = r.get("token_times_s") or []
        rows.append(
            {
                "id": r["id"],
                "arrival_s": r["t_send"] - t0,
                "input_tokens": int(r["prompt_tokens"]),
                "output_tokens": o,
                "segment": r.get("segment", 0),
                "server_ttft_s": srv_ttft,
                "server_tpot_s": sm["mean_itl_ms"] / 1e3 if sm.get("mean_itl_ms") and o > 1 else None,
                "server_e2e_s": (srv_ttft + gen / 1e3) if srv_ttft is not None and gen is not None else None,
                "client_ttft_s": r.get("ttft_s"),
                "client_e2e_s": r.get("e2e_s"),
                "client_tpot_s": (
                    (r["e2e_s"] - r["ttft_s"]) / (o - 1)
                    if o > 1 and r.get("e2e_s") is not None and r.get("ttft_s") is not None
                    else None
                ),
                "client_itl_s": [b_ - a_ for a_, b_ in pairwise(tt)],
            }
        )
    segs = sorted({r["segment"] for r in rows})
    mrecs = [m for m in b.records(phase, "metrics") if m.get("histograms")]
    covered = sorted({m.get("segment", 0) for m in mrecs} & set(segs))
    notes = {
        "segments": len(segs),
        "per_step": {
            "segments": segs,
            "with_metrics": covered,
            "partial": sorted({m.get("segment", 0) for m in mrecs if m.get("partial")} & set(covered)),
        },
        "itl_hist": _sum_histograms(b, phase, "vllm:inter_token_latency_seconds", covered),
        "iterations": _sum_histograms(b, phase, "vllm:iteration_tokens_total", covered),
    }
    return rows, notes


def arrival_stats(rows: list[dict]) -> dict:
    """The arrivals as the client sent them: count, span (s), mean rate (req/s), inter-arrival CV.
    Reports describe the load from these, whatever the plan called it."""
    arr = np.sort(np.array([r["arrival_s"] for r in rows], dtype=float))
    gaps = np.diff(arr)
    span = float(arr[-1] - arr[0]) if len(arr) else 0.0
    cv = float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else None
    return {"n": len(arr), "span_s": span, "mean_rate": (len(arr) - 1) / span if span > 0 else None, "cv": cv}


def per_step_scope(notes: dict) -> str:
    """Which segments the per-step figures (ITL histogram, engine steps) cover, in words."""
    ps = notes.get("per_step") or {}
    segs, cov, part = ps.get("segments", []), ps.get("with_metrics", []), ps.get("partial", [])
    if not cov:
        return f"no segment of {len(segs)} has a /metrics record: no per-step figures"
    text = (
        "all segments"
        if cov == segs
        else f"segment(s) {', '.join(map(str, cov))} of {', '.join(map(str, segs))} (the others have no /metrics "
        f"record; the simulator's figures are restricted to the same segments' requests)"
    )
    if part:
        text += (
            f"; segment(s) {', '.join(map(str, part))} scraped at an interruption (their delta also counts "
            f"requests cut off in flight)"
        )
    return text


# ============================================================================ simulated
def simulate_phase(
    rows: list[dict],
    *,
    model_ref: str,
    hwdb_dirs: list[Path],
    gpu: str,
    setup,
    out: Path,
    phase: str,
    engine: str | None = None,
):
    """Replay ``rows`` (arrival, lengths) in the simulator; returns (scenario dict, Results)."""
    trace = out / f"{phase}.trace.jsonl"
    with trace.open("w") as fh:
        for r in rows:
            fh.write(
                json.dumps(
                    {
                        "arrival_s": round(r["arrival_s"], 6),
                        "input_tokens": r["input_tokens"],
                        "output_tokens": r["output_tokens"],
                    }
                )
                + "\n"
            )
    data = {
        "name": f"replay-{phase}",
        "description": f"replay of {phase} (epdsim calibrate validate)",
        "model": model_ref,
        "hwdb": [str(d) for d in hwdb_dirs],
        "pools": [
            {
                "name": "main",
                "gpu": gpu,
                "tp": setup.tp,
                "pp": setup.pp,
                "dtype": setup.dtype,
                "engine": {**({"engine": engine} if engine else {}), **setup.engine_config()},
            }
        ],
        "workload": {"arrival": {"kind": "trace", "path": str(trace), "format": "plain"}},
    }
    (out / f"{phase}.scenario.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        scn = parse_scenario(data, f"replay of {phase}")
        res = simulate(scn)
    except ScenarioError as exc:
        raise FitInputError(f"cannot replay {phase} in the simulator: {exc}") from None
    return data, res


def predicted_phase(res: Results, rows: list[dict], notes: dict | None = None) -> dict:
    """Per-request simulator times aligned with ``rows`` (same order: the trace's); ``itl`` and
    ``steps`` over the segments ``notes["per_step"]`` says have a /metrics record.

    Server side: the engine's own times, from the first step at or after the engine saw the request
    (its arrival plus the front end's way in).  Client side: the requests table's TTFT, TPOT and E2E,
    which hold the replayed engine's front end (way in and API server loop) when it has one."""
    req = res.requests.sort_values("request_id")
    steps = res.steps.sort_values("start_s")
    starts = steps["start_s"].to_numpy()
    arr = req["arrival_s"].to_numpy()
    seen = arr + req["frontend_s"].to_numpy()
    first = req["first_token_s"].to_numpy()
    fin = req["finish_s"].to_numpy()
    out_tok = req["output_tokens"].to_numpy()
    idx = np.searchsorted(starts, seen - 1e-12, side="left")
    pickup = np.where(idx < len(starts), starts[np.minimum(idx, len(starts) - 1)], seen)
    itl = dict(res.summary["itl_s"])
    ps = (notes or {}).get("per_step") or {}
    steps_n = int(len(steps))
    if ps.get("with_metrics") is not None and ps["with_metrics"] != ps.get("segments"):
        # per-step figures over the covered segments' requests only: ITL mean = decode time / gaps, and
        # the steps that start inside those segments' spans (a resumed segment runs later, apart)
        seg = np.array([r["segment"] for r in rows])
        out = np.array([r["output_tokens"] for r in rows])
        keep = np.isin(seg, ps["with_metrics"])
        gaps = float(np.sum(np.maximum(out[keep] - 1, 0)))
        itl["mean"] = float(np.sum((fin - first)[keep]) / gaps) if gaps else math.nan
        inside = np.zeros(len(starts), dtype=bool)
        for s_ in ps["with_metrics"]:
            k = seg == s_
            if k.any():
                inside |= (starts >= arr[k].min() - 1e-9) & (starts <= fin[k].max() + 1e-9)
        steps_n = int(inside.sum())
    return {
        "server_ttft_s": first - pickup,
        "server_tpot_s": np.where(out_tok > 1, (fin - first) / np.maximum(out_tok - 1, 1), np.nan),
        "server_e2e_s": fin - pickup,
        "client_ttft_s": req["ttft_s"].to_numpy(),
        "client_e2e_s": req["e2e_s"].to_numpy(),
        "client_tpot_s": req["tpot_s"].to_numpy(),
        "completed": int((req["outcome"] == "completed").sum()),
        "n": len(req),
        "itl": itl,
        "steps": steps_n,
    }


# ============================================================================ comparison
def _pct(x, p) -> float:
    x = np.asarray([v for v in x if v is not None and np.isfinite(v)], dtype=float)
    return float(np.percentile(x, p)) if len(x) else math.nan


def _row(metric, stat, source, meas, pred, tol, check=True, note=""):
    err = pred / meas - 1.0 if meas and np.isfinite(meas) and np.isfinite(pred) and meas > 0 else math.nan
    ok = None if not check or not np.isfinite(err) else bool(abs(err) <= tol)
    return {
        "metric": metric,
        "stat": stat,
        "source": source,
        "measured_s": meas,
        "predicted_s": pred,
        "rel_error": err,
        "check": bool(check and np.isfinite(err)),
        "passed": ok,
        "note": note,
    }


#: the client-side figures checked when the replay has a fitted front end (the others are information)
CLIENT_CHECKS = {("TTFT", "p50"), ("TTFT", "p90")}


def compare(rows: list[dict], pred: dict, notes: dict, tol: float, client_tol: float | None = None) -> list[dict]:
    """The comparison rows: server-side checks within ``tol``; client-side rows, of which TTFT p50 and p90
    are checks within ``client_tol`` (None: information only, as without a fitted front end)."""
    out = []
    for m in ("ttft", "tpot", "e2e"):
        key = f"server_{m}_s"
        meas = [r[key] for r in rows]
        have = sum(v is not None for v in meas)
        if have >= 0.9 * len(rows) and have:
            pv = [p for p, v in zip(pred[key], meas, strict=True) if v is not None]  # one simulated row each
            for p in PCTS:
                out.append(_row(LABEL[m], f"p{p}", "server", _pct(meas, p), _pct(pv, p), tol))
            out.append(
                _row(
                    LABEL[m],
                    "mean",
                    "server",
                    float(np.nanmean([v for v in meas if v is not None])),
                    float(np.nanmean(pv)),
                    tol,
                    check=False,
                )
            )
    h = notes.get("itl_hist")
    it = pred["itl"]
    if h and h["count"] > 0:
        ps = notes.get("per_step") or {}
        some = ps.get("with_metrics") is not None and ps["with_metrics"] != ps.get("segments")
        scope = f"segments {', '.join(map(str, ps['with_metrics']))} only" if some else ""
        out.append(_row("ITL", "mean", "server histogram", h["sum"] / h["count"], it["mean"], tol, note=scope))
        for p in PCTS:
            q = histogram_quantile(p / 100.0, h["buckets"])
            w = _bucket_width(q, h["buckets"])
            resolved = np.isfinite(q) and w <= 2 * tol * q and not some
            out.append(
                _row(
                    "ITL",
                    f"p{p}",
                    "server histogram",
                    q,
                    it[f"p{p}"],
                    tol,
                    check=resolved,
                    note=""
                    if resolved
                    else (
                        f"unresolved ({w * 1e3:g} ms bucket)" if not some else f"{scope}; simulated over all requests"
                    ),
                )
            )
    # client side: through the replayed front end
    for m in ("ttft", "e2e", "tpot"):
        key = f"client_{m}_s"
        meas = [r[key] for r in rows]
        if any(v is not None for v in meas):
            pv = [p for p, v in zip(pred[key], meas, strict=True) if v is not None]  # one simulated row each
            for p in PCTS:
                check = client_tol is not None and (LABEL[m], f"p{p}") in CLIENT_CHECKS
                out.append(
                    _row(
                        LABEL[m],
                        f"p{p}",
                        "client",
                        _pct(meas, p),
                        _pct(pv, p),
                        client_tol if check else tol,
                        check=check,
                        note="" if check else ("info (no fitted front end)" if client_tol is None else "info"),
                    )
                )
    itl_c = [g for r in rows for g in r["client_itl_s"]]
    if itl_c:
        for p in PCTS:
            out.append(
                _row("ITL", f"p{p}", "client", _pct(itl_c, p), it[f"p{p}"], tol, check=False, note="info (lumped)")
            )
    return out
