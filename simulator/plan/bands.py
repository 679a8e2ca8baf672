"""The model error band of a plan's candidates and whether the SLO holds at its pessimistic edge.

Each candidate's TTFT and TPOT (at the SLO's percentile: simulated for verified rows, the screen's
estimate otherwise) take the band of the pools they rest on, as a simulated run's figures do: each pool
is resolved as the planner resolves it and assessed by :func:`simulator.confidence.assess`, and
:func:`simulator.confidence.error_bands` takes the widest band of the pools behind each figure.  The
pessimistic edge is value x (1 + band).  This is model error, not the seed noise of ``attainment_ci95``.

The planner adds the band columns (``COLUMNS``) to every candidate row; with
``constraints.slo_at_band_edge`` a candidate meets the SLO only where the edge holds, and a candidate
whose targeted figure has no band (a datasheet-only GPU, or an engine without validated runs) is refused:
it cannot be shown to hold.  The app's Plan page and ``epdsim plan`` read the same columns.
"""

from __future__ import annotations

import math

import pandas as pd

import hwdb
from simulator import fmt
from simulator.confidence import assess, error_bands, with_band
from simulator.perf import FitError
from simulator.scenario import PoolConfig, ScenarioError, deployment_for

COLUMNS = [
    "id",
    "ttft_band",
    "tpot_band",
    "ttft_low_s",
    "ttft_high_s",
    "tpot_low_s",
    "tpot_high_s",
    "meets_slo_at_band_edge",
]
NO_BAND = {"ttft_s": None, "tpot_s": None, "e2e_s": None}
LABELS = (("ttft", "TTFT"), ("tpot", "TPOT"))


def layout_statuses(layouts) -> dict:
    """The confidence entry of each resolved plan layout (:class:`simulator.plan.candidates.Layout`), by
    its key: the planner has resolved them already, so nothing is resolved twice."""
    return {lay.key: assess(lay.dep) for lay in layouts}


def pool_statuses(req, cand, model, db, seen: dict) -> list[dict]:
    """The confidence entries of a candidate's language-model pools (encoder pools have none, as in a
    run); ``seen`` caches each pool layout's entry (None: it does not resolve, so it has no figures)."""
    c = req.constraints
    out = []
    for p in cand.pools:
        if p.role == "encoder":
            continue
        if p.key not in seen:
            try:
                dep = deployment_for(
                    PoolConfig(
                        gpu=p.gpu,
                        tp=p.tp,
                        dp=p.dp,
                        ep=p.ep,
                        dtype=p.dtype,
                        kv_cache_dtype=c.kv_cache_dtype,
                        engine=c.engine,
                    ),
                    model,
                    db,
                )
                seen[p.key] = assess(dep)
            except (ScenarioError, FitError, hwdb.HwdbError):
                seen[p.key] = None
        if seen[p.key] is not None:
            out.append({"role": p.role, "confidence": seen[p.key]})
    return out


def candidate_bands(req, cand, model, db, seen: dict) -> dict[str, float | None]:
    """The relative band of each banded figure of ``cand`` (:func:`simulator.confidence.error_bands`)."""
    if cand.rejected:
        return dict(NO_BAND)  # ruled out before screening: no figures to band
    return error_bands({"pools": pool_statuses(req, cand, model, db, seen)})


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


def edge_columns(ttft_s: float, tpot_s: float, rel: dict, meets_slo: bool, slo) -> dict:
    """A candidate's ``COLUMNS`` but ``id``: the relative bands (NaN where none), the low and high ends in
    seconds, and ``meets_slo_at_band_edge`` (False where the point value already fails the SLO)."""
    row: dict = {"ttft_band": _nan(rel.get("ttft_s")), "tpot_band": _nan(rel.get("tpot_s"))}
    for key, value in (("ttft", ttft_s), ("tpot", tpot_s)):
        b = rel.get(f"{key}_s")
        if b is not None and math.isfinite(value):
            row[f"{key}_low_s"], row[f"{key}_high_s"] = max(0.0, value * (1 - b)), value * (1 + b)
        else:
            row[f"{key}_low_s"], row[f"{key}_high_s"] = math.nan, math.nan
    row["meets_slo_at_band_edge"] = holds_at_edge(ttft_s, tpot_s, rel, slo) if meets_slo else False
    return row


def edge_refusal(ttft_s: float, tpot_s: float, rel: dict, slo, percentile: int) -> str:
    """Why a candidate whose point values meet the SLO is refused at the band's edge (a
    ``rejected_reason``): the figure whose edge passes its target, or the figure without a band; "" when
    the SLO holds at the edge."""
    row = edge_columns(ttft_s, tpot_s, rel, True, slo)
    if row["meets_slo_at_band_edge"] is True:
        return ""
    over, unknown = [], []
    for (key, lab), value in zip(LABELS, (ttft_s, tpot_s), strict=True):
        target = getattr(slo, f"{key}_s")
        if target is None:
            continue
        high = row[f"{key}_high_s"]
        if high != high:
            unknown.append(lab)
        elif high > target:
            over.append(
                f"p{percentile} {lab} {with_band(value, rel[key + '_s'])} reaches {fmt.duration(high)} "
                f"at the model error band's pessimistic edge, over the {fmt.duration(target)} target"
            )
    if over:
        return "band edge: " + "; ".join(over)
    return (
        "band edge: no model error band for " + " and ".join(unknown) + " (a datasheet-only GPU or no "
        "validated runs of its engine), so the SLO cannot be shown to hold at the edge"
    )


def band_frame(result, db: hwdb.HardwareDB | None = None) -> pd.DataFrame:
    """Per candidate (``COLUMNS``), judged against ``result.request.slo``: the bands the planner stored
    in the candidate rows, or, for a result without them, each candidate's pools resolved afresh."""
    req = result.request
    recs = result.candidates.to_dict("records")
    if "ttft_band" in result.candidates.columns:
        rels = [{"ttft_s": _none(r["ttft_band"]), "tpot_s": _none(r["tpot_band"])} for r in recs]
    else:
        db = db or hwdb.load(req.hwdb)
        model = db.model(req.model)
        seen: dict = {}  # pool_statuses' cache of resolved layouts, shared by the candidates
        rels = [candidate_bands(req, result.candidate(r["id"]), model, db, seen) for r in recs]
    rows = [
        {"id": r["id"], **edge_columns(r["ttft_s"], r["tpot_s"], rel, bool(r["meets_slo"]), req.slo)}
        for r, rel in zip(recs, rels, strict=True)
    ]
    df = pd.DataFrame(rows, columns=COLUMNS)
    # True/False/None as Python objects: a column of bools alone would turn into numpy's.
    return df.astype({"ttft_band": float, "tpot_band": float, "meets_slo_at_band_edge": object})


def with_bands(frame: pd.DataFrame, bands: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (candidates, Pareto front) with ``bands``' columns after ``tpot_s``, in place of any band
    columns it holds."""
    extra = [c for c in COLUMNS if c != "id"]
    cols = [c for c in frame.columns if c not in extra]
    out = frame[cols].merge(bands, on="id", how="left")
    at = cols.index("tpot_s") + 1 if "tpot_s" in cols else len(cols)
    return out[cols[:at] + extra + cols[at:]]


def latency_text(row: dict, band: dict, percentile: int) -> str:
    """ "p90 TTFT 415 ms (275–555), p90 TPOT 31 ms (22–40)" of one candidate, bands from :func:`band_frame`."""
    return ", ".join(f"p{percentile} {lab} {with_band(row[k + '_s'], _none(band[k + '_band']))}" for k, lab in LABELS)


def verdict(result, bands: pd.DataFrame | None = None) -> str:
    """The recommendation's latencies with their bands and whether the SLO still holds at the band's
    pessimistic edge ("" without a recommendation); ``bands`` defaults to :func:`band_frame`."""
    rec = result.recommended
    if not rec:
        return ""
    bands = band_frame(result) if bands is None else bands
    slo, q = result.request.slo, result.request.percentile
    b = bands.set_index("id").loc[rec["id"]].to_dict()
    text = latency_text(rec, b, q)
    targets = " and ".join(
        f"{lab} ≤ {fmt.duration(t)}" for lab, t in (("TTFT", slo.ttft_s), ("TPOT", slo.tpot_s)) if t is not None
    )
    edge = b["meets_slo_at_band_edge"]
    if edge is None or edge != edge:
        return (
            f"{text}. No model error band for a targeted figure (a datasheet-only GPU or no validated runs): "
            f"whether the SLO ({targets}) holds within the model's error is unknown."
        )
    if edge:
        return f"{text}. The SLO ({targets}) still holds at the band's pessimistic edge."
    over = [
        f"{lab} up to {fmt.duration(b[k + '_high_s'])} > {fmt.duration(t)}"
        for k, lab, t in (("ttft", "TTFT", slo.ttft_s), ("tpot", "TPOT", slo.tpot_s))
        if t is not None and b[k + "_high_s"] > t
    ]
    return (
        f"{text}. At the band's pessimistic edge the SLO ({targets}) does not hold ({'; '.join(over)}): "
        "the headroom is inside the model error band."
    )


def _none(rel) -> float | None:
    return None if rel is None or rel != rel else float(rel)


def _nan(rel: float | None) -> float:
    return math.nan if rel is None else float(rel)
