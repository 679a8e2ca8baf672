"""Request generation from the workload configuration.

A :class:`WorkloadConfig` (defined in :mod:`simulator.workload_config`) describes how requests
arrive and how long their prompts and outputs are; :func:`generate` turns it into :class:`Requests`,
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

import numpy as np

from simulator.bounds import MAX_REQUESTS
from simulator.errors import WorkloadError
from simulator.loadshape import ShapedArrivals, shaped_arrivals
from simulator.traces import Role, Trace, read_token_columns, read_trace
from simulator.workload_config import (
    ClosedLoop,
    EmpiricalLength,
    FixedLength,
    Gamma,
    LognormalLength,
    Poisson,
    TraceArrivals,
    UniformLength,
    WorkloadConfig,
)

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
        for name, dtype in (("arrival_s", np.float64), ("input_tokens", np.int64), ("output_tokens", np.int64)):
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
    shape = 1.0 / arrival.cv**2
    return rng.gamma(shape, 1.0 / (arrival.rate * shape), size)


def _open_loop(
    arrival: Poisson | Gamma, num: int | None, duration: float | None, rng: np.random.Generator
) -> np.ndarray:
    """Arrival times from 0: the first request at 0, then cumulative gaps."""
    if duration is None:
        assert num is not None
        return np.concatenate(([0.0], np.cumsum(_gaps(arrival, num - 1, rng))))
    cv = getattr(arrival, "cv", 1.0)
    expected = arrival.rate * duration
    if expected > MAX_REQUESTS and (num is None or num > MAX_REQUESTS):
        raise WorkloadError(
            f"rate x duration_s = {expected:.3g} requests exceeds {MAX_REQUESTS}; lower duration_s or set num_requests"
        )
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
            f"or leave it unset to replay the whole trace"
        )
    t = trace.arrival_s[:n] * arrival.time_scale
    if arrival.rate is not None:
        span = float(t[-1] - t[0])
        if n < 2 or span <= 0:
            raise WorkloadError(
                f"cannot rescale {trace.source} to rate={arrival.rate}: its "
                f"{n} replayed request(s) all arrive at once; drop rate"
            )
        t = t * ((n - 1) / (span * arrival.rate))
    if cfg.duration_s is not None:
        n = int(np.searchsorted(t, cfg.duration_s, side="left"))
        t = t[:n]
    return trace, t, n


def _sample(
    dist: FixedLength | UniformLength | LognormalLength | EmpiricalLength, n: int, rng: np.random.Generator, role: Role
) -> np.ndarray:
    if isinstance(dist, FixedLength):
        return np.full(n, dist.value, dtype=np.int64)
    if isinstance(dist, UniformLength):
        return rng.integers(dist.low, dist.high, size=n, endpoint=True, dtype=np.int64)
    if isinstance(dist, LognormalLength):
        s2 = math.log1p(dist.cv**2)
        x = rng.lognormal(math.log(dist.mean) - s2 / 2, math.sqrt(s2), n)
        hi = np.inf if dist.high is None else dist.high
        return np.clip(np.rint(x), dist.low, hi).astype(np.int64)
    if dist.values is not None:
        values = np.asarray(dist.values, dtype=np.int64)
    else:
        assert dist.path is not None and dist.column is not None  # EmpiricalLength._one_source
        values = read_token_columns(dist.path, {dist.column: role})[dist.column]
    return values[rng.integers(0, len(values), size=n)]


def generate(cfg: WorkloadConfig, rng_arrivals: np.random.Generator, rng_lengths: np.random.Generator) -> Requests:
    """Generate the requests of ``cfg``.

    Arrival times use only ``rng_arrivals`` (unused for traces and closed
    loops); lengths use only ``rng_lengths``, input lengths drawn before
    output lengths.  Reads any files the config names.  Raises
    :class:`WorkloadError` or :class:`simulator.traces.TraceError`.
    """
    arrival = cfg.arrival
    trace: Trace | None = None
    loop = arrival if isinstance(arrival, ClosedLoop) else None
    if isinstance(arrival, TraceArrivals):
        trace, t, n = _replay(arrival, cfg)
    elif isinstance(arrival, ClosedLoop):
        assert cfg.num_requests is not None  # WorkloadConfig._complete: a closed loop needs it
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
        cols = read_token_columns(pairs.path, {pairs.input_column: "input", pairs.output_column: "output"})
        idx = rng_lengths.integers(0, len(cols[pairs.input_column]), size=n)
        inp, out = cols[pairs.input_column][idx], cols[pairs.output_column][idx]
    else:
        if cfg.input_length is not None:
            inp = _sample(cfg.input_length, n, rng_lengths, "input")
        else:  # only a trace can get here (validated)
            assert trace is not None
            inp = trace.input_tokens[:n]
            if trace.hash_ids is not None:
                hash_ids = trace.hash_ids[:n]
        if cfg.output_length is not None:
            out = _sample(cfg.output_length, n, rng_lengths, "output")
        else:  # a trace, as above
            assert trace is not None
            out = trace.output_tokens[:n]

    return Requests(
        arrival_s=t,
        input_tokens=inp,
        output_tokens=out,
        hash_ids=hash_ids,
        hash_block_tokens=trace.hash_block_tokens if trace is not None and hash_ids is not None else None,
        is_closed_loop=loop is not None,
        concurrency=loop.concurrency if loop is not None else None,
        think_time_s=loop.think_time_s if loop is not None else 0.0,
        client=ClientModel(
            loop.concurrency, loop.think_time_s, loop.send_delay_s, loop.ramp_up_s, min(loop.warmup_requests, n - 1)
        )
        if loop is not None
        else None,
        notes=trace.notes if trace is not None else (),
    )
