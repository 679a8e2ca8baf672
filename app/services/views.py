"""Result tables reshaped for charts (pure pandas; no Streamlit, no Plotly).

Phase columns are found from the requests frame itself, so a tier that adds phases (the EPD
encoder's ``encode_s``, say) shows up in the breakdown without changes here.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# Columns of the requests frame that are timestamps or totals, not phases of a request's life.
NOT_PHASES = {"arrival_s", "scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s"}
PHASE_ORDER = (
    "frontend_s",
    "queue_s",
    "encode_queue_s",
    "encode_s",
    "embedding_transfer_s",
    "prefill_s",
    "transfer_wait_s",
    "transfer_s",
    "decode_admission_s",
    "decode_s",
)


def phase_columns(req: pd.DataFrame) -> list[str]:
    """Duration columns (``*_s``) that are phases: known timestamps and totals excluded, and any
    column that exceeds a request's end-to-end time somewhere is taken for a timestamp."""
    e2e = req["e2e_s"].to_numpy() if "e2e_s" in req else None
    cols = []
    for c in req.columns:
        if not c.endswith("_s") or c in NOT_PHASES or not np.issubdtype(req[c].dtype, np.number):
            continue
        v = req[c].to_numpy(dtype=float)
        if e2e is not None:
            ok = np.isfinite(v) & np.isfinite(e2e)
            if ok.any() and (v[ok] > e2e[ok] + 1e-9).any():
                continue
        cols.append(c)
    known = [c for c in PHASE_ORDER if c in cols]
    return known + [c for c in cols if c not in known]


def phase_frame(req: pd.DataFrame) -> pd.DataFrame:
    """Mean and p90 seconds per phase of completed requests, long form: phase, mean_s, p90_s.

    ``decode`` (first token to finish) is added so the phases add up to the mean E2E.
    """
    done = req[req["outcome"] == "completed"] if "outcome" in req else req
    d = done.copy()
    d["decode_s"] = d["finish_s"] - d["first_token_s"]
    rows = []
    for c in phase_columns(d):
        v = d[c].to_numpy(dtype=float)
        v = v[np.isfinite(v)]
        if len(v) == 0:
            continue  # a phase this deployment does not have (transfer in a colocated run)
        rows.append({"phase": c.removesuffix("_s"), "mean_s": float(v.mean()), "p90_s": float(np.percentile(v, 90))})
    return pd.DataFrame(rows, columns=["phase", "mean_s", "p90_s"])


def step_series(steps: pd.DataFrame, bins: int = 200) -> pd.DataFrame:
    """Per pool and time bin: duration-weighted mean batch size, KV occupancy and queue length
    (``waiting``) over the pool's instances, summed over instances for batch and queue."""
    if steps.empty:
        return pd.DataFrame(columns=["pool", "t_s", "batch_size", "kv_occupancy", "waiting"])
    t0, t1 = float(steps["start_s"].min()), float((steps["start_s"] + steps["duration_s"]).max())
    width = max((t1 - t0) / bins, 1e-9)
    s = steps.assign(bin=((steps["start_s"] - t0) // width).astype(int).clip(0, bins - 1))
    w = s["duration_s"].clip(lower=1e-12)
    s = s.assign(w=w, wb=s["batch_size"] * w, wk=s["kv_occupancy"] * w, wq=s["waiting"] * w)
    g = s.groupby(["pool", "instance", "bin"], sort=True)[["w", "wb", "wk", "wq"]].sum()
    per_inst = pd.DataFrame(
        {"batch_size": g["wb"] / g["w"], "kv_occupancy": g["wk"] / g["w"], "waiting": g["wq"] / g["w"]}
    ).reset_index()
    out = (
        per_inst.groupby(["pool", "bin"])
        .agg(batch_size=("batch_size", "sum"), kv_occupancy=("kv_occupancy", "mean"), waiting=("waiting", "sum"))
        .reset_index()
    )
    out["t_s"] = t0 + (out["bin"] + 0.5) * width
    return out[["pool", "t_s", "batch_size", "kv_occupancy", "waiting"]]


def ecdf(values: np.ndarray, weights: np.ndarray | None = None, points: int = 400) -> pd.DataFrame:
    """The (weighted) empirical CDF as at most ``points`` (value, fraction) pairs."""
    v = np.asarray(values, dtype=float)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float)
    keep = np.isfinite(v) & (w > 0)
    v, w = v[keep], w[keep]
    if len(v) == 0:
        return pd.DataFrame({"value": [], "fraction": []})
    order = np.argsort(v, kind="stable")
    v, cw = v[order], np.cumsum(w[order])
    frac = cw / cw[-1]
    if len(v) > points:
        idx = np.unique(np.linspace(0, len(v) - 1, points).astype(int))
        v, frac = v[idx], frac[idx]
    return pd.DataFrame({"value": v, "fraction": frac})


def latency_cdfs(req: pd.DataFrame, steps: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """ECDFs of TTFT, TPOT, E2E over completed requests and ITL over tokens (step durations
    weighted by the decode tokens they produced)."""
    done = req[req["outcome"] == "completed"] if "outcome" in req else req
    out = {m: ecdf(done[f"{m}_s"].to_numpy()) for m in ("ttft", "tpot", "e2e")}
    out["itl"] = ecdf(steps["duration_s"].to_numpy(), steps["decode_tokens"].to_numpy())
    return out


def _step_integral(t, area, vals, x):
    """Integral from ``t[0]`` to each ``x`` of the step function taking ``vals`` from the change points
    ``t`` (the last point closes the final step), given its cumulative ``area`` at those points."""
    i = np.clip(np.searchsorted(t, x, side="right") - 1, 0, len(vals) - 1)
    before = x < t[0]
    res = area[i] + vals[i] * (np.minimum(x, t[-1]) - t[i])
    return np.where(before, 0.0, res)


def link_series(links: pd.DataFrame | None, bins: int = 200, t_end: float | None = None) -> pd.DataFrame:
    """Per link and time bin, the time-weighted mean utilisation (``utilisation``) and the busy share
    of the bin at any rate (``busy``): a few hundred points instead of one per transfer start and end.

    ``links`` holds change points (the rate holds until the link's next point, and the last one
    until ``t_end``, default the last change point of any link)."""
    cols = ["link", "t_s", "utilisation", "busy"]
    if links is None or links.empty:
        return pd.DataFrame(columns=cols)
    t0 = float(links["time_s"].min())
    t1 = float(t_end if t_end is not None else links["time_s"].max())
    if t1 <= t0:
        t1 = t0 + 1e-9
    edges = np.linspace(t0, t1, bins + 1)
    out = []
    for name, g in links.sort_values("time_s", kind="stable").groupby("link", sort=True):
        t = np.append(g["time_s"].to_numpy(dtype=float), t1)
        u = g["utilisation"].to_numpy(dtype=float)
        on = (u > 0).astype(float)
        # integral of the step function from t0 to each edge, through the cumulative area at change points
        area_u = np.concatenate([[0.0], np.cumsum(u * np.diff(t))])
        area_b = np.concatenate([[0.0], np.cumsum(on * np.diff(t))])
        width = np.diff(edges)
        iu, ib = _step_integral(t, area_u, u, edges), _step_integral(t, area_b, on, edges)
        out.append(
            pd.DataFrame(
                {
                    "link": str(name),
                    "t_s": (edges[:-1] + edges[1:]) / 2,
                    "utilisation": np.diff(iu) / width,
                    "busy": np.diff(ib) / width,
                }
            )
        )
    return pd.concat(out, ignore_index=True)[cols]


def throughput_series(req: pd.DataFrame, bins: int = 100) -> pd.DataFrame:
    """Completed requests and output tokens per second over time (by finish time): t_s, requests_per_s,
    output_tokens_per_s."""
    done = req[req["outcome"] == "completed"] if "outcome" in req else req
    cols = ["t_s", "requests_per_s", "output_tokens_per_s"]
    if done.empty:
        return pd.DataFrame(columns=cols)
    t0 = float(req["arrival_s"].min())
    t1 = max(float(done["finish_s"].max()), t0 + 1e-9)
    edges = np.linspace(t0, t1, bins + 1)
    n, _ = np.histogram(done["finish_s"].to_numpy(), edges)
    tok, _ = np.histogram(done["finish_s"].to_numpy(), edges, weights=done["output_tokens"].to_numpy(dtype=float))
    width = np.diff(edges)
    return pd.DataFrame(
        {"t_s": (edges[:-1] + edges[1:]) / 2, "requests_per_s": n / width, "output_tokens_per_s": tok / width}
    )
