"""The knee of a rate sweep: the highest offered rate the deployment still serves well.

Two rules over the points in ascending offered rate, each stopping at its first failure (a point that
passes above a failing one does not count: noise, or a run too short to fill the queue):

* latency: the TTFT p90 stays within ``factor`` (default 3) times its value at the lowest offered
  rate and, when the scenario's SLO sets a TTFT target, within that target too;
* throughput: the deployment keeps up: requests complete at no less than ``1 - tolerance`` (default
  90%) of the rate they arrive at, both counted in the steady window between the 10th and 90th
  percentile of arrival times (``achieved_share``; see :mod:`simulator.sweep.run`).  The first rate
  where they do not is the *saturation* point: achieved throughput stops following the offered rate
  there.

The knee is the highest rate that passes both; None when even the lowest rate fails.  When the highest
rate still passes, the knee is not reached (``reached`` False): the ladder must go higher.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

FACTOR = 3.0  # TTFT p90 may grow to this multiple of its low-load value
TOLERANCE = 0.1  # how far the completion rate may fall below the arrival rate, as a share of it


@dataclass(frozen=True)
class Knee:
    """The knee of a rate sweep (rates in req/s, latencies in s); None where a rule found no such rate."""

    rate_rps: float | None  # highest offered rate passing both rules
    latency_rps: float | None  # highest offered rate passing the latency rule
    following_rps: float | None  # highest offered rate passing the throughput rule
    saturation_rps: float | None  # first offered rate where achieved throughput stops following
    baseline_ttft_p90_s: float  # TTFT p90 at the lowest offered rate
    limit_ttft_p90_s: float  # the latency rule's bound
    highest_rps: float  # the highest offered rate swept
    reached: bool  # some rate fails a rule (else the ladder never got past the knee)
    rule: str  # the rules in words, with their figures

    def as_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        """One paragraph for the terminal and the reports."""
        if self.rate_rps is None:
            return f"no knee: even the lowest offered rate fails ({self.rule})"
        head = f"knee at {self.rate_rps:g} req/s offered"
        if not self.reached:
            return (
                f"{head} or higher: every point passes ({self.rule}); the knee lies above the highest rate: "
                f"raise the rates"
            )
        sat = (
            f"; achieved throughput stops following the offered rate at {self.saturation_rps:g} req/s"
            if self.saturation_rps is not None
            else "; achieved throughput follows the offered rate throughout"
        )
        lat = (
            "; TTFT p90 is out of bounds from the lowest rate"
            if self.latency_rps is None
            else f"; TTFT p90 leaves its bound above {self.latency_rps:g} req/s"
            if self.latency_rps < self.highest_rps
            else "; TTFT p90 stays within its bound throughout"
        )
        return f"{head} ({self.rule}){lat}{sat}"


def _leading(rows: list[dict], ok) -> float | None:
    """The offered rate of the last row of the leading run of rows that pass ``ok``."""
    last = None
    for r in rows:
        if not ok(r):
            break
        last = r["offered_rps"]
    return last


def find_knee(
    rows: list[dict], slo_ttft_s: float | None = None, factor: float = FACTOR, tolerance: float = TOLERANCE
) -> Knee | None:
    """The knee of a rate sweep's ``rows`` (each with ``offered_rps``, ``ttft_p90_s``, ``achieved_share``);
    None for fewer than one finished point."""
    rows = sorted((r for r in rows if r.get("offered_rps") is not None), key=lambda r: r["offered_rps"])
    if not rows:
        return None
    base = rows[0]["ttft_p90_s"]
    limit = factor * base if math.isfinite(base) else math.nan
    slo = f" and within the SLO's {slo_ttft_s * 1e3:g} ms" if slo_ttft_s else ""
    if slo_ttft_s:
        limit = min(limit, slo_ttft_s) if math.isfinite(limit) else slo_ttft_s
    rule = (
        f"TTFT p90 <= {factor:g}x its {base * 1e3:.4g} ms at {rows[0]['offered_rps']:g} req/s{slo}, i.e. "
        f"<= {limit * 1e3:.4g} ms; and requests complete at >= {1 - tolerance:.0%} of the rate they arrive at"
    )

    def latency_ok(r: dict) -> bool:
        return math.isfinite(r["ttft_p90_s"]) and r["ttft_p90_s"] <= limit

    def follows(r: dict) -> bool:
        return math.isfinite(r["achieved_share"]) and r["achieved_share"] >= 1.0 - tolerance

    lat, fol = _leading(rows, latency_ok), _leading(rows, follows)
    both = _leading(rows, lambda r: latency_ok(r) and follows(r))
    sat = next((r["offered_rps"] for r in rows if not follows(r)), None)
    reached = both != rows[-1]["offered_rps"]
    return Knee(both, lat, fol, sat, base, limit, rows[-1]["offered_rps"], reached, rule)
