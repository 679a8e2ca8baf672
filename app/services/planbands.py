"""The model error band of a plan's candidates and whether the recommendation's SLO holds at its edge.

Each candidate's TTFT and TPOT (at the SLO's percentile: simulated for verified rows, the screen's
estimate otherwise) take the band of the pools they rest on, as a simulated run's figures do: each pool
is resolved like the planner resolves it and assessed by :func:`simulator.confidence.assess`, and
:func:`simulator.confidence.error_bands` takes the widest band of the pools behind each figure.  The
pessimistic edge is value x (1 + band).  This is model error, not the seed noise of ``attainment_ci95``.
"""
from __future__ import annotations

import math

import pandas as pd

import hwdb
from simulator import fmt
from simulator.confidence import assess, error_bands, with_band
from simulator.perf import FitError
from simulator.scenario import PoolConfig, ScenarioError, deployment_for

COLUMNS = ["id", "ttft_band", "tpot_band", "ttft_low_s", "ttft_high_s", "tpot_low_s", "tpot_high_s",
           "meets_slo_at_band_edge"]


def _statuses(result, cand, model, db, seen: dict) -> list[dict]:
    """The confidence entries of a candidate's language-model pools (encoder pools have none, as in a run)."""
    eng = result.request.constraints.engine
    out = []
    for p in cand.pools:
        if p.role == "encoder":
            continue
        key = (p.gpu, p.tp, p.dp, p.ep, p.dtype)
        if key not in seen:
            try:
                dep = deployment_for(PoolConfig(gpu=p.gpu, tp=p.tp, dp=p.dp, ep=p.ep, dtype=p.dtype,
                                                kv_cache_dtype=result.request.constraints.kv_cache_dtype, engine=eng),
                                     model, db)
                seen[key] = assess(dep)
            except (ScenarioError, FitError, hwdb.HwdbError):
                seen[key] = None            # a candidate ruled out before screening: no figures to band
        if seen[key] is not None:
            out.append({"role": p.role, "confidence": seen[key]})
    return out


def holds_at_edge(ttft_s: float, tpot_s: float, rel: dict, slo) -> bool | None:
    """Whether TTFT and TPOT inflated to their band's pessimistic edge still meet the SLO's targets; None
    when a target's figure has no band (nothing to judge the edge by)."""
    ok = True
    for value, key, target in ((ttft_s, "ttft_s", slo.ttft_s), (tpot_s, "tpot_s", slo.tpot_s)):
        if target is None:
            continue
        if rel.get(key) is None or not math.isfinite(value):
            return None
        ok = ok and value * (1 + rel[key]) <= target
    return ok


def band_frame(result, db: hwdb.HardwareDB | None = None) -> pd.DataFrame:
    """Per candidate (``COLUMNS``): the relative TTFT and TPOT bands (NaN where none), the low and high ends in
    seconds, and ``meets_slo_at_band_edge`` (True/False, None without a band or figures)."""
    req = result.request
    db = db or hwdb.load(req.hwdb)
    model = db.model(req.model)
    seen: dict = {}
    rows = []
    for r in result.candidates.to_dict("records"):
        rel = error_bands({"pools": _statuses(result, result.candidate(r["id"]), model, db, seen)})
        row = {"id": r["id"], "ttft_band": rel["ttft_s"], "tpot_band": rel["tpot_s"]}
        for key in ("ttft", "tpot"):
            v, b = r[f"{key}_s"], rel[f"{key}_s"]
            ok = b is not None and math.isfinite(v)
            row[f"{key}_low_s"] = max(0.0, v * (1 - b)) if ok else math.nan
            row[f"{key}_high_s"] = v * (1 + b) if ok else math.nan
        row["meets_slo_at_band_edge"] = holds_at_edge(r["ttft_s"], r["tpot_s"], rel, req.slo) \
            if r["meets_slo"] else False
        rows.append(row)
    df = pd.DataFrame(rows, columns=COLUMNS)
    # True/False/None as Python objects: a column of bools alone would turn into numpy's.
    return df.astype({"ttft_band": float, "tpot_band": float, "meets_slo_at_band_edge": object})


def with_bands(frame: pd.DataFrame, bands: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (candidates, Pareto front) with its rows' band columns after ``tpot_s``."""
    out = frame.merge(bands, on="id", how="left")
    cols = [c for c in frame.columns]
    at = cols.index("tpot_s") + 1 if "tpot_s" in cols else len(cols)
    extra = [c for c in COLUMNS if c != "id"]
    return out[cols[:at] + extra + cols[at:]]


def _band(rel) -> float | None:
    return None if rel is None or rel != rel else float(rel)


def latency_text(row: dict, band: dict, percentile: int) -> str:
    """ "p90 TTFT 415 ms (275–555), p90 TPOT 31 ms (22–40)" of one candidate, bands from :func:`band_frame`."""
    return ", ".join(f"p{percentile} {lab} {with_band(row[k + '_s'], _band(band[k + '_band']))}"
                     for k, lab in (("ttft", "TTFT"), ("tpot", "TPOT")))


def verdict(result, bands: pd.DataFrame) -> str:
    """The recommendation's latencies with their bands and whether the SLO still holds at the band's
    pessimistic edge ("" without a recommendation)."""
    rec = result.recommended
    if not rec:
        return ""
    slo, q = result.request.slo, result.request.percentile
    b = bands.set_index("id").loc[rec["id"]].to_dict()
    text = latency_text(rec, b, q)
    targets = " and ".join(f"{lab} ≤ {fmt.duration(t)}" for lab, t in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s))
                           if t is not None)
    edge = b["meets_slo_at_band_edge"]
    if edge is None or edge != edge:
        return (f"{text}. No model error band for a targeted figure (a datasheet-only GPU or no validated runs): "
                f"whether the SLO ({targets}) holds within the model's error is unknown.")
    if edge:
        return f"{text}. The SLO ({targets}) still holds at the band's pessimistic edge."
    over = [f"{lab} up to {fmt.duration(b[k + '_high_s'])} > {fmt.duration(t)}"
            for k, lab, t in (("ttft", "TTFT", slo.ttft_s), ("tpot", "TPOT", slo.tpot_s))
            if t is not None and b[k + "_high_s"] > t]
    return (f"{text}. At the band's pessimistic edge the SLO ({targets}) does not hold ({'; '.join(over)}): "
            "the headroom is inside the model error band.")
