"""The scenario's ``workload`` block: how requests arrive and how long their prompts and outputs are.

Validated, frozen pydantic models only (units: seconds, requests per second, tokens); files they name
are read by :func:`simulator.workload.generate`, never here.  See :mod:`simulator.workload` for the
arrival and length kinds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from simulator.bounds import MAX_REQUESTS, MAX_TOKENS, Delay, Duration, Range, Rate, Requests, Tokens
from simulator.epd.epd_config import ImageWorkload
from simulator.loadshape import ShapedArrivals
from simulator.strict_model import StrictModel
from simulator.traces import TraceFormat

# Mean client-side delay before each closed-loop send (s): 0 as in vllm bench serve's asyncio loop; a
# few milliseconds of client delay changed no validation figure (docs/validation/e2e.md).
CLIENT_SEND_DELAY_S = 0.0


# ---------------------------------------------------------------- lengths


class FixedLength(StrictModel):
    """Every request has ``value`` tokens."""

    kind: Literal["fixed"] = "fixed"
    value: Tokens


class UniformLength(StrictModel):
    """Integer lengths uniform on [low, high], both inclusive (tokens)."""

    kind: Literal["uniform"] = "uniform"
    low: Tokens
    high: Tokens

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.low > self.high:
            raise ValueError(f"low={self.low} exceeds high={self.high}; make low <= high")
        return self


class LognormalLength(StrictModel):
    """Lognormal lengths given by the ``mean`` (tokens) and ``cv`` (std/mean) before rounding.

    Underlying normal: sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2/2.
    Samples are rounded to the nearest integer and clipped to [low, high]
    (high=None: no upper clip), so the realised mean moves slightly when the
    clip bites.
    """

    kind: Literal["lognormal"] = "lognormal"
    mean: Annotated[float, Range(1, MAX_TOKENS, "tokens")]
    cv: Annotated[float, Range(0, 100, lo_open=True, fix="give the standard deviation over the mean, e.g. 0.5")]
    low: Tokens = 1
    high: Tokens | None = None

    @model_validator(mode="after")
    def _ordered(self) -> LognormalLength:
        if self.high is not None and self.low > self.high:
            raise ValueError(f"low={self.low} exceeds high={self.high}; make low <= high")
        return self


class EmpiricalLength(StrictModel):
    """Resample observed lengths with replacement: ``values``, or ``column`` of a CSV/JSONL ``path``."""

    kind: Literal["empirical"] = "empirical"
    path: Path | None = None
    column: str | None = None
    values: tuple[Tokens, ...] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_source(self) -> EmpiricalLength:
        if (self.path is None) == (self.values is None):
            raise ValueError("give exactly one of path (with column) or values")
        if self.path is not None and self.column is None:
            raise ValueError("column is required with path; name the column holding token counts")
        if self.values is not None and self.column is not None:
            raise ValueError("column only applies with path; remove it or give path instead of values")
        return self


class LengthPairs(StrictModel):
    """Resample whole rows of ``path`` (CSV/JSONL), keeping each (input, output) pair together."""

    kind: Literal["pairs"] = "pairs"
    path: Path
    input_column: str
    output_column: str


LengthDist = Annotated[FixedLength | UniformLength | LognormalLength | EmpiricalLength, Field(discriminator="kind")]


# ---------------------------------------------------------------- arrivals


class Poisson(StrictModel):
    """Open loop, exponential inter-arrival gaps; ``rate`` in requests/s."""

    kind: Literal["poisson"] = "poisson"
    rate: Rate


class Gamma(StrictModel):
    """Open loop, gamma gaps with mean 1/``rate`` s and coefficient of variation ``cv``.

    Shape k = 1/cv^2, scale = cv^2/rate.  cv = 1 is Poisson; cv > 1 is burstier.
    """

    kind: Literal["gamma"] = "gamma"
    rate: Rate
    cv: Annotated[float, Range(1e-3, 100, fix="give the gaps' standard deviation over their mean (1: Poisson)")]


class TraceArrivals(StrictModel):
    """Replay a trace file (see :mod:`simulator.traces`), which also supplies lengths.

    Timestamps are multiplied by ``time_scale`` (2.0 = half the rate), or,
    with ``rate`` set, rescaled so that (n - 1) / (last - first arrival)
    equals ``rate`` over the requests replayed.  ``limit`` reads at most that
    many rows of the file; so does the workload's ``num_requests`` (the first
    rows of the file, sorted by arrival after reading, are replayed).
    """

    kind: Literal["trace"] = "trace"
    path: Path
    format: TraceFormat = "auto"
    time_scale: Annotated[
        float, Range(1e-9, 1e9, fix="give the factor on the trace's timestamps (2 = half the rate)")
    ] = 1.0
    rate: Rate | None = None
    limit: Requests | None = None

    @model_validator(mode="after")
    def _one_scaling(self) -> TraceArrivals:
        if self.rate is not None and self.time_scale != 1.0:
            raise ValueError("give either time_scale or rate, not both")
        return self


class ClosedLoop(StrictModel):
    """``concurrency`` users, each sending its next request ``think_time_s`` after a reply.

    As benchmark clients run it (``vllm bench serve --max-concurrency N --request-rate inf``, aiperf
    concurrency mode): all users send their first request at once unless ``ramp_up_s`` spreads those
    first sends evenly over that window; ``send_delay_s`` is the mean of an exponential client-side
    delay before each send (0: the next request leaves the moment a reply ends); the first
    ``warmup_requests`` requests are served but left out of the reported latency figures (the
    ``warmup`` column).  What desynchronises real benchmark users is their length spread (the
    ``random`` dataset's range ratio: give uniform lengths), not the client delay: with fixed lengths
    the users that one prefill step admitted finish in one step and re-send together, which real
    engines do too (docs/validation/e2e.md).
    """

    kind: Literal["closed"] = "closed"
    concurrency: Annotated[int, Range(1, MAX_REQUESTS, "users", whole=True)]
    think_time_s: Delay = 0.0
    send_delay_s: Annotated[float, Range(0, 60, "s", fix="give seconds (0: send at once)")] = CLIENT_SEND_DELAY_S
    ramp_up_s: Annotated[float, Range(0, 3600, "s", fix="give seconds (0: all users start at once)")] = 0.0
    warmup_requests: Annotated[int, Range(0, MAX_REQUESTS, "requests", whole=True)] = 0


Arrival = Annotated[Poisson | Gamma | TraceArrivals | ClosedLoop | ShapedArrivals, Field(discriminator="kind")]


class WorkloadConfig(StrictModel):
    """A workload: arrivals plus lengths, and how many requests or for how long.

    Lengths come from ``lengths`` (joint pairs) or from ``input_length`` and
    ``output_length``.  A trace supplies both; either may still be given to
    override the trace's own (overriding input drops the prefix hashes).
    ``num_requests``: requests to generate (closed loop: requests the users
    send in total); optional for a trace (default: all rows).  ``duration_s``:
    open loop keeps arrivals before it; a closed loop carries it for the
    engine.  Open loop needs at least one of the two.
    """

    arrival: Arrival
    input_length: LengthDist | None = None
    output_length: LengthDist | None = None
    lengths: LengthPairs | None = None
    num_requests: Requests | None = None
    duration_s: Duration | None = None
    images: ImageWorkload | None = None  # multimodal: images per request (simulator.epd.multimodal)

    @model_validator(mode="after")
    def _complete(self) -> WorkloadConfig:
        kind = self.arrival.kind
        split = self.input_length is not None or self.output_length is not None
        if self.lengths is not None and split:
            raise ValueError("give either lengths (pairs) or input_length/output_length, not both")
        if kind != "trace" and self.lengths is None and (self.input_length is None or self.output_length is None):
            raise ValueError(
                f"arrival kind {kind!r} needs lengths: give input_length and output_length "
                f"(e.g. {{kind: fixed, value: 512}}) or lengths {{kind: pairs, ...}}"
            )
        if kind == "closed" and self.num_requests is None:
            raise ValueError("a closed loop needs num_requests (total requests the users send)")
        if kind in ("poisson", "gamma") and self.num_requests is None and self.duration_s is None:
            raise ValueError(f"arrival kind {kind!r} needs num_requests, duration_s or both")
        return self
