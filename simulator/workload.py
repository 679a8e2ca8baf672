"""Workload configuration and request generation.

A :class:`WorkloadConfig` describes how requests arrive and how long their
prompts and outputs are; :func:`generate` turns it into :class:`Requests`,
plain numpy arrays ready for the engine.

Units: times in seconds, rates in requests per second, lengths in tokens.

Arrivals
    ``poisson`` (exponential gaps), ``gamma`` (gamma gaps with a given
    coefficient of variation; cv = 1 is Poisson, cv > 1 burstier; vLLM's
    ``--burstiness`` is 1/cv^2), ``trace`` (replay a file, which also supplies
    lengths and prefix hashes) and ``closed`` (N concurrent users, as
    ``vllm bench serve --max-concurrency``); ``shaped`` (Poisson with a
    time-varying rate: step, ramp, diurnal, piecewise, a trace's rate;
    :mod:`simulator.loadshape`).
Lengths
    ``fixed``, ``uniform`` (integers, both ends inclusive), ``lognormal``
    (mean and cv of the unclipped distribution, rounded then clipped),
    ``empirical`` (resample observed values) and ``pairs`` (resample
    (input, output) rows jointly, e.g. ShareGPT, whose lengths correlate).

Randomness: arrivals draw only from ``rng_arrivals`` and lengths only from
``rng_lengths``, so changing a length distribution never moves arrival times.
The same config and generator states give byte-identical arrays.  Files named
in a config are read by :func:`generate`, never by the config models.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from simulator.epd.epd_config import ImageWorkload
from simulator.errors import WorkloadError
from simulator.inputs import NoBoolNumbers
from simulator.loadshape import ShapedArrivals, shaped_arrivals
from simulator.traces import Role, Trace, TraceFormat, read_token_columns, read_trace

MAX_REQUESTS = 50_000_000
"""Upper bound on requests one workload may generate (about 2 GB of arrays)."""
MAX_TOKENS = 10_000_000        # longest prompt or output one request may have (tokens)
MIN_RATE, MAX_RATE = 1e-6, 1e7  # requests/s: one a fortnight .. ten million a second
MAX_SECONDS = 1e9              # durations and times: about 30 years
# Mean client-side delay before each closed-loop send (s): 0 as in vllm bench serve's asyncio loop; a
# few milliseconds of client delay changed no validation figure (docs/validation/e2e.md).
CLIENT_SEND_DELAY_S = 0.0


class _Frozen(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ---------------------------------------------------------------- lengths

class FixedLength(_Frozen):
    """Every request has ``value`` tokens."""

    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, le=MAX_TOKENS, description="tokens")


class UniformLength(_Frozen):
    """Integer lengths uniform on [low, high], both inclusive (tokens)."""

    kind: Literal["uniform"] = "uniform"
    low: int = Field(ge=1, le=MAX_TOKENS)
    high: int = Field(ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.low > self.high:
            raise ValueError(f"low={self.low} exceeds high={self.high}; make low <= high")
        return self


class LognormalLength(_Frozen):
    """Lognormal lengths given by the ``mean`` (tokens) and ``cv`` (std/mean) before rounding.

    Underlying normal: sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2/2.
    Samples are rounded to the nearest integer and clipped to [low, high]
    (high=None: no upper clip), so the realised mean moves slightly when the
    clip bites.
    """

    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(ge=1, le=MAX_TOKENS)
    cv: float = Field(gt=0, le=100)
    low: int = Field(1, ge=1, le=MAX_TOKENS)
    high: int | None = Field(None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _ordered(self) -> LognormalLength:
        if self.high is not None and self.low > self.high:
            raise ValueError(f"low={self.low} exceeds high={self.high}; make low <= high")
        return self


class EmpiricalLength(_Frozen):
    """Resample observed lengths with replacement: ``values``, or ``column`` of a CSV/JSONL ``path``."""

    kind: Literal["empirical"] = "empirical"
    path: Path | None = None
    column: str | None = None
    values: tuple[Annotated[int, Field(ge=1, le=MAX_TOKENS)], ...] | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one_source(self) -> EmpiricalLength:
        if (self.path is None) == (self.values is None):
            raise ValueError("give exactly one of path (with column) or values")
        if self.path is not None and self.column is None:
            raise ValueError("column is required with path; name the column holding token counts")
        if self.values is not None and self.column is not None:
            raise ValueError("column only applies with path; remove it or give path instead of values")
        return self


class LengthPairs(_Frozen):
    """Resample whole rows of ``path`` (CSV/JSONL), keeping each (input, output) pair together."""

    kind: Literal["pairs"] = "pairs"
    path: Path
    input_column: str
    output_column: str


LengthDist = Annotated[
    Union[FixedLength, UniformLength, LognormalLength, EmpiricalLength],
    Field(discriminator="kind"),
]


# ---------------------------------------------------------------- arrivals

class Poisson(_Frozen):
    """Open loop, exponential inter-arrival gaps; ``rate`` in requests/s."""

    kind: Literal["poisson"] = "poisson"
    rate: float = Field(ge=MIN_RATE, le=MAX_RATE)


class Gamma(_Frozen):
    """Open loop, gamma gaps with mean 1/``rate`` s and coefficient of variation ``cv``.

    Shape k = 1/cv^2, scale = cv^2/rate.  cv = 1 is Poisson; cv > 1 is burstier.
    """

    kind: Literal["gamma"] = "gamma"
    rate: float = Field(ge=MIN_RATE, le=MAX_RATE)
    cv: float = Field(ge=1e-3, le=100)


class TraceArrivals(_Frozen):
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
    time_scale: float = Field(1.0, ge=1e-9, le=1e9)
    rate: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE)
    limit: int | None = Field(None, ge=1, le=MAX_REQUESTS)

    @model_validator(mode="after")
    def _one_scaling(self) -> TraceArrivals:
        if self.rate is not None and self.time_scale != 1.0:
            raise ValueError("give either time_scale or rate, not both")
        return self


class ClosedLoop(_Frozen):
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
    concurrency: int = Field(ge=1, le=MAX_REQUESTS)
    think_time_s: float = Field(0.0, ge=0, le=MAX_SECONDS)
    send_delay_s: float = Field(CLIENT_SEND_DELAY_S, ge=0, le=60)
    ramp_up_s: float = Field(0.0, ge=0, le=3600)
    warmup_requests: int = Field(0, ge=0, le=MAX_REQUESTS)


Arrival = Annotated[
    Union[Poisson, Gamma, TraceArrivals, ClosedLoop, ShapedArrivals], Field(discriminator="kind")
]


class WorkloadConfig(_Frozen):
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
    num_requests: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    duration_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    images: ImageWorkload | None = None      # multimodal: images per request (simulator.epd.multimodal)

    @model_validator(mode="after")
    def _complete(self) -> WorkloadConfig:
        kind = self.arrival.kind
        split = self.input_length is not None or self.output_length is not None
        if self.lengths is not None and split:
            raise ValueError("give either lengths (pairs) or input_length/output_length, not both")
        if kind != "trace" and self.lengths is None and (
                self.input_length is None or self.output_length is None):
            raise ValueError(
                f"arrival kind {kind!r} needs lengths: give input_length and output_length "
                f"(e.g. {{kind: fixed, value: 512}}) or lengths {{kind: pairs, ...}}")
        if kind == "closed" and self.num_requests is None:
            raise ValueError("a closed loop needs num_requests (total requests the users send)")
        if kind in ("poisson", "gamma") and self.num_requests is None and self.duration_s is None:
            raise ValueError(f"arrival kind {kind!r} needs num_requests, duration_s or both")
        return self


# ---------------------------------------------------------------- requests

@dataclass(frozen=True)
class ClientModel:
    """The closed loop's users as the engine runs them (seconds; see :class:`ClosedLoop`)."""

    concurrency: int
    think_time_s: float = 0.0
    send_delay_s: float = 0.0
    ramp_up_s: float = 0.0
    warmup_requests: int = 0


@dataclass(frozen=True, eq=False)
class Requests:
    """Generated requests as parallel read-only arrays, one entry per request.

    Invariants (checked on construction): n >= 1; ``arrival_s`` float64
    seconds, finite, non-decreasing, starting at 0 (all zeros for a closed
    loop, where ``is_closed_loop`` is set and the engine releases requests as
    ``concurrency`` users finish, each after ``think_time_s``); token counts
    int64 >= 1; ``hash_ids`` (one tuple of block ids of ``hash_block_tokens``
    tokens per request) or None.
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    hash_block_tokens: int | None = None
    is_closed_loop: bool = False
    concurrency: int | None = None
    think_time_s: float = 0.0
    notes: tuple[str, ...] = ()
    client: ClientModel | None = None

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name, dtype in (("arrival_s", np.float64), ("input_tokens", np.int64),
                            ("output_tokens", np.int64)):
            arr = np.array(getattr(self, name), dtype=dtype)  # private copy
            if arr.ndim != 1 or len(arr) != n:
                raise ValueError(f"Requests.{name} must be 1-D with {n} entries")
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)
        if n == 0:
            raise ValueError("Requests needs at least one request")
        a = self.arrival_s
        if not np.isfinite(a).all() or a[0] < 0 or (np.diff(a) < 0).any():
            raise ValueError("Requests.arrival_s must be finite, >= 0 and non-decreasing")
        if self.input_tokens.min() < 1 or self.output_tokens.min() < 1:
            raise ValueError("Requests token counts must be >= 1")
        if self.hash_ids is not None and len(self.hash_ids) != n:
            raise ValueError(f"Requests.hash_ids must have {n} entries")
        if self.is_closed_loop and (self.concurrency is None or self.concurrency < 1):
            raise ValueError("a closed-loop Requests needs concurrency >= 1")

    def __len__(self) -> int:
        return len(self.arrival_s)


def _gaps(arrival: Poisson | Gamma, size: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(arrival, Poisson):
        return rng.exponential(1.0 / arrival.rate, size)
    shape = 1.0 / arrival.cv ** 2
    return rng.gamma(shape, 1.0 / (arrival.rate * shape), size)


def _open_loop(arrival: Poisson | Gamma, num: int | None, duration: float | None,
               rng: np.random.Generator) -> np.ndarray:
    """Arrival times from 0: the first request at 0, then cumulative gaps."""
    if duration is None:
        assert num is not None
        return np.concatenate(([0.0], np.cumsum(_gaps(arrival, num - 1, rng))))
    cv = getattr(arrival, "cv", 1.0)
    expected = arrival.rate * duration
    if expected > MAX_REQUESTS and (num is None or num > MAX_REQUESTS):
        raise WorkloadError(f"rate x duration_s = {expected:.3g} requests exceeds {MAX_REQUESTS}; "
                            f"lower duration_s or set num_requests")
    chunk = int(expected + 6 * cv * math.sqrt(expected) + 16)  # usually one draw suffices
    if num is not None:
        chunk = max(1, min(chunk, num - 1))
    parts, last, count = [np.zeros(1)], 0.0, 1
    while last < duration and (num is None or count < num):
        times = last + np.cumsum(_gaps(arrival, chunk, rng))
        parts.append(times)
        last, count = float(times[-1]), count + chunk
    t = np.concatenate(parts)
    t = t[: np.searchsorted(t, duration, side="left")]
    return t if num is None else t[:num]


def _replay(arrival: TraceArrivals, cfg: WorkloadConfig) -> tuple[Trace, np.ndarray, int]:
    """The trace, its (scaled) arrival times and how many rows to replay."""
    # Read only the rows the run can use: num_requests caps the replay (a 200 MB trace is not read whole).
    limit = min(x for x in (arrival.limit, cfg.num_requests, MAX_REQUESTS) if x is not None)
    trace = read_trace(arrival.path, arrival.format, limit=limit)
    n = len(trace) if cfg.num_requests is None else cfg.num_requests
    if n > len(trace):
        raise WorkloadError(
            f"num_requests={n} but trace {trace.source} has {len(trace)} requests"
            f"{f' (limit={arrival.limit})' if arrival.limit else ''}; lower num_requests "
            f"or leave it unset to replay the whole trace")
    t = trace.arrival_s[:n] * arrival.time_scale
    if arrival.rate is not None:
        span = float(t[-1] - t[0])
        if n < 2 or span <= 0:
            raise WorkloadError(f"cannot rescale {trace.source} to rate={arrival.rate}: its "
                                f"{n} replayed request(s) all arrive at once; drop rate")
        t = t * ((n - 1) / (span * arrival.rate))
    if cfg.duration_s is not None:
        n = int(np.searchsorted(t, cfg.duration_s, side="left"))
        t = t[:n]
    return trace, t, n


def _sample(dist: FixedLength | UniformLength | LognormalLength | EmpiricalLength,
            n: int, rng: np.random.Generator, role: Role) -> np.ndarray:
    if isinstance(dist, FixedLength):
        return np.full(n, dist.value, dtype=np.int64)
    if isinstance(dist, UniformLength):
        return rng.integers(dist.low, dist.high, size=n, endpoint=True, dtype=np.int64)
    if isinstance(dist, LognormalLength):
        s2 = math.log1p(dist.cv ** 2)
        x = rng.lognormal(math.log(dist.mean) - s2 / 2, math.sqrt(s2), n)
        hi = np.inf if dist.high is None else dist.high
        return np.clip(np.rint(x), dist.low, hi).astype(np.int64)
    if dist.values is not None:
        values = np.asarray(dist.values, dtype=np.int64)
    else:
        values = read_token_columns(dist.path, {dist.column: role})[dist.column]
    return values[rng.integers(0, len(values), size=n)]


def generate(cfg: WorkloadConfig, rng_arrivals: np.random.Generator,
             rng_lengths: np.random.Generator) -> Requests:
    """Generate the requests of ``cfg``.

    Arrival times use only ``rng_arrivals`` (unused for traces and closed
    loops); lengths use only ``rng_lengths``, input lengths drawn before
    output lengths.  Reads any files the config names.  Raises
    :class:`WorkloadError` or :class:`simulator.traces.TraceError`.
    """
    arrival = cfg.arrival
    trace: Trace | None = None
    closed = isinstance(arrival, ClosedLoop)
    if isinstance(arrival, TraceArrivals):
        trace, t, n = _replay(arrival, cfg)
    elif closed:
        n = cfg.num_requests
        t = np.zeros(n)
    elif isinstance(arrival, ShapedArrivals):
        t = shaped_arrivals(arrival, cfg.duration_s, cfg.num_requests, rng_arrivals, MAX_REQUESTS)
        n = len(t)
    else:
        t = _open_loop(arrival, cfg.num_requests, cfg.duration_s, rng_arrivals)
        n = len(t)

    hash_ids = None
    if cfg.lengths is not None:
        pairs = cfg.lengths
        cols = read_token_columns(pairs.path, {pairs.input_column: "input",
                                               pairs.output_column: "output"})
        idx = rng_lengths.integers(0, len(cols[pairs.input_column]), size=n)
        inp, out = cols[pairs.input_column][idx], cols[pairs.output_column][idx]
    else:
        if cfg.input_length is not None:
            inp = _sample(cfg.input_length, n, rng_lengths, "input")
        else:  # only a trace can get here (validated)
            inp = trace.input_tokens[:n]
            if trace.hash_ids is not None:
                hash_ids = trace.hash_ids[:n]
        if cfg.output_length is not None:
            out = _sample(cfg.output_length, n, rng_lengths, "output")
        else:
            out = trace.output_tokens[:n]

    return Requests(
        arrival_s=t, input_tokens=inp, output_tokens=out, hash_ids=hash_ids,
        hash_block_tokens=trace.hash_block_tokens if hash_ids is not None else None,
        is_closed_loop=closed,
        concurrency=arrival.concurrency if closed else None,
        think_time_s=arrival.think_time_s if closed else 0.0,
        client=ClientModel(arrival.concurrency, arrival.think_time_s, arrival.send_delay_s, arrival.ramp_up_s,
                           min(arrival.warmup_requests, n - 1)) if closed else None,
        notes=trace.notes if trace is not None else (),
    )
