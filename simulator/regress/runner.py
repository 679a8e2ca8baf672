"""Run a suite's entries, in parallel across processes, into figure values.

The unit of work is one (entry, seed) of a scenario entry: its replications at
the entry's rate and, if watched, its goodput bisection; or one plan entry: the
whole plan, run in its worker process (the planner's own workers = 1).  Seeds of an entry are averaged in
seed order, so the result does not depend on which process finished first:
the same code, suite and hwdb give the same floats, bit for bit.
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import hwdb
from simulator.plan import PlanRequest
from simulator.regress.figures import PLAN_FIGURES, RUN_FIGURES, SCENARIO_FIGURES
from simulator.regress.suite import LoadedSuite, RegressError, finite
from simulator.regress.suite_schema import E2EEntry, GoodputConfig
from simulator.scenario import Scenario

# figure name -> value; None for a non-finite value (no completed requests, infinite cost per token).
Figures = dict[str, float | str | None]


@dataclass(frozen=True)
class Task:
    """One seed of a scenario entry, or a plan entry; picklable, so it can run in a worker process."""

    entry_id: str
    scenario: Scenario | None
    plan: PlanRequest | None
    seed: int
    replications: int
    rate: float | None
    goodput: GoodputConfig | None
    figures: tuple[str, ...]
    e2e: E2EEntry | None = None


def _run_e2e(entry: E2EEntry, figures: tuple[str, ...]) -> dict[str, float | str]:
    """Validation errors of the entry's fixed subset of measured runs (calibration.e2e.score)."""
    from calibration.e2e import score as e2e  # noqa: PLC0415 - calibration sits above the simulator; loads on an e2e entry
    from calibration.e2e.rows import load_rows  # noqa: PLC0415 - calibration sits above the simulator

    assert entry.table is not None, "load_suite resolves the entry's table"
    rows = [
        r
        for r in load_rows(entry.table)
        if r.backend in entry.engines and (entry.split == "all" or e2e.split(r) == entry.split)
    ][:: entry.sample]
    df = e2e.predict(rows, workers=1)
    ok = e2e.scored(df)
    vals = {
        "ttft_mape": ok["ttft_err"].abs().mean(),
        "tpot_mape": ok["tpot_err"].abs().mean(),
        "ttft_bias": ok["ttft_err"].mean(),
        "tpot_bias": ok["tpot_err"].mean(),
        "rows": float(len(ok)),
    }
    return {name: float(vals[name]) for name in figures}


def run_task(task: Task) -> dict[str, float | str]:
    """The task's figures, each averaged over its replications (plan figures: as the plan reports them)."""
    # The simulator (pandas, SimPy) is imported by the task, so `epdsim --help` starts without it.
    from simulator.goodput import find_goodput, with_rate  # noqa: PLC0415 - pandas and SimPy: not at start-up
    from simulator.run import simulate  # noqa: PLC0415 - pandas and SimPy: not at start-up

    if task.e2e is not None:
        return _run_e2e(task.e2e, task.figures)
    if task.plan is not None:
        from simulator.plan import run_plan  # noqa: PLC0415 - pandas and SimPy: not at start-up

        rec = run_plan(task.plan, workers=1).recommended
        return {name: PLAN_FIGURES[name].value(rec) for name in task.figures}
    assert task.scenario is not None, "a task without an e2e entry or a plan runs a scenario (tasks_for)"
    scn = task.scenario.model_copy(update={"seed": task.seed})
    db = hwdb.load(scn.hwdb)  # once for every run of the task, goodput probes included
    out: dict[str, float | str] = {}
    run_figs = [f for f in task.figures if f in RUN_FIGURES]
    if run_figs:
        at = with_rate(scn, task.rate) if task.rate is not None else scn
        sums = [simulate(at, r, db).summary for r in range(task.replications)]
        for name in run_figs:
            out[name] = math.fsum(float(SCENARIO_FIGURES[name].value(s)) for s in sums) / len(sums)
    if "goodput_rps" in task.figures:
        # the suite refuses goodput_rps without its bounds (ScenarioEntry._goodput_bounds)
        assert task.goodput is not None, "goodput_rps is watched with goodput bounds"
        out["goodput_rps"] = find_goodput(scn, task.goodput.rate_hi, task.goodput.iterations, task.replications, db)
    return out


def _check_folders(extra: tuple[str, ...]) -> None:
    for d in extra:
        if not Path(d).is_dir():
            raise RegressError(
                f"--hwdb {d}: folder does not exist; give a folder with profiles/, gpus/, ... "
                "subfolders (the layout of hwdb/data)"
            )


def tasks_for(loaded: LoadedSuite, extra_hwdb: tuple[str, ...] = ()) -> list[Task]:
    """The suite's work units, with ``extra_hwdb`` folders appended to each entry's (later folders win)."""
    _check_folders(extra_hwdb)
    extra = tuple(str(d) for d in extra_hwdb)
    tasks = []
    for e in loaded.entries:
        figs = tuple(e.tolerances)
        if e.e2e is not None:
            tasks.append(Task(e.id, None, None, 0, 0, None, None, figs, e.e2e))
            continue
        if e.plan is not None:
            req = e.plan.model_copy(update={"hwdb": tuple(e.plan.hwdb) + extra}) if extra else e.plan
            tasks.append(Task(e.id, None, req, 0, 0, None, None, figs))
            continue
        assert e.scenario is not None, "an entry of kind scenario carries its scenario (load_suite)"
        scn = e.scenario.model_copy(update={"hwdb": tuple(e.scenario.hwdb) + extra}) if extra else e.scenario
        tasks += [Task(e.id, scn, None, seed, e.replications, e.rate, e.goodput, figs) for seed in e.seeds]
    return tasks


def default_jobs() -> int:
    """Worker processes: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def run_suite(loaded: LoadedSuite, extra_hwdb: tuple[str, ...] = (), jobs: int | None = None) -> dict[str, Figures]:
    """Every entry's figures, ``{entry id: {figure: value}}``, averaged over seeds.

    ``jobs`` worker processes (default: the usable CPUs); 1 runs in this
    process.  Errors in a scenario (e.g. a profile that no longer fits the
    model) surface as the :class:`~simulator.scenario.ScenarioError` raised
    by the worker.
    """
    tasks = tasks_for(loaded, tuple(extra_hwdb))
    jobs = min(jobs or default_jobs(), len(tasks))
    if jobs <= 1:
        results = [run_task(t) for t in tasks]
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(run_task, tasks))
    out: dict[str, Figures] = {}
    for e in loaded.entries:
        mine = [r for t, r in zip(tasks, results, strict=True) if t.entry_id == e.id]
        out[e.id] = {
            name: mine[0][name]
            if isinstance(mine[0][name], str)
            else finite(math.fsum(float(r[name]) for r in mine) / len(mine))
            for name in e.tolerances
        }
    return out
