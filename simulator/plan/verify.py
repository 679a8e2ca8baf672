"""Verification of a candidate by the discrete-event simulation: SLO attainment at the target rate
over several seeds (with a confidence interval) and the simulated goodput (bisection over rate), both by
:mod:`simulator.goodput`'s definition judged in steady state (``steady_trim_s`` = a request's lifetime).

:func:`verify_task` is a plain top-level function of a plain dict so that it
runs unchanged in a worker process or a Ray task.  Common random numbers:
replication ``k`` uses the same seed stream at every rate.
"""

from __future__ import annotations

import math

import hwdb
from simulator.goodput import Probe, bisect, probe, probe_meets, with_rate
from simulator.scenario import Scenario


def requests_for(rate: float, lifetime_s: float, minimum: int, span_lifetimes: float = 8.0, cap: int = 50_000) -> int:
    """Requests to simulate at ``rate`` so that arrivals span ``span_lifetimes`` request lifetimes:
    a shorter run never fills the batch and reads optimistic."""
    return int(min(cap, max(minimum, math.ceil(rate * span_lifetimes * lifetime_s))))


def _at(scn: Scenario, rate: float, task: dict) -> Scenario:
    """``scn`` at ``rate``, with enough requests that arrivals span the run length :func:`requests_for` asks."""
    s = with_rate(scn, rate)
    if s.workload.arrival.kind != "trace":
        n = requests_for(rate, task["lifetime_s"], task["min_requests"])
        s = s.model_copy(update={"workload": s.workload.model_copy(update={"num_requests": n, "duration_s": None})})
    return s


def _point(scn: Scenario, rate: float, replications: int, task: dict, db) -> Probe:
    """The goodput probe at ``rate``, judged in steady state (the first and last request lifetime left out)."""
    return probe(_at(scn, rate, task), replications, db, steady_trim_s=task["lifetime_s"])


def verify_task(task: dict) -> dict:
    """Simulate one candidate.  ``task``: id, scenario (a Scenario dumped to JSON-able data), rate
    (target, requests/s), replications, iterations (goodput bisection steps), hint (screen goodput),
    max_rate (search ceiling), lifetime_s (a request's expected lifetime, for run length and warm-up),
    min_requests.  Returns the figures at the target rate and the simulated goodput."""
    scn = Scenario.model_validate(task["scenario"])
    db = hwdb.load(scn.hwdb)  # once per candidate, not once per simulated point
    target, reps = task["rate"], task["replications"]
    at = _point(scn, target, reps, task, db)
    ok = at.meets(scn.slo)
    probes = reps

    def meets(rate: float) -> bool:
        nonlocal probes
        probes += reps
        return probe_meets(_at(scn, rate, task), reps, db, steady_trim_s=task["lifetime_s"])

    capped = False
    if ok:
        lo = target
        hi = min(task["max_rate"], max(1.25 * target, 1.3 * task.get("hint", target)))
        while hi < task["max_rate"] and meets(hi):
            lo, hi = hi, min(task["max_rate"], 2.0 * hi)
        if lo == hi or (hi == task["max_rate"] and lo < hi and meets(hi)):
            lo, capped = hi, True
    else:
        lo, hi = 0.0, target
    if not capped:
        lo = bisect(meets, lo, hi, task["iterations"])
    return {
        "id": task["id"],
        "des_attainment": at.attainment,
        "des_attainment_ci95": at.attainment_ci95,
        "des_ttft_s": at.ttft_s,
        "des_tpot_s": at.tpot_s,
        "des_meets_slo": ok,
        "des_goodput_rps": lo,
        "des_goodput_capped": capped,
        "des_runs": probes,
    }
