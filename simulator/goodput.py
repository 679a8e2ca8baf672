"""Goodput: the highest arrival rate at which a deployment still meets its SLO attainment target.

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


def find_goodput(scn: Scenario, rate_hi: float, iterations: int = 8, replications: int = 1) -> float:
    """Highest rate in (0, rate_hi] whose attainment meets ``scn.slo.attainment`` (0 if none does)."""
    target = scn.slo.attainment
    if attainment(scn, rate_hi, replications) >= target:
        return rate_hi
    lo, hi = 0.0, rate_hi
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if attainment(scn, mid, replications) >= target:
            lo = mid
        else:
            hi = mid
    return lo
