"""Verification of a candidate by the discrete-event simulation: SLO attainment at the target rate
over several seeds (with a confidence interval) and the simulated goodput (bisection over rate).

:func:`verify_task` is a plain top-level function of a plain dict so that it
runs unchanged in a worker process or a Ray task.  Common random numbers:
replication ``k`` uses the same seed stream at every rate.
"""
from __future__ import annotations

import math

import numpy as np

import hwdb

from simulator.run import simulate
from simulator.scenario import Scenario


def with_rate(scn: Scenario, rate: float) -> Scenario:
    """``scn`` with its open-loop arrival rate (Poisson, Gamma, or a rescaled trace) set to ``rate``."""
    arrival = scn.workload.arrival
    update = {"rate": rate}
    if arrival.kind == "trace":
        update["time_scale"] = 1.0
    wl = scn.workload.model_copy(update={"arrival": arrival.model_copy(update=update)})
    return scn.model_copy(update={"workload": wl})


def steady_attainment(res, slo, trim_s: float) -> float:
    """SLO attainment over the requests that arrived in steady state: those arriving in the first and
    last ``trim_s`` seconds (ramp-up from an empty system, drain) are left out when at least half of
    the run remains; rejected and unfinished requests count as misses."""
    req = res.requests
    t = req["arrival_s"].to_numpy()
    keep = (t >= t.min() + trim_s) & (t <= t.max() - trim_s)
    if keep.sum() < 0.5 * len(t):
        keep = np.ones(len(t), dtype=bool)
    ok = (req["outcome"] == "completed").to_numpy().copy()
    if slo.ttft_s is not None:
        ok &= req["ttft_s"].to_numpy() <= slo.ttft_s
    if slo.tpot_s is not None:
        ok &= ~(req["tpot_s"].to_numpy() > slo.tpot_s)     # NaN (one output token) passes
    return float(ok[keep].mean())


def requests_for(rate: float, lifetime_s: float, minimum: int, span_lifetimes: float = 8.0,
                 cap: int = 50_000) -> int:
    """Requests to simulate at ``rate`` so that arrivals span ``span_lifetimes`` request lifetimes:
    a shorter run never fills the batch and reads optimistic."""
    return int(min(cap, max(minimum, math.ceil(rate * span_lifetimes * lifetime_s))))


def _point(scn: Scenario, rate: float, replications: int, task: dict, db) -> dict:
    """Steady-state attainment (mean and 95% CI half-width over replications) and latency percentiles."""
    q = quantile(scn.slo)
    att, ttft, tpot = [], [], []
    s = with_rate(scn, rate)
    if s.workload.arrival.kind != "trace":
        n = requests_for(rate, task["lifetime_s"], task["min_requests"])
        s = s.model_copy(update={"workload": s.workload.model_copy(update={"num_requests": n, "duration_s": None})})
    for r in range(replications):
        res = simulate(s, r, db)
        att.append(steady_attainment(res, scn.slo, task["lifetime_s"]))
        done = res.requests[res.requests["outcome"] == "completed"]
        t1 = done["ttft_s"].to_numpy()
        t2 = done["tpot_s"].to_numpy()
        t2 = t2[~np.isnan(t2)]
        ttft.append(float(np.quantile(t1, q)) if len(t1) else math.inf)
        tpot.append(float(np.quantile(t2, q)) if len(t2) else 0.0)
    mean = float(np.mean(att))
    half = 0.0
    if replications > 1:
        from scipy.stats import t as student
        half = float(student.ppf(0.975, replications - 1) * np.std(att, ddof=1) / math.sqrt(replications))
    return {"attainment": mean, "attainment_ci95": half, "ttft_s": float(np.mean(ttft)), "tpot_s": float(np.mean(tpot))}


def quantile(slo) -> float:
    """The quantile the SLO is judged at: ``percentile`` / 100 when set, else the attainment target."""
    return slo.percentile / 100.0 if slo.percentile is not None else slo.attainment


def _meets(point: dict, slo) -> bool:
    """Attainment mode: the share of requests meeting both targets reaches ``slo.attainment``.
    Percentile mode (``slo.percentile``): that percentile of TTFT and of TPOT meet the targets."""
    if slo.percentile is None:
        return point["attainment"] >= slo.attainment
    return ((slo.ttft_s is None or point["ttft_s"] <= slo.ttft_s)
            and (slo.tpot_s is None or point["tpot_s"] <= slo.tpot_s))


def verify_task(task: dict) -> dict:
    """Simulate one candidate.  ``task``: id, scenario (a Scenario dumped to JSON-able data), rate
    (target, requests/s), replications, iterations (goodput bisection steps), hint (screen goodput),
    max_rate (search ceiling), lifetime_s (a request's expected lifetime, for run length and warm-up),
    min_requests.  Returns the figures at the target rate and the simulated goodput."""
    scn = Scenario.model_validate(task["scenario"])
    db = hwdb.load(scn.hwdb)           # once per candidate, not once per simulated point
    target, reps = task["rate"], task["replications"]
    at = _point(scn, target, reps, task, db)
    ok = _meets(at, scn.slo)
    probes = reps

    def meets(rate: float) -> bool:
        nonlocal probes
        probes += reps
        return _meets(_point(scn, rate, reps, task, db), scn.slo)

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
        for _ in range(task["iterations"]):
            mid = 0.5 * (lo + hi)
            if meets(mid):
                lo = mid
            else:
                hi = mid
    return {"id": task["id"], "des_attainment": at["attainment"], "des_attainment_ci95": at["attainment_ci95"],
            "des_ttft_s": at["ttft_s"], "des_tpot_s": at["tpot_s"], "des_meets_slo": ok,
            "des_goodput_rps": lo, "des_goodput_capped": capped, "des_runs": probes}
