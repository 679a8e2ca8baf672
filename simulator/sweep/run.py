"""Running a sweep: each point simulated by the project's executors, its figures as one plain record.

Per point (one simulation, the scenario's seed at every point: common random numbers, so the arrivals
at two rates are the same pattern scaled):

* ``offered_rps``: the arrival rate set (rate sweeps, and open loops with a rate), else the arrivals
  per second measured in the steady window;
* the *steady window* is the span between the 10th and 90th percentile of arrival times: the ramp-up
  from an empty system and the drain after the last arrival are left out.  ``achieved_rps`` and
  ``output_tok_s`` are the requests completed, and their output tokens, per second of that window;
  ``achieved_share`` the completions in the window over the arrivals in it (about 1 while the
  deployment keeps up, the served fraction once it does not); ``goodput_rps`` counts only the
  completions within the SLO's TTFT and TPOT targets (``vllm bench serve``'s request goodput).  A run
  whose requests live long against its arrival span has not reached steady state in the window: its
  completions lag its arrivals and ``achieved_share`` reads low even without overload (the sweep then
  adds a note: raise the requests per point);
* latency percentiles (s) and ``slo_attainment`` are the run's summary over all its requests;
* ``cost_usd_per_hour``: the GPUs at their hwdb price (with autoscaling: billed GPU-hours per hour).

:func:`run_point` is a top-level function of a plain dict, so that it runs unchanged in a worker
process or a Ray task (:mod:`simulator.plan.executors`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

import hwdb
from simulator.plan.executors import default_workers, interrupt_guard, run_local, run_ray
from simulator.run import simulate
from simulator.scenario import Scenario
from simulator.sweep.knee import FACTOR, TOLERANCE, Knee, find_knee
from simulator.sweep.ladder import MAX_EXTENSIONS, extension
from simulator.sweep.points import MAX_POINTS, RATE, Point, check_points, rate_points

if TYPE_CHECKING:
    from simulator.engine.results import Results
    from simulator.summary_types import LatencyKey

WINDOW = (0.1, 0.9)  # the steady window, as quantiles of the arrival times
COLUMNS = (
    "point",
    "knob",
    "value",
    "offered_rps",
    "achieved_rps",
    "achieved_share",
    "output_tok_s",
    "ttft_p50_s",
    "ttft_p90_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p90_s",
    "tpot_p99_s",
    "e2e_p90_s",
    "slo_attainment",
    "goodput_rps",
    "cost_usd_per_hour",
    "completed",
    "rejected",
    "unfinished",
    "sim_s",
)
Progress = Callable[[int, int, str], None]


def steady_figures(req: pd.DataFrame, ttft_slo: float | None, tpot_slo: float | None) -> dict:
    """``achieved_rps``, ``achieved_share``, ``output_tok_s``, ``goodput_rps`` and the window's arrival
    rate ``arrivals_rps`` of a requests table (see the module docstring); NaN without a window."""
    nan = {
        "achieved_rps": math.nan,
        "achieved_share": math.nan,
        "output_tok_s": math.nan,
        "goodput_rps": math.nan,
        "arrivals_rps": math.nan,
    }
    if len(req) < 2:
        return nan
    arrival = req["arrival_s"].to_numpy(dtype=float)
    t0, t1 = np.quantile(arrival, WINDOW)
    span = float(t1 - t0)
    if not span > 0:
        return nan
    finish = req["finish_s"].to_numpy(dtype=float)
    done = (req["outcome"] == "completed").to_numpy() & (finish >= t0) & (finish <= t1)
    good = done.copy()
    if ttft_slo is not None:
        good &= req["ttft_s"].to_numpy(dtype=float) <= ttft_slo
    if tpot_slo is not None:
        good &= ~(req["tpot_s"].to_numpy(dtype=float) > tpot_slo)  # NaN (one output token) passes
    arrived = int(((arrival >= t0) & (arrival <= t1)).sum())
    return {
        "achieved_rps": done.sum() / span,
        "achieved_share": done.sum() / arrived if arrived else math.nan,
        "output_tok_s": float(req["output_tokens"].to_numpy()[done].sum()) / span,
        "goodput_rps": good.sum() / span,
        "arrivals_rps": arrived / span,
    }


def point_figures(res: Results) -> dict:
    """The sweep's figures of one run (:class:`simulator.engine.results.Results`)."""
    s, scn = res.summary, res.scenario
    fig = steady_figures(res.requests, scn.slo.ttft_s, scn.slo.tpot_s)
    arrival = scn.workload.arrival
    rate = getattr(arrival, "rate", None)
    cost = s["cost_usd_per_hour"]
    ops = s.get("operations")
    if ops is not None and ops.get("end_s"):
        cost = ops["cost_usd"] / (ops["end_s"] / 3600.0)
    out = {
        "offered_rps": float(rate) if rate is not None else fig["arrivals_rps"],
        "achieved_rps": fig["achieved_rps"],
        "achieved_share": fig["achieved_share"],
        "output_tok_s": fig["output_tok_s"],
    }
    figures: tuple[tuple[LatencyKey, str], ...] = (("ttft_s", "ttft"), ("tpot_s", "tpot"))
    for key, name in figures:
        for p in ("p50", "p90", "p99"):
            out[f"{name}_{p}_s"] = float(s[key][p])
    out |= {
        "e2e_p90_s": float(s["e2e_s"]["p90"]),
        "slo_attainment": float(s["slo_attainment"]),
        "goodput_rps": fig["goodput_rps"],
        "cost_usd_per_hour": float(cost),
        "completed": int(s["completed"]),
        "rejected": int(s["rejected"]),
        "unfinished": int(s["unfinished"]),
    }
    return out


def run_point(task: dict) -> dict:
    """Simulate one point.  ``task``: point (index), knob, value, scenario (a Scenario dumped to JSON-able
    data), replication.  Returns the point's record (:data:`COLUMNS`)."""
    t = time.perf_counter()
    scn = Scenario.model_validate(task["scenario"])
    res = simulate(scn, task.get("replication", 0), hwdb.load(scn.hwdb))
    return {
        "point": task["point"],
        "knob": task["knob"],
        "value": task["value"],
        **point_figures(res),
        "sim_s": time.perf_counter() - t,
    }


@dataclass
class SweepResult:
    """A finished (or interrupted) sweep: one record per finished point, in point order."""

    name: str
    knob: str  # "rate", or the dotted path of the knob
    rows: list[dict]
    planned: int  # points asked for (an auto ladder's extensions included)
    interrupted: bool = False
    knee: Knee | None = None  # rate sweeps only
    notes: list[str] = field(default_factory=list)
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None

    def frame(self) -> pd.DataFrame:
        """The records as a DataFrame with :data:`COLUMNS` (in that order)."""
        return pd.DataFrame(self.rows, columns=list(COLUMNS))


def run_sweep(
    name: str,
    knob: str,
    points: list[Point],
    scenarios: list[Scenario],
    *,
    workers: int | None = None,
    ray_address: str | None = None,
    progress: Progress | None = None,
    replication: int = 0,
    auto: bool = False,
    db: hwdb.HardwareDB | None = None,
    knee_factor: float = FACTOR,
    knee_tolerance: float = TOLERANCE,
) -> SweepResult:
    """Run every point (``scenarios[i]`` is ``points[i]`` validated, :func:`check_points`) on the local
    ``workers`` (default: the usable cores; 1: here, in turn) or on the Ray cluster at ``ray_address``.

    Ctrl-C keeps the finished points (``interrupted``).  ``auto``: a ``--rates auto`` ladder, extended
    above its top (:func:`simulator.sweep.ladder.extension`) while the top still keeps up.
    ``knee_factor``, ``knee_tolerance``: the knee's rules (:func:`simulator.sweep.knee.find_knee`)."""
    with interrupt_guard():  # a second Ctrl-C waits until the finished points are assembled
        return _sweep(
            name,
            knob,
            points,
            scenarios,
            workers,
            ray_address,
            progress,
            replication,
            auto,
            db,
            (knee_factor, knee_tolerance),
        )


def _sweep(
    name, knob, points, scenarios, workers, ray_address, progress, replication, auto, db, rules: tuple[float, float]
) -> SweepResult:
    progress = progress or (lambda done, total, stage: None)
    done: dict[int, dict] = {}
    planned = list(zip(points, scenarios, strict=True))
    slo = scenarios[0].slo if scenarios else None

    def on_done(rec: dict) -> None:
        done[rec["point"]] = rec
        progress(len(done), len(planned), f"{knob} {rec['value']}")

    def run(batch: list[tuple[int, Point, Scenario]]) -> bool:
        tasks = [
            {
                "point": i,
                "knob": knob,
                "value": p.value,
                "replication": replication,
                "scenario": s.model_dump(mode="json"),
            }
            for i, p, s in batch
        ]
        progress(len(done), len(planned), "starting")
        if ray_address:
            return run_ray(run_point, tasks, ray_address, on_done)
        return run_local(run_point, tasks, workers or default_workers(), on_done)

    interrupted = run([(i, p, s) for i, (p, s) in enumerate(planned)])
    knee = _knee(knob, done, slo, rules)
    result = SweepResult(
        name, knob, [], len(planned), slo_ttft_s=slo.ttft_s if slo else None, slo_tpot_s=slo.tpot_s if slo else None
    )
    for _ in range(MAX_EXTENSIONS if auto and knob == RATE else 0):
        if interrupted or knee is None or knee.reached or len(planned) + len(extension(1.0)) > MAX_POINTS:
            break
        top = max(float(p.value) for p, _ in planned)
        more = rate_points(points[0].data, extension(top), "--rates")
        start = len(planned)
        planned += list(zip(more, check_points(more, "--rates", db), strict=True))
        result.notes.append(
            f"the ladder's top ({top:g} req/s) still kept up: extended to {', '.join(p.label for p in more)} req/s"
        )
        interrupted = run([(start + j, p, s) for j, (p, s) in enumerate(planned[start:])])
        knee = _knee(knob, done, slo, rules)
    result.rows = [done[i] for i in sorted(done)]
    low = result.rows[0] if result.rows else None
    if knee is not None and low is not None and knee.following_rps is None:
        result.notes.append(
            f"even at the lowest rate ({low['offered_rps']:g} req/s) requests completed at only "
            f"{low['achieved_share']:.0%} of the rate they arrived at: if it is not overloaded, the runs are too "
            f"short for requests of this length (E2E p90 {low['e2e_p90_s']:.3g} s); raise --num-requests"
        )
    result.planned, result.interrupted, result.knee = len(planned), interrupted, knee
    if interrupted:
        result.notes.append(
            f"interrupted: {len(done)} of {len(planned)} points finished; the table and files hold those"
        )
    return result


def _knee(knob: str, done: dict[int, dict], slo, rules: tuple[float, float]) -> Knee | None:
    if knob != RATE or not done:
        return None
    return find_knee(list(done.values()), slo.ttft_s if slo else None, *rules)
