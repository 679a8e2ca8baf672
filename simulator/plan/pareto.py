"""Pareto front of cost against goodput (and latency) over the candidates."""

from __future__ import annotations

import numpy as np
import pandas as pd


def pareto_mask(cost, goodput, latency=None) -> np.ndarray:
    """True where no other point is at least as good on every objective (cost and latency lower,
    goodput higher) and strictly better on one.  Without ``latency`` the front is cost vs goodput.
    Points with zero goodput are never on the front."""
    cost, goodput = np.asarray(cost, dtype=float), np.asarray(goodput, dtype=float)
    latency = np.zeros_like(cost) if latency is None else np.asarray(latency, dtype=float)
    ok = goodput > 0
    mask = np.zeros(len(cost), dtype=bool)
    idx = np.flatnonzero(ok)
    for i in idx:
        others = idx[idx != i]
        dominated = (
            (cost[others] <= cost[i])
            & (goodput[others] >= goodput[i])
            & (latency[others] <= latency[i])
            & ((cost[others] < cost[i]) | (goodput[others] > goodput[i]) | (latency[others] < latency[i]))
        )
        mask[i] = not dominated.any()
    return mask


def pareto_front(df: pd.DataFrame, latency: bool = False) -> pd.DataFrame:
    """The rows of ``df`` on the cost ($/h) vs goodput front (``latency``: TTFT at the target rate as a
    third objective), cheapest first."""
    if df.empty:
        return df.copy()
    lat = None
    if latency:
        lat = df["ttft_s"].to_numpy(dtype=float)
        lat = np.where(np.isfinite(lat), lat, np.inf)
    m = pareto_mask(df["cost_usd_per_hour"].to_numpy(), df["goodput_rps"].to_numpy(), lat)
    return df[m].sort_values(["cost_usd_per_hour", "goodput_rps"], ascending=[True, False]).reset_index(drop=True)
