"""The replay behind ``calibrate validate``: a load test's measured requests, the same requests served
by the simulator, and the comparison rows (server-side checks, client-side information).  See
:mod:`calibration.validate` for what is compared and why."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml

from calibration.fit_inputs import FitInputError
from calibration.fit_points import server_ttft_s
from calibration.harness.bundle import Bundle
from calibration.harness.metrics import histogram_quantile

PCTS = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2e")
LABEL = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}


# ============================================================================ measured
def _sum_histograms(b: Bundle, phase: str, name: str) -> dict | None:
    """A histogram delta summed over the phase's segments: {count, sum, buckets}."""
    tot = None
    for rec in b.records(phase, "metrics"):
        series = ((rec.get("histograms") or {}).get(name) or [])
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
    recs = [r for r in b.requests(phase) if r.get("t_send") is not None and r.get("prompt_tokens")
            and r.get("output_tokens")]
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
        rows.append({
            "id": r["id"], "arrival_s": r["t_send"] - t0, "input_tokens": int(r["prompt_tokens"]), "output_tokens": o,
            "segment": r.get("segment", 0),
            "server_ttft_s": srv_ttft,
            "server_tpot_s": sm["mean_itl_ms"] / 1e3 if sm.get("mean_itl_ms") and o > 1 else None,
            "server_e2e_s": (srv_ttft + gen / 1e3) if srv_ttft is not None and gen is not None else None,
            "client_ttft_s": r.get("ttft_s"), "client_e2e_s": r.get("e2e_s"),
            "client_tpot_s": ((r["e2e_s"] - r["ttft_s"]) / (o - 1)
                              if o > 1 and r.get("e2e_s") is not None and r.get("ttft_s") is not None else None),
            "client_itl_s": [b_ - a_ for a_, b_ in zip(tt, tt[1:])],
        })
    notes = {"segments": len({r["segment"] for r in rows}),
             "itl_hist": _sum_histograms(b, phase, "vllm:inter_token_latency_seconds"),
             "iterations": _sum_histograms(b, phase, "vllm:iteration_tokens_total")}
    return rows, notes


# ============================================================================ simulated
def simulate_phase(rows: list[dict], *, model_ref: str, hwdb_dirs: list[Path], gpu: str, setup, out: Path,
                   phase: str, engine: str | None = None):
    """Replay ``rows`` (arrival, lengths) in the simulator; returns (scenario dict, Results)."""
    from simulator.run import simulate
    from simulator.scenario import ScenarioError, parse_scenario
    trace = out / f"{phase}.trace.jsonl"
    with trace.open("w") as fh:
        for r in rows:
            fh.write(json.dumps({"arrival_s": round(r["arrival_s"], 6), "input_tokens": r["input_tokens"],
                                 "output_tokens": r["output_tokens"]}) + "\n")
    data = {"name": f"replay-{phase}", "description": f"replay of {phase} (epdsim calibrate validate)",
            "model": model_ref, "hwdb": [str(d) for d in hwdb_dirs],
            "pools": [{"name": "main", "gpu": gpu, "tp": setup.tp, "pp": setup.pp, "dtype": setup.dtype,
                       "engine": {**({"engine": engine} if engine else {}), **setup.engine_config()}}],
            "workload": {"arrival": {"kind": "trace", "path": str(trace), "format": "plain"}}}
    (out / f"{phase}.scenario.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        scn = parse_scenario(data, f"replay of {phase}")
        res = simulate(scn)
    except ScenarioError as exc:
        raise FitInputError(f"cannot replay {phase} in the simulator: {exc}") from None
    return data, res


def predicted_phase(res, rows: list[dict], frontend_s: float | None) -> dict:
    """Per-request simulator times aligned with ``rows`` (same order: the trace's)."""
    req = res.requests.sort_values("request_id")
    steps = res.steps.sort_values("start_s")
    starts = steps["start_s"].to_numpy()
    arr = req["arrival_s"].to_numpy()
    first = req["first_token_s"].to_numpy()
    fin = req["finish_s"].to_numpy()
    idx = np.searchsorted(starts, arr - 1e-12, side="left")
    pickup = np.where(idx < len(starts), starts[np.minimum(idx, len(starts) - 1)], arr)
    fe = frontend_s or 0.0
    return {"server_ttft_s": first - pickup, "server_tpot_s": req["tpot_s"].to_numpy(),
            "server_e2e_s": fin - pickup,
            "client_ttft_s": req["ttft_s"].to_numpy() + fe, "client_e2e_s": req["e2e_s"].to_numpy() + fe,
            "client_tpot_s": req["tpot_s"].to_numpy(),
            "completed": int((req["outcome"] == "completed").sum()), "n": len(req),
            "itl": res.summary["itl_s"]}


# ============================================================================ comparison
def _pct(x, p) -> float:
    x = np.asarray([v for v in x if v is not None and np.isfinite(v)], dtype=float)
    return float(np.percentile(x, p)) if len(x) else math.nan


def _row(metric, stat, source, meas, pred, tol, check=True, note=""):
    err = pred / meas - 1.0 if meas and np.isfinite(meas) and np.isfinite(pred) and meas > 0 else math.nan
    ok = None if not check or not np.isfinite(err) else bool(abs(err) <= tol)
    return {"metric": metric, "stat": stat, "source": source, "measured_s": meas, "predicted_s": pred,
            "rel_error": err, "check": bool(check and np.isfinite(err)), "passed": ok, "note": note}


def compare(rows: list[dict], pred: dict, notes: dict, tol: float) -> list[dict]:
    out = []
    for m in ("ttft", "tpot", "e2e"):
        key = f"server_{m}_s"
        meas = [r[key] for r in rows]
        have = sum(v is not None for v in meas)
        if have >= 0.9 * len(rows) and have:
            pv = [p for p, v in zip(pred[key], meas) if v is not None]
            for p in PCTS:
                out.append(_row(LABEL[m], f"p{p}", "server", _pct(meas, p), _pct(pv, p), tol))
            out.append(_row(LABEL[m], "mean", "server", float(np.nanmean([v for v in meas if v is not None])),
                            float(np.nanmean(pv)), tol, check=False))
    h = notes.get("itl_hist")
    it = pred["itl"]
    if h and h["count"] > 0:
        out.append(_row("ITL", "mean", "server histogram", h["sum"] / h["count"], it["mean"], tol))
        for p in PCTS:
            q = histogram_quantile(p / 100.0, h["buckets"])
            w = _bucket_width(q, h["buckets"])
            resolved = np.isfinite(q) and w <= 2 * tol * q
            out.append(_row("ITL", f"p{p}", "server histogram", q, it[f"p{p}"], tol, check=resolved,
                            note="" if resolved else f"unresolved ({w * 1e3:g} ms bucket)"))
    # client side: information
    for m in ("ttft", "e2e", "tpot"):
        key = f"client_{m}_s"
        meas = [r[key] for r in rows]
        if any(v is not None for v in meas):
            pv = [p for p, v in zip(pred[key], meas) if v is not None]
            for p in PCTS:
                out.append(_row(LABEL[m], f"p{p}", "client", _pct(meas, p), _pct(pv, p), tol, check=False,
                                note="info (+ front end)" if m in ("ttft", "e2e") else ""))
    itl_c = [g for r in rows for g in r["client_itl_s"]]
    if itl_c:
        for p in PCTS:
            out.append(_row("ITL", f"p{p}", "client", _pct(itl_c, p), it[f"p{p}"], tol, check=False,
                            note="info (lumped)"))
    return out
