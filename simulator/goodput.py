"""Goodput: the highest arrival rate at which a deployment still meets its SLO.

One definition, used by ``epdsim regress``, the examples and the planner's
verification (:mod:`simulator.plan.verify`); ``docs/metrics.md`` states it.

*Which requests are judged* is the only option: the whole run (the default),
or, with ``steady_trim_s`` (the planner passes a request's expected lifetime),
the requests that arrived in steady state: those arriving in the first and
last ``steady_trim_s`` seconds (ramp-up from an empty system, drain) are left
out, unless fewer than half the requests would remain, in which case all are
judged.

*The criterion* (``scenario.slo``) over the judged requests: by default the
share of them that completed with TTFT <= ``ttft_s`` and TPOT <= ``tpot_s``
(a one-token output's NaN TPOT passes) must reach ``attainment``; with
``percentile`` set (e.g. 99, as the published EPD evaluations use), that
percentile (inverted CDF) of TTFT and of TPOT must meet each target.  In both
a rejected or unfinished request is a miss (infinitely late in a percentile).
Over several replications the mean attainment, or the mean of each
percentile, is compared with the target.

Attainment falls as load rises (more queueing), so the goodput is found by
bisection over the rate.  Common random numbers: every probe uses the same
seeds, so arrivals at two rates are the same pattern scaled, which keeps the
attainment curve monotone in practice.

*A probe's verdict alone* (:func:`probe_meets`): the bisection (:func:`find_goodput`, the planner's
:mod:`simulator.plan.verify`) needs only whether a rate meets the SLO, and under the attainment
criterion a run can stop as soon as that is settled.  Every judged request that ends narrows the
attainment the run can still reach: a miss (rejected, or completed late) lowers its best case, a
request within both targets raises its worst case.  The run stops once even a perfect remainder (and
perfect later replications) could not reach the target ("no"), once on the last replication not even
an all-miss remainder could fall short of it ("yes"), or once every judged request has ended (the
requests that arrive later, in the drain window, cannot change them).  :func:`probe_meets` is
``probe(...).meets(slo)`` to the bit: the bounds use the same float operations as :func:`judge` (a share
is ``count / judged``; replications are averaged by ``numpy.mean``, which moves with each term), and a
request is judged when it ends only from figures the requests table will show unchanged.  Where that
cannot be vouched for (operations, which restore re-prefilled requests afterwards; a front end whose
API server loop moves client times; multimodal runs), the runs go to their end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

import hwdb
from simulator.engine.outcome import Outcome
from simulator.run import simulate_requests
from simulator.scenario import SLO, Scenario, ScenarioError


def with_rate(scn: Scenario, rate: float) -> Scenario:
    """``scn`` with its open-loop arrival rate (Poisson, Gamma, or a trace rescaled to ``rate``) set.

    Raises :class:`ScenarioError` for a closed loop, which has no rate to set."""
    arrival = scn.workload.arrival
    if arrival.kind not in ("poisson", "gamma", "trace"):
        raise ScenarioError(f"goodput needs an open-loop poisson, gamma or trace arrival, got kind={arrival.kind!r}")
    update = {"rate": rate}
    if arrival.kind == "trace":
        update["time_scale"] = 1.0  # a trace's rate and time_scale are alternatives; the rate wins
    wl = scn.workload.model_copy(update={"arrival": arrival.model_copy(update=update)})
    return scn.model_copy(update={"workload": wl})


def judged(requests: pd.DataFrame, steady_trim_s: float | None = None) -> np.ndarray:
    """Boolean mask of the requests a probe judges (see the module docstring for the window)."""
    if steady_trim_s is None or not len(requests):
        return np.ones(len(requests), dtype=bool)
    return judged_mask(requests["arrival_s"].to_numpy(), steady_trim_s)


def judged_mask(t: np.ndarray, steady_trim_s: float | None = None) -> np.ndarray:
    """:func:`judged` from the requests' arrival times ``t`` (s) alone."""
    keep = np.ones(len(t), dtype=bool)
    if steady_trim_s is None or not len(t):
        return keep
    steady = (t >= t.min() + steady_trim_s) & (t <= t.max() - steady_trim_s)
    # Too short a run has no steady part worth the name: judge it whole rather than on a handful.
    return steady if steady.sum() >= 0.5 * len(t) else keep


def attainment(requests: pd.DataFrame, slo: SLO, steady_trim_s: float | None = None) -> float:
    """Share of the judged requests that completed within both targets (NaN if none is judged)."""
    keep = judged(requests, steady_trim_s)
    ok = (requests["outcome"] == "completed").to_numpy().copy()
    if slo.ttft_s is not None:
        ok &= requests["ttft_s"].to_numpy() <= slo.ttft_s
    if slo.tpot_s is not None:
        ok &= ~(requests["tpot_s"].to_numpy() > slo.tpot_s)  # NaN (one output token) passes
    return float(ok[keep].mean()) if keep.any() else math.nan


def quantile(slo: SLO) -> float:
    """The quantile latencies are judged (and reported) at: ``percentile`` / 100, else the attainment target."""
    return slo.percentile / 100.0 if slo.percentile is not None else slo.attainment


def latency_quantiles(requests: pd.DataFrame, q: float, steady_trim_s: float | None = None) -> tuple[float, float]:
    """``q``-quantile (inverted CDF) of TTFT and of TPOT over the judged requests; a request that did not
    complete counts as infinitely late, a NaN TPOT (one output token) as 0."""
    keep = judged(requests, steady_trim_s)
    done = (requests["outcome"] == "completed").to_numpy()[keep]
    out = []
    for col in ("ttft_s", "tpot_s"):
        x = np.where(done, np.nan_to_num(requests[col].to_numpy()[keep], nan=0.0), np.inf)
        out.append(float(np.quantile(x, q, method="inverted_cdf")) if len(x) else math.inf)
    return out[0], out[1]


def percentile_slo_met(requests: pd.DataFrame, slo: SLO, steady_trim_s: float | None = None) -> bool:
    """Whether the ``slo.percentile``-th percentile of TTFT and of TPOT of one run meet their targets."""
    if slo.percentile is None:
        raise ValueError("percentile_slo_met needs an SLO with a percentile; judge one without by attainment()")
    ttft, tpot = latency_quantiles(requests, slo.percentile / 100.0, steady_trim_s)
    return (slo.ttft_s is None or ttft <= slo.ttft_s) and (slo.tpot_s is None or tpot <= slo.tpot_s)


@dataclass(frozen=True)
class Probe:
    """One rate's verdict over its replications: mean attainment and its 95% CI half-width (0 for one
    replication), and the mean over replications of the TTFT and TPOT quantiles at :func:`quantile`."""

    attainment: float
    attainment_ci95: float
    ttft_s: float
    tpot_s: float

    def meets(self, slo: SLO) -> bool:
        if slo.percentile is None:
            return self.attainment >= slo.attainment
        return (slo.ttft_s is None or self.ttft_s <= slo.ttft_s) and (slo.tpot_s is None or self.tpot_s <= slo.tpot_s)


def judge(runs: list[pd.DataFrame], slo: SLO, steady_trim_s: float | None = None) -> Probe:
    """The :class:`Probe` of the requests tables of a rate's replications."""
    att = [attainment(r, slo, steady_trim_s) for r in runs]
    lat = [latency_quantiles(r, quantile(slo), steady_trim_s) for r in runs]
    half = 0.0
    if len(att) > 1:
        # Student's t quantile: scipy.stats.t.ppf computes it by this function; scipy.special imports in
        # a third of scipy.stats' time (0.19 vs 0.61 s), which every planner worker pays once.
        from scipy.special import stdtrit  # noqa: PLC0415 - slow to import; only CIs need it

        half = float(stdtrit(len(att) - 1, 0.975) * np.std(att, ddof=1) / math.sqrt(len(att)))
    return Probe(float(np.mean(att)), half, float(np.mean([a for a, _ in lat])), float(np.mean([b for _, b in lat])))


def probe(
    scn: Scenario, replications: int = 1, db: hwdb.HardwareDB | None = None, steady_trim_s: float | None = None
) -> Probe:
    """Simulate ``scn`` (already at the rate to probe) ``replications`` times and judge it.

    ``db``: the loaded ``hwdb.load(scn.hwdb)``; pass it when probing many rates (loading costs ~0.5 s)."""
    db = db if db is not None else hwdb.load(scn.hwdb)
    return judge([simulate_requests(scn, r, db) for r in range(replications)], scn.slo, steady_trim_s)


class Decided(Exception):
    """Raised inside a run once what its probe needs of it is settled: ``verdict`` (True or False) for
    the whole probe, or else (None) this replication's exact attainment ``share``."""

    def __init__(self, verdict: bool | None, share: float = math.nan) -> None:
        super().__init__(verdict, share)
        self.verdict, self.share = verdict, share


def _mean(done: list[float], share: float, rest: float, reps: int) -> float:
    """The mean attainment over ``reps`` replications: those ``done``, the current one at ``share`` and every
    later one at ``rest``, averaged as :func:`judge` averages them."""
    return float(np.mean(done + [share] + [rest] * (reps - len(done) - 1)))


class VerdictWatch:
    """``Recorder.watch`` of one replication: counts the judged requests that end within both targets
    (``ok``) and those that end otherwise (rejected, or late), and raises :class:`Decided` as soon as
    the probe's verdict is settled (even a perfect remainder, and perfect later replications, could not
    reach ``slo.attainment``; or, on the last replication, not even an all-miss remainder could fall short
    of it), else once every judged request has ended (later requests cannot change them)."""

    def __init__(self, rec, keep: list[bool], slo: SLO, done: list[float], reps: int) -> None:
        self.rec, self.keep = rec, keep
        self.n = n = sum(keep)
        self.ok = self.missed = 0
        self.ttft, self.tpot = slo.ttft_s, slo.tpot_s
        target = slo.attainment
        # The fewest misses that fail the probe, and (last replication) the fewest requests within both
        # targets that pass it; n + 1 where no count does.  Both bounds move one way with the count.
        self.fail_at = _first(lambda m: _mean(done, (n - m) / n, 1.0, reps) < target, n)
        last = len(done) == reps - 1
        self.pass_at = _first(lambda k: _mean(done, k / n, 0.0, reps) >= target, n) if last else n + 1

    def __call__(self, rid: int, outcome: Outcome, now: float) -> None:
        if not self.keep[rid]:
            return
        rec = self.rec
        good = False
        if outcome == Outcome.COMPLETED:
            first = rec.t_first[rid]
            # The requests table's ttft_s and tpot_s (results.requests_frame), computed alike.
            if self.ttft is None or first - rec.arrival[rid] <= self.ttft:
                out = rec.output_tokens[rid]
                good = self.tpot is None or out <= 1 or not (now - first) / max(out - 1, 1) > self.tpot
        if good:
            self.ok += 1
            if self.ok >= self.pass_at:
                raise Decided(True)
        else:
            self.missed += 1
            if self.missed >= self.fail_at:
                raise Decided(False)
        if self.ok + self.missed == self.n:
            raise Decided(None, self.ok / self.n)


def _first(holds, n: int) -> int:
    """The least ``k`` in 0..n for which ``holds(k)`` (which, once true, stays true as ``k`` grows); n + 1
    if none."""
    if not holds(n):
        return n + 1
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def watch_for(slo: SLO, steady_trim_s: float | None, done: list[float], reps: int):
    """The ``watch`` argument of :func:`simulate_requests` for the next replication, given the attainments
    of those ``done``: a factory of :class:`VerdictWatch` (None when no request is judged)."""

    def make(rec):
        keep = judged_mask(np.asarray(rec.arrival, dtype=np.float64), steady_trim_s)
        return VerdictWatch(rec, keep.tolist(), slo, done, reps) if keep.any() else None

    return make


def probe_meets(scn: Scenario, replications: int = 1, db=None, steady_trim_s: float | None = None) -> bool:
    """``probe(scn, replications, db, steady_trim_s).meets(scn.slo)``, stopping runs once it is settled."""
    slo = scn.slo
    if slo.percentile is not None:
        return probe(scn, replications, db, steady_trim_s).meets(slo)
    done: list[float] = []
    for r in range(replications):
        try:
            req = simulate_requests(scn, r, db, watch=watch_for(slo, steady_trim_s, done, replications))
            share = attainment(req, slo, steady_trim_s)
        except Decided as d:
            if d.verdict is not None:
                return d.verdict
            share = d.share
        done.append(share)
        if _mean(done[:-1], share, 1.0, replications) < slo.attainment:
            return False
    return float(np.mean(done)) >= slo.attainment


def bisect(meets: Callable[[float], bool], lo: float, hi: float, iterations: int) -> float:
    """Narrow [lo, hi] ``iterations`` times, ``lo`` meeting and ``hi`` failing; returns ``lo``."""
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def find_goodput(
    scn: Scenario,
    rate_hi: float,
    iterations: int = 8,
    replications: int = 1,
    db: hwdb.HardwareDB | None = None,
    steady_trim_s: float | None = None,
) -> float:
    """Highest rate in (0, rate_hi] meeting the scenario's SLO criterion (0 if none does).

    The hardware database is loaded once (or ``db`` used) for every probe."""
    db = db if db is not None else hwdb.load(scn.hwdb)

    def meets(rate: float) -> bool:
        return probe_meets(with_rate(scn, rate), replications, db, steady_trim_s)

    return rate_hi if meets(rate_hi) else bisect(meets, 0.0, rate_hi, iterations)
