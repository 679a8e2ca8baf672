"""An operations run (autoscaling, crashes, retries) reshaped for charts and cards (pure pandas).

Reads ``summary["operations"]`` of a run (see :mod:`simulator.engine.opsresults` for the definitions) and
its requests table; runs without operations have no such key and get None or empty frames.
Times are seconds from the start of the run; GPU time is billed as the simulator bills it: from
the node's provisioning (the initial instances from 0) to removal, crash or the end of the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

import hwdb

if TYPE_CHECKING:
    from simulator.engine.results import Results
    from simulator.summary_types import OperationsSummary


def ops(res: Results) -> OperationsSummary | None:
    """The run's operations summary, or None for a run without operations."""
    return res.summary.get("operations")


def _lives(o: OperationsSummary) -> list[dict]:
    end = float(o["end_s"])
    out = []
    for life in o["instances"]:
        t1 = min(float(life["ended_s"]) if life["ended_s"] is not None else end, end)
        t0 = min(float(life["billed_s"]), t1)
        ready = life["ready_s"]
        out.append({**life, "t0": t0, "t1": t1, "up": None if ready is None else min(float(ready), t1)})
    return out


def instances_series(o: OperationsSummary) -> pd.DataFrame:
    """Per pool, instance counts as step functions: columns pool, t_s, serving (ready and not yet ended),
    billed (provisioned or starting or serving; what is paid for).  One row per change point, the last
    at the end of the run; each count holds until the pool's next row."""
    cols = ["pool", "t_s", "serving", "billed"]
    if not o or not o["instances"]:
        return pd.DataFrame(columns=cols)
    end = float(o["end_s"])
    frames = []
    lives = _lives(o)
    for pool in dict.fromkeys(life["pool"] for life in lives):
        ev = []
        for life in (x for x in lives if x["pool"] == pool):
            gone = life["t1"] < end  # still there at the end: the count holds to the last row
            ev += [(life["t0"], 0, 1)] + [(life["t1"], 0, -1)] * gone
            if life["up"] is not None and life["up"] < life["t1"]:
                ev += [(life["up"], 1, 0)] + [(life["t1"], -1, 0)] * gone
        ev.sort(key=lambda e: e[0])
        t = np.array([e[0] for e in ev] + [end])
        serving = np.cumsum([e[1] for e in ev] + [0])
        billed = np.cumsum([e[2] for e in ev] + [0])
        df = pd.DataFrame({"pool": pool, "t_s": t, "serving": serving, "billed": billed})
        # several changes at one instant: the count after all of them
        frames.append(df.groupby("t_s", as_index=False, sort=True).last()[cols])
    return pd.concat(frames, ignore_index=True)


def events_frame(o: OperationsSummary) -> pd.DataFrame:
    """Scale-ups, scale-downs and crashes in time order: time_s, pool, event, count, detail."""
    cols = ["time_s", "pool", "event", "count", "detail"]
    if not o:
        return pd.DataFrame(columns=cols)
    rows = [
        {"time_s": e["time_s"], "pool": e["pool"], "event": e["action"], "count": e["count"], "detail": e["why"]}
        for e in o["events"]
    ]
    rows += [
        {
            "time_s": c["time_s"],
            "pool": c["pool"],
            "event": "crash",
            "count": 1,
            "detail": f"#{c['instance']} {c['kind']}: {c['reason']} ({c['requests']} requests affected)",
        }
        for c in o["crash_log"]
    ]
    return pd.DataFrame(rows, columns=cols).sort_values("time_s", kind="stable").reset_index(drop=True)


def failures_series(req: pd.DataFrame, bins: int = 60) -> pd.DataFrame:
    """Requests by arrival time bin: t_s (bin centre), failed, retried (sent again at least once),
    rejected; counts per bin."""
    cols = ["t_s", "failed", "retried", "rejected"]
    if req.empty:
        return pd.DataFrame(columns=cols)
    t = req["arrival_s"].to_numpy(dtype=float)
    edges = np.linspace(float(t.min()), max(float(t.max()), float(t.min()) + 1e-9), bins + 1)
    out = req["outcome"].astype(str).to_numpy()
    retried = (req["retries"].to_numpy() > 0) if "retries" in req else np.zeros(len(req), bool)
    count = lambda mask: np.histogram(t[mask], edges)[0]  # noqa: E731 - a one-line local helper
    return pd.DataFrame(
        {
            "t_s": (edges[:-1] + edges[1:]) / 2,
            "failed": count(out == "failed"),
            "retried": count(retried),
            "rejected": count(out == "rejected"),
        }
    )


def pool_prices(res: Results, prices=None, db=None) -> dict[str, float]:
    """$ per GPU-hour of each pool (by pool name): the override in ``prices`` for its GPU, else the
    hwdb list price."""
    out = {}
    for p in res.info["pools"]:
        over = prices.get(p["gpu"]) if prices is not None else None
        if over is None:
            db = db or hwdb.load(res.scenario.hwdb)
            over = db.gpu(p["gpu"]).price_usd_per_hour.value
        out[p["name"]] = float(over)
    return out


def gpu_seconds(o: OperationsSummary) -> dict[str, float]:
    """Billed GPU-seconds per pool (sums to ``gpu_hours`` x 3600)."""
    out: dict[str, float] = {}
    for life in _lives(o):
        out[life["pool"]] = out.get(life["pool"], 0.0) + life["gpus"] * (life["t1"] - life["t0"])
    return out


def cost_series(o: OperationsSummary, price: dict[str, float], points: int = 200) -> pd.DataFrame:
    """Cumulative cost and billed GPUs over the run: t_s, gpus (billed at t), cost_usd (paid up to t)."""
    cols = ["t_s", "gpus", "cost_usd"]
    if not o or not o["instances"]:
        return pd.DataFrame(columns=cols)
    end = float(o["end_s"])
    t = np.linspace(0.0, end, points)
    gpus = np.zeros_like(t)
    cost = np.zeros_like(t)
    for life in _lives(o):
        g, p = life["gpus"], price[life["pool"]]
        gpus += g * ((t >= life["t0"]) & ((t < life["t1"]) | (life["t1"] >= end)))
        cost += g * p / 3600.0 * np.clip(t - life["t0"], 0.0, life["t1"] - life["t0"])
    return pd.DataFrame({"t_s": t, "gpus": gpus, "cost_usd": cost})


def ops_cost(res: Results, prices=None, db=None) -> dict | None:
    """Cost of an operations run with its scaling: total $, GPU-hours, the mean $/h over the run and $
    per million output tokens; None for a run without operations.  With no overrides the total is the
    simulator's own ``cost_usd``."""
    o = ops(res)
    if o is None:
        return None
    price = pool_prices(res, prices, db)
    gs = gpu_seconds(o)
    usd = sum(s / 3600.0 * price[p] for p, s in gs.items())
    hours = float(o["end_s"]) / 3600.0
    s = res.summary
    tokens = s["output_tokens_per_s"] * s["duration_s"]
    total = s["total_tokens_per_s"] * s["duration_s"]
    return {
        "usd": usd,
        "gpu_hours": sum(gs.values()) / 3600.0,
        "hours": hours,
        "usd_per_hour": usd / hours if hours > 0 else float("nan"),
        "usd_per_million_output_tokens": usd / tokens * 1e6 if tokens > 0 else float("inf"),
        "usd_per_million_total_tokens": usd / total * 1e6 if total > 0 else float("inf"),
    }
