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
* **the way out**: the API server's event loop, one per instance, as vLLM's ``AsyncLLM`` runs it
  (``vllm/v1/engine/async_llm.py`` ``output_handler``; ``vllm/v1/engine/output_processor.py``
  ``RequestOutputCollector``).  Each engine step's outputs reach it together when the step ends; the
  output handler processes every output that has arrived (``stream_s_per_output`` each: detokenise,
  build the request's output, put it in the request's collector), then each request whose collector
  was empty has its streaming task run once and send one SSE chunk (``stream_s_per_chunk``, and
  ``stream_s_per_request`` more for its first), carrying every token put there since it last ran.  A
  collector that is not empty merges new outputs into the pending one (DELTA streaming), so under load
  a chunk carries several tokens and the loop's cost per token falls: it does not back up the way a
  per-token queue does (:func:`api_server`).  The client receives a token when its chunk is sent.
  This part delays what the client sees, never the engine: the engine's own times (``first_token_s``,
  ``finish_s``, and every server-side figure) do not change, and a closed-loop user sends its next
  request when the engine finishes the last one.

Both are fitted by ``epdsim calibrate fit`` from the harness's client and server timestamps
(:mod:`calibration.fit.frontend`: the lone requests' per-token slope is the serial part's service
time); the GPU engines' end-to-end fit (:mod:`calibration.e2e.fit`) has the side-by-side delay only (a
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

    frontend_s: float = 0.0  # the way in: fixed delay per request (s) ...
    frontend_s_per_token: float = 0.0  # ... plus this per prompt token (s), side by side
    serial_s_per_token: float = 0.0  # the way in's serial part: per prompt token, one at a time (s)
    servers: int = 1  # serial parts side by side: one per instance's API server
    stream_s_per_output: float = 0.0  # the way out: processing one engine output (one token) (s)
    stream_s_per_chunk: float = 0.0  # sending one SSE chunk, whatever it carries (s) ...
    stream_s_per_request: float = 0.0  # ... plus this for a request's first chunk (s)

    def delay(self, prompt: int) -> float:
        """The way in's side-by-side part for a prompt of ``prompt`` tokens (after the serial part)."""
        return self.frontend_s + self.frontend_s_per_token * prompt

    @property
    def has_way_in(self) -> bool:
        return bool(self.frontend_s or self.frontend_s_per_token or self.serial_s_per_token)

    @property
    def has_queue(self) -> bool:
        return bool(self.stream_s_per_output or self.stream_s_per_chunk or self.stream_s_per_request)


class WayIn:
    """The way in of one front end as requests are sent (see the module docstring): ``seen(t, prompt)``
    for a request sent at ``t``, called in the order requests are sent (``t`` non-decreasing), returns
    when the engine sees it (s).  The serial part is ``fe.servers`` first-come-first-served servers."""

    def __init__(self, fe: FrontEnd):
        self.fe = fe
        self.free = [-math.inf] * max(fe.servers, 1)  # when each serial server is next free (a heap)

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
    return [way.seen(a, p) for a, p in zip(arrival, prompt, strict=True)]


def api_server(ready: np.ndarray, owner: np.ndarray, fe: FrontEnd) -> np.ndarray:
    """When the client receives each engine output: ``ready`` (non-decreasing) is when the output (one
    token of request ``owner``) reaches the API server, at the end of the step that made it.

    The loop alternates as vLLM's event loop does (module docstring): it processes every output that
    has arrived, ``stream_s_per_output`` each (outputs arriving meanwhile are processed too: the output
    handler does not yield while its queue has more), then runs the streaming task of each request with
    outputs waiting, in the order they first waited, ``stream_s_per_chunk`` each (``stream_s_per_request``
    more for a request's first chunk); the chunk carries all of that request's waiting outputs, which
    the client receives when it is sent.  With all three costs 0 the client receives each at ``ready``."""
    n = len(ready)
    got = np.empty(n)
    per_output, per_chunk, first = fe.stream_s_per_output, fe.stream_s_per_chunk, fe.stream_s_per_request
    t, own = ready.tolist(), owner.tolist()
    sent: set = set()
    waiting: dict = {}  # request -> indices of its outputs processed but not sent, in arrival order
    now, i = -math.inf, 0
    while i < n or waiting:
        if not waiting and t[i] > now:
            now = t[i]
        while i < n and t[i] <= now:
            now += per_output
            waiting.setdefault(own[i], []).append(i)
            i += 1
        for r, idx in waiting.items():
            now += per_chunk if r in sent else per_chunk + first
            sent.add(r)
            for k in idx:
                got[k] = now
        waiting = {}
    return got


def _outputs(first: np.ndarray, last: np.ndarray, out: np.ndarray, ends: np.ndarray):
    """The engine outputs of requests on one instance whose steps end at ``ends`` (sorted): each
    request's first token at ``first``, then one per step of the instance up to the one ending at
    ``last``, at most ``out - 1`` of them (the request decodes in every step it is running).  Returns
    (ready, owner row, is first, is last), sorted by ``ready`` (ties by row)."""
    rows = np.flatnonzero(np.isfinite(first) & np.isfinite(last))
    tol = 1e-9
    k1 = np.searchsorted(ends, last[rows] + tol, side="right")
    k0 = np.maximum(np.searchsorted(ends, first[rows] + tol, side="right"), k1 - np.maximum(out[rows] - 1, 0))
    k0 = np.minimum(k0, k1)
    counts = k1 - k0
    owner = np.concatenate([rows, np.repeat(rows, counts)])
    starts = np.repeat(k0 - np.cumsum(counts) + counts, counts)
    steps = starts + np.arange(counts.sum())
    ready = np.concatenate([first[rows], ends[steps]])
    is_first = np.concatenate([np.ones(len(rows), bool), np.zeros(len(steps), bool)])
    order = np.lexsort((owner, ready))
    ready, owner, is_first = ready[order], owner[order], is_first[order]
    # a request's last output: its latest one (the first token, for a request with one step)
    is_last = np.zeros(len(order), bool)
    is_last[np.unique(owner[::-1], return_index=True)[1] * -1 + len(owner) - 1] = True
    return ready, owner, is_first, is_last


def client_times(req, steps, fe: FrontEnd) -> tuple[np.ndarray, np.ndarray]:
    """(first token, last token) as the client receives them, per row of the requests table ``req``,
    through each instance's API server (:func:`api_server`; ``steps``: the steps table).  A request
    that never got a token keeps its engine times."""
    first = req["first_token_s"].to_numpy(dtype=float).copy()
    last = req["finish_s"].to_numpy(dtype=float).copy()
    if not fe.has_queue or not len(req) or not len(steps):
        return first, last
    pools = req["pool"].to_numpy()
    inst = req["instance"].to_numpy()
    out = req["output_tokens"].to_numpy(dtype=np.int64)
    for (pool, index), st in steps.groupby(["pool", "instance"], sort=False):
        ends = np.sort((st["start_s"] + st["duration_s"]).to_numpy())
        mine = np.flatnonzero((pools == pool) & (inst == index))
        if not len(mine):
            continue
        ready, owner, is_first, is_last = _outputs(first[mine], last[mine], out[mine], ends)
        got = api_server(ready, owner, fe)
        rows = mine[owner]
        first[rows[is_first]] = got[is_first]
        last[rows[is_last]] = got[is_last]
    return first, last


def add_stream(req, steps, fe: FrontEnd):
    """``req`` with the front end's API server loop applied: ``frontend_out_s`` (the first token's extra
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
