"""Goodput: the highest arrival rate at which a deployment still meets its SLO.

Two criteria (``scenario.slo``): by default the fraction of requests meeting
both the TTFT and the TPOT target must reach ``attainment``; with
``percentile`` set (e.g. 99, as the published EPD evaluations use: P99 TTFT
and P99 TPOT under their targets), that percentile of each must meet its
target over all requests, a rejected or unfinished request counting as a miss.

Attainment falls as load rises (more queueing), so the goodput is found by
bisection over the Poisson/Gamma rate.  Common random numbers: every probe
uses the same seed, so arrivals at two rates are the same pattern scaled,
which keeps the attainment curve monotone in practice.
"""
from __future__ import annotations

from simulator.run import simulate
from simulator.scenario import Scenario, ScenarioError


def with_rate(scn: Scenario, rate: float) -> Scenario:
    arrival = scn.workload.arrival
    if arrival.kind not in ("poisson", "gamma"):
        raise ScenarioError(f"goodput needs an open-loop poisson or gamma arrival, got kind={arrival.kind!r}")
    wl = scn.workload.model_copy(update={"arrival": arrival.model_copy(update={"rate": rate})})
    return scn.model_copy(update={"workload": wl})


def attainment(scn: Scenario, rate: float, replications: int = 1) -> float:
    """Mean SLO attainment over ``replications`` runs at ``rate`` requests/s."""
    s = with_rate(scn, rate)
    return sum(simulate(s, r).summary["slo_attainment"] for r in range(replications)) / replications


def percentile_slo_met(requests, slo) -> bool:
    """Whether the ``slo.percentile``-th percentile of TTFT and of TPOT meet their targets.

    Percentiles are over every request (inverted CDF); requests that did not
    complete count as infinitely late, and a NaN TPOT (one output token) as 0.
    """
    import numpy as np
    done = (requests["outcome"] == "completed").to_numpy()
    q = slo.percentile / 100.0
    for col, target in (("ttft_s", slo.ttft_s), ("tpot_s", slo.tpot_s)):
        if target is None:
            continue
        x = np.where(done, np.nan_to_num(requests[col].to_numpy(), nan=0.0), np.inf)
        if len(x) and np.quantile(x, q, method="inverted_cdf") > target:
            return False
    return True


def meets(scn: Scenario, rate: float, replications: int = 1) -> bool:
    """Whether ``scn`` at ``rate`` requests/s meets its SLO criterion (every replication, for percentiles)."""
    if scn.slo.percentile is None:
        return attainment(scn, rate, replications) >= scn.slo.attainment
    s = with_rate(scn, rate)
    return all(percentile_slo_met(simulate(s, r).requests, scn.slo) for r in range(replications))


def find_goodput(scn: Scenario, rate_hi: float, iterations: int = 8, replications: int = 1) -> float:
    """Highest rate in (0, rate_hi] meeting the scenario's SLO criterion (0 if none does)."""
    if meets(scn, rate_hi, replications):
        return rate_hi
    lo, hi = 0.0, rate_hi
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if meets(scn, mid, replications):
            lo = mid
        else:
            hi = mid
    return lo
