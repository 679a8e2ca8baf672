"""The serving front end (the API server): what a client sees beyond the engine.

Two parts, with the engine profile's fitted figures (``hwdb.engine_schema.EngineProfile``):

* **the way in**: a request reaches the engine ``frontend_s + frontend_s_per_token x prompt tokens``
  (HTTP, request parsing, the hand-off to the engine core; requests pay it side by side, no queue)
  after its turn at the API server's **serial part**: one request at a time, in the order they were
  sent, ``frontend_serial_s_per_token`` per prompt token (vLLM renders and tokenizes prompts on a pool
  of ``renderer_num_workers`` threads, 1 by default, so a prompt waits for the ones sent before it and
  a short request sent just after a long one cannot overtake it).  One such server per instance's
  API server (``servers``).  It shifts when the engine sees a request (:class:`WayIn`, the
  ``frontend_s`` column: arrival to seen);
* **the way out**, a queue: one first-come-first-served server per instance (the API server's output
  loop: detokenisation, SSE framing and sending, and on a small host the client reading the stream)
  serves every token the engine emits, ``frontend_stream_s_per_token`` each, and a request's first
  token ``frontend_stream_s_per_request`` more (opening its stream).  A step's tokens reach it together
  when the step ends; the client receives a token when the server has streamed it
  (:func:`stream_delivery`).  This part delays what the client sees, never the engine: the engine's own
  times (``first_token_s``, ``finish_s``, and every server-side figure) do not change, and a closed-loop
  user sends its next request when the engine finishes the last one.

Both are fitted by ``epdsim calibrate fit`` from the harness's client and server timestamps
(:mod:`calibration.fit_frontend`: the lone requests' per-token slope is the serial part's service
time); the GPU engines' end-to-end fit (:mod:`calibration.e2e_fit`) has the side-by-side delay only (a
TTFT residual over many GPU runs, not a service time).  Seconds throughout.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FrontEnd:
    """The fitted front end of a pool (see the module docstring); all zero: none."""

    frontend_s: float = 0.0                   # the way in: fixed delay per request (s) ...
    frontend_s_per_token: float = 0.0         # ... plus this per prompt token (s), side by side
    serial_s_per_token: float = 0.0           # the way in's serial part: per prompt token, one at a time (s)
    servers: int = 1                          # serial parts side by side: one per instance's API server
    stream_s_per_token: float = 0.0           # the way out: service time per streamed token (s) ...
    stream_s_per_request: float = 0.0         # ... plus this for a request's first token (s)

    def delay(self, prompt: int) -> float:
        """The way in's side-by-side part for a prompt of ``prompt`` tokens (after the serial part)."""
        return self.frontend_s + self.frontend_s_per_token * prompt

    @property
    def has_way_in(self) -> bool:
        return bool(self.frontend_s or self.frontend_s_per_token or self.serial_s_per_token)

    @property
    def has_queue(self) -> bool:
        return bool(self.stream_s_per_token or self.stream_s_per_request)


class WayIn:
    """The way in of one front end as requests are sent (see the module docstring): ``seen(t, prompt)``
    for a request sent at ``t``, called in the order requests are sent (``t`` non-decreasing), returns
    when the engine sees it (s).  The serial part is ``fe.servers`` first-come-first-served servers."""

    def __init__(self, fe: FrontEnd):
        self.fe = fe
        self.free = [-math.inf] * max(fe.servers, 1)    # when each serial server is next free (a heap)

    def seen(self, t: float, prompt: int) -> float:
        fe = self.fe
        if fe.serial_s_per_token:
            begin = max(t, self.free[0])
            t = begin + fe.serial_s_per_token * prompt
            heapq.heapreplace(self.free, t)
        return t + fe.delay(prompt)


def seen_times(arrival: list[float], prompt: list[int], fe: FrontEnd) -> list[float] | None:
    """When the engine sees each open-loop request (seconds; ``arrival`` non-decreasing, the order they
    were sent), or None when there is no way in (it sees each at its arrival)."""
    if not fe.has_way_in:
        return None
    way = WayIn(fe)
    return [way.seen(a, p) for a, p in zip(arrival, prompt)]


def fifo(ready: np.ndarray, work: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One first-come-first-served server: jobs ready at ``ready`` (non-decreasing) needing ``work``
    seconds each.  Returns (begin, end) of each job's service (Lindley's recursion)."""
    begin = np.empty(len(ready))
    end = np.empty(len(ready))
    free = -np.inf
    for i, (t, w) in enumerate(zip(ready.tolist(), work.tolist())):
        b = t if t > free else free
        begin[i] = b
        free = b + w
        end[i] = free
    return begin, end


def stream_delivery(step_end: np.ndarray, tokens: np.ndarray, firsts: np.ndarray, fe: FrontEnd) -> np.ndarray:
    """When the client receives a step's tokens: the output server streams the ``tokens`` a step
    emits (ending at ``step_end``, non-decreasing; ``firsts`` of them first tokens) one after another,
    ``stream_s_per_token`` each plus ``stream_s_per_request`` per first token; a step's tokens arrive on
    average halfway through its share of the server."""
    work = tokens * fe.stream_s_per_token + firsts * fe.stream_s_per_request
    begin, end = fifo(step_end, work)
    return begin + 0.5 * (work + np.where(tokens > 0, work / np.maximum(tokens, 1), 0.0))


def client_times(req, steps, fe: FrontEnd) -> tuple[np.ndarray, np.ndarray]:
    """(first token, last token) as the client receives them, per row of the requests table ``req``,
    through each instance's output server (``steps``: the steps table).  A request that has no step
    ending at its engine time (it never got a token) keeps the engine time."""
    first = req["first_token_s"].to_numpy(dtype=float).copy()
    last = req["finish_s"].to_numpy(dtype=float).copy()
    if not fe.has_queue or not len(req) or not len(steps):
        return first, last
    pools = req["pool"].to_numpy()
    inst = req["instance"].to_numpy()
    for (pool, index), st in steps.groupby(["pool", "instance"], sort=False):
        end = (st["start_s"] + st["duration_s"]).to_numpy()
        order = np.argsort(end, kind="stable")
        end = end[order]
        firsts = st["first_tokens"].to_numpy(dtype=float)[order]
        emitted = st["decode_tokens"].to_numpy(dtype=float)[order] + firsts
        got = stream_delivery(end, emitted, firsts, fe)
        mine = (pools == pool) & (inst == index)
        for col in (first, last):
            t = col[mine]
            # the step that produced the token ends at its engine time (the same float, ulps aside)
            k = np.searchsorted(end, t + 1e-9, side="right") - 1
            ok = np.isfinite(t) & (k >= 0)
            k = np.clip(k, 0, len(end) - 1)
            ok &= np.abs(end[k] - t) <= 1e-6
            col[mine] = np.where(ok, got[k], t)
    return first, last


def add_stream(req, steps, fe: FrontEnd):
    """``req`` with the front end's output queue applied: ``frontend_out_s`` (the first token's extra
    time in it), ``ttft_s``, ``tpot_s`` and ``e2e_s`` as the client sees them.  Unchanged without one."""
    if not fe.has_queue:
        return req
    first, last = client_times(req, steps, fe)
    req = req.copy()
    out = req["output_tokens"].to_numpy()
    arrival = req["arrival_s"].to_numpy()
    req["frontend_out_s"] = first - req["first_token_s"].to_numpy()
    req["ttft_s"] = first - arrival
    req["e2e_s"] = last - arrival
    req["tpot_s"] = np.where(out > 1, (last - first) / np.maximum(out - 1, 1), np.nan)
    return req
