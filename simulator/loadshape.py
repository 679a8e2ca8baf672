"""Time-varying load: a Poisson process whose rate follows a shape (arrival kind ``shaped``).

Shapes (rates in requests/s, times in s from the start):

* ``step``: ``before`` until ``at_s``, then ``after``;
* ``ramp``: ``start_rate`` until ``start_s``, linear to ``end_rate`` at ``end_s``, then flat;
* ``diurnal``: ``mean x (1 + amplitude x sin(2 pi (t - phase_s) / period_s))``, ``0 <= amplitude <= 1``;
* ``piecewise``: linear between ``(times_s[i], rates[i])`` points, flat outside them;
* ``trace``: the arrival rate of a trace file (:mod:`simulator.traces`), counted in ``bin_s``
  bins and multiplied by ``scale``, replayed as a piecewise-constant rate (lengths still come from
  ``input_length``/``output_length``).

Arrivals are drawn by thinning (Lewis and Shedler): candidates of a Poisson
process at the shape's maximum rate, each kept with probability
``rate(t) / max``; the result is exactly a non-homogeneous Poisson process.
Only ``rng_arrivals`` is used, so the same seed gives the same times.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, model_validator

from simulator.bounds import MAX_SECONDS, Delay, Duration, Range, Rate, RateOrZero, Share
from simulator.errors import WorkloadError
from simulator.strict_model import StrictModel
from simulator.traces import read_trace


class StepShape(StrictModel):
    kind: Literal["step"] = "step"
    before: RateOrZero
    after: RateOrZero
    at_s: Delay

    def rate(self, t: np.ndarray) -> np.ndarray:
        return np.where(t < self.at_s, self.before, self.after)

    def peak(self) -> float:
        return max(self.before, self.after)


class RampShape(StrictModel):
    kind: Literal["ramp"] = "ramp"
    start_rate: RateOrZero
    end_rate: RateOrZero
    start_s: Delay
    end_s: Duration

    @model_validator(mode="after")
    def _ordered(self) -> RampShape:
        if self.end_s <= self.start_s:
            raise ValueError(f"end_s={self.end_s} must be after start_s={self.start_s}")
        return self

    def rate(self, t: np.ndarray) -> np.ndarray:
        return np.interp(t, [self.start_s, self.end_s], [self.start_rate, self.end_rate])

    def peak(self) -> float:
        return max(self.start_rate, self.end_rate)


class DiurnalShape(StrictModel):
    kind: Literal["diurnal"] = "diurnal"
    mean: Rate
    amplitude: Share
    period_s: Annotated[float, Range(1e-3, MAX_SECONDS, "s", fix="give the period in seconds (a day = 86400)")] = (
        86400.0
    )
    phase_s: Annotated[float, Range(-MAX_SECONDS, MAX_SECONDS, "s", fix="give seconds")] = 0.0

    def rate(self, t: np.ndarray) -> np.ndarray:
        return self.mean * (1.0 + self.amplitude * np.sin(2 * math.pi * (t - self.phase_s) / self.period_s))

    def peak(self) -> float:
        return self.mean * (1.0 + self.amplitude)


class PiecewiseShape(StrictModel):
    kind: Literal["piecewise"] = "piecewise"
    times_s: tuple[Delay, ...] = Field(min_length=1)
    rates: tuple[RateOrZero, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _aligned(self) -> PiecewiseShape:
        if len(self.times_s) != len(self.rates):
            raise ValueError(
                f"times_s has {len(self.times_s)} points but rates has {len(self.rates)}; give one rate per time"
            )
        if any(b <= a for a, b in zip(self.times_s, self.times_s[1:], strict=False)):  # successive pairs
            raise ValueError("times_s must increase strictly")
        return self

    def rate(self, t: np.ndarray) -> np.ndarray:
        return np.interp(t, self.times_s, self.rates)

    def peak(self) -> float:
        return max(self.rates)


class TraceRateShape(StrictModel):
    kind: Literal["trace"] = "trace"
    path: Path
    format: str = "auto"
    # A bin of 1e-300 s would allocate a count per bin: bins are at least a millisecond.
    bin_s: Annotated[float, Range(1e-3, MAX_SECONDS, "s", fix="give the bin width in seconds, e.g. 60")] = 60.0
    scale: Annotated[float, Range(1e-6, 1e6, fix="give the factor on the trace's rate (2 = twice the load)")] = 1.0

    def table(self) -> tuple[np.ndarray, np.ndarray]:
        """(bin start times, rates) of the trace."""
        t = read_trace(self.path, self.format).arrival_s
        t = t - t[0]
        counts = np.bincount((t // self.bin_s).astype(np.int64))
        return np.arange(len(counts)) * self.bin_s, counts / self.bin_s * self.scale


Shape = Annotated[StepShape | RampShape | DiurnalShape | PiecewiseShape | TraceRateShape, Field(discriminator="kind")]


class ShapedArrivals(StrictModel):
    """Open loop, Poisson with a time-varying rate (``shape``); needs ``duration_s``."""

    kind: Literal["shaped"] = "shaped"
    shape: Shape


def shaped_arrivals(
    arrival: ShapedArrivals, duration_s: float | None, num: int | None, rng: np.random.Generator, max_requests: int
) -> np.ndarray:
    """Arrival times (s, from 0, non-decreasing) of ``arrival`` over ``duration_s`` (at most ``num``)."""
    if duration_s is None:
        raise WorkloadError(
            "arrival kind 'shaped' needs duration_s (the shape is a function of time); set workload.duration_s"
        )
    shape = arrival.shape
    if isinstance(shape, TraceRateShape):
        starts, rates = shape.table()

        def rate(t):
            i = np.minimum((t // shape.bin_s).astype(np.int64), len(rates) - 1)
            return rates[i]

        peak = float(rates.max())
    else:
        rate, peak = shape.rate, shape.peak()
    if peak <= 0:
        raise WorkloadError("the load shape's rate is 0 everywhere; give a positive rate")
    expected = peak * duration_s
    if expected > max_requests:
        raise WorkloadError(
            f"peak rate x duration_s = {expected:.3g} candidate arrivals exceeds {max_requests}; "
            "lower duration_s or the rates"
        )
    n = int(expected + 6 * math.sqrt(expected) + 16)
    cand = np.cumsum(rng.exponential(1.0 / peak, n))
    while cand[-1] < duration_s:
        cand = np.concatenate([cand, cand[-1] + np.cumsum(rng.exponential(1.0 / peak, n))])
    cand = cand[cand < duration_s]
    keep = rng.random(len(cand)) * peak < rate(cand)
    t = cand[keep]
    if num is not None:
        t = t[:num]
    if len(t) == 0:
        raise WorkloadError("the load shape produced no arrival within duration_s; raise the rates or duration_s")
    return t
