"""The front end's figures (:mod:`simulator.engine.frontend`) fitted from a bundle's client and server
timestamps: what the client sees beyond the engine.

* **The way in** (``frontend_s``, ``serial_s_per_token``): the lone requests of the prefill sweep
  (one in flight, nothing queued) see ``client TTFT - server TTFT = frontend_s + serial_s_per_token x
  prompt + one streamed token``.  A line through the median difference at each prompt length (least
  squares, slope >= 0) gives the sum; the streamed token's share is taken off once it is known.  The
  slope is the API server's serial part (its one tokenizer thread): a lone request does not queue
  there, so the slope is its service time per prompt token; the simulator serves it one request at a
  time in the order they were sent (:class:`simulator.engine.frontend.WayIn`).
* **The way out** (``stream_s_per_token``, ``stream_s_per_request``): every request of the bundle's
  open-loop load tests (else, without one, of the decode sweeps at 2 or more users) is put through
  the front end's output queue, as the simulator does, at the times the server emitted its tokens:
  the request was sent at ``t_send`` (client clock), reached the engine through the way in, was picked
  up when the step then running ended (the engine core takes requests between steps; the server's
  own clock starts there: the end of another request's prompt step, or on average half a decode step
  while others decode), its first token came the server's TTFT (queue + prefill) after that and the
  others ``mean_itl_ms`` apart.  The queue's service times (per token, and more for a request's first
  token) are those whose client-side first and last token times (TTFT and
  E2E) come closest to the measured ones (soft-L1 least squares on log ratios: a scan of 0.01-30 ms
  each, then Nelder-Mead on their logarithms).  A service time that ends at the scan's floor is 0.  The
  queue is kept when it explains the measured delays significantly better than none (F-test of the two
  fits at 5%); otherwise the front end is the way-in delay alone and the report says why.

The queue is :func:`simulator.engine.frontend.fifo`, the simulator's own.  Seconds throughout.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from calibration.fit_points import server_ttft_s
from calibration.harness.bundle import Bundle
from simulator.engine.frontend import FrontEnd, WayIn, fifo

#: scale of the soft-L1 loss on log(predicted / measured) client times
SOFT_L1_SCALE = 0.25
#: the service times scanned before the refinement (s); the first is the floor, read as 0
SCAN = np.logspace(-5, math.log10(0.03), 24)


@dataclass
class FrontEndFit:
    """The fitted front end (seconds) and how it was found."""

    frontend_s: float | None = None
    serial_s_per_token: float = 0.0
    stream_s_per_token: float = 0.0
    stream_s_per_request: float = 0.0
    lone_requests: int = 0
    loaded_requests: int = 0
    phases: list[str] = field(default_factory=list)
    stream_why: str = ""                          # why there is no queue ("" when it was fitted)
    remark: str = ""                              # a caveat of the fitted queue
    error_without_queue: float | None = None      # RMS of log(client time / measured), no queue
    error_with_queue: float | None = None         # the same with the fitted queue

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _lone_line(b: Bundle) -> tuple[float, float, int] | None:
    """(intercept s, slope s per prompt token, requests) of client - server TTFT of lone requests."""
    by_len: dict[int, list[float]] = {}
    for ph in b.manifest["plan"]:
        if ph["kind"] != "prefill":
            continue
        for r in b.requests(ph["name"]):
            srv = server_ttft_s(r)
            if srv is None or r.get("ttft_s") is None or not r.get("prompt_tokens"):
                continue
            by_len.setdefault(int(r["prompt_tokens"]), []).append(r["ttft_s"] - srv)
    if not by_len:
        return None
    x = np.array(sorted(by_len), dtype=float)
    y = np.array([np.median(by_len[int(k)]) for k in x])
    n = sum(len(v) for v in by_len.values())
    if len(x) < 2 or np.ptp(x) == 0:
        return max(float(np.median(y)), 0.0), 0.0, n
    slope, icpt = np.polyfit(x, y, 1)
    if slope <= 0:
        return max(float(np.median(y)), 0.0), 0.0, n
    return max(float(icpt), 0.0), float(slope), n


def _loaded_requests(b: Bundle) -> tuple[list[dict], list[str]]:
    """Requests with client and server times of the open-loop load tests, else of the phases with
    several users.  Open loops come first: a closed loop's users wait for the front end before they
    send again, so on a small host its engine may run one request at a time (a decode sweep at 8 users
    measured an engine batch of 1.0) and its delays do not carry over to arrivals that do not wait."""
    plan = b.manifest["plan"]
    opened = [ph for ph in plan if ph["kind"] == "load" and ph.get("mode") == "open"]
    phases = opened or [ph for ph in plan if ph["kind"] != "prefill" and (ph.get("concurrency") or 1) >= 2]
    out, names = [], []
    for ph in phases:
        rows = []
        for r in b.requests(ph["name"]):
            sm = r.get("server_metrics") or {}
            srv = server_ttft_s(r)
            o = int(r.get("output_tokens") or 0)
            if (srv is None or r.get("t_send") is None or r.get("ttft_s") is None or r.get("e2e_s") is None
                    or o < 1 or (o > 1 and not sm.get("mean_itl_ms"))):
                continue
            rows.append({"phase": ph["name"], "t_send": r["t_send"], "prompt": int(r["prompt_tokens"]), "out": o,
                         "srv_ttft": srv, "itl": (sm.get("mean_itl_ms") or 0.0) / 1e3,
                         "queue": (sm.get("queue_time_ms") or 0.0) / 1e3,
                         "ttft": r["ttft_s"], "e2e": r["e2e_s"]})
        if rows:
            out += rows
            names.append(ph["name"])
    return out, names


def client_predictions(rows: list[dict], way_in: FrontEnd, stream_s: float,
                       first_s: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Client TTFT and E2E of ``rows`` through the way in ``way_in`` (its output queue's fields unused)
    and the output queue (``stream_s`` per token, ``first_s`` more for a request's first)."""
    ttft = np.empty(len(rows))
    e2e = np.empty(len(rows))
    for phase in dict.fromkeys(r["phase"] for r in rows):
        idx = sorted((i for i, r in enumerate(rows) if r["phase"] == phase), key=lambda i: rows[i]["t_send"])
        way = WayIn(way_in)
        seen_at = {i: way.seen(rows[i]["t_send"], rows[i]["prompt"]) for i in idx}
        emit, owner, last, work = [], [], [], []
        busy: list[tuple[float, float]] = []     # (start, end) of the prompt steps so far
        decoding: list[tuple[float, float, float]] = []   # (start, end, step) of the decodes so far
        for i in sorted(idx, key=seen_at.__getitem__):
            r = rows[i]
            seen = seen_at[i]
            pick = max([seen] + [e for s, e in busy if s <= seen < e])
            if pick == seen:
                pick += 0.5 * max([0.0] + [st for s, e, st in decoding if s <= seen < e])
            t1 = pick + r["srv_ttft"]
            busy.append((pick + r["queue"], t1))
            decoding.append((t1, t1 + r["itl"] * (r["out"] - 1), r["itl"]))
            emit.extend(t1 + r["itl"] * np.arange(r["out"]))
            owner.extend([i] * r["out"])
            last.extend([False] * (r["out"] - 1) + [True])
            work.extend([stream_s + first_s] + [stream_s] * (r["out"] - 1))
        emit_a = np.array(emit)
        order = np.argsort(emit_a, kind="stable")
        _, end = fifo(emit_a[order], np.array(work)[order])
        owner_a, last_a = np.array(owner)[order], np.array(last)[order]
        seen: set[int] = set()
        for k, (i, is_last) in enumerate(zip(owner_a.tolist(), last_a.tolist())):
            if i not in seen:
                seen.add(i)
                ttft[i] = end[k] - rows[i]["t_send"]
            if is_last:
                e2e[i] = end[k] - rows[i]["t_send"]
    return ttft, e2e


def fit_frontend(b: Bundle) -> FrontEndFit:
    """The front end of bundle ``b`` (see the module docstring); ``frontend_s`` None without lone requests."""
    from scipy.optimize import minimize
    from scipy.stats import f as f_dist
    fit = FrontEndFit()
    line = _lone_line(b)
    if line is None:
        fit.stream_why = "no lone request with client and server times (prefill sweep)"
        return fit
    icpt, slope, fit.lone_requests = line
    fit.frontend_s, fit.serial_s_per_token = icpt, slope
    rows, fit.phases = _loaded_requests(b)
    fit.loaded_requests = len(rows)
    if len(rows) < 4:
        fit.stream_why = (f"{len(rows)} requests with several in flight (decode sweeps at 2 or more users, load "
                          f"tests) have client and server times: too few to see the output queue")
        return fit
    meas = np.concatenate([[r["ttft"] for r in rows], [r["e2e"] for r in rows]])

    def resid(s: float, f: float) -> np.ndarray:
        t, e = client_predictions(rows, FrontEnd(max(icpt - s - f, 0.0), serial_s_per_token=slope), s, f)
        return np.log(np.maximum(np.concatenate([t, e]), 1e-9) / meas)

    def loss(x) -> float:
        s, f = (float(v) if v > SCAN[0] * 1.0001 else 0.0 for v in np.exp(x))
        z = (resid(s, f) / SOFT_L1_SCALE) ** 2
        return float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))

    grid = [(loss(np.log([s, f])), s, f) for s in SCAN for f in SCAN]
    _, s0, f0 = min(grid)
    lo, hi = math.log(SCAN[0]), math.log(SCAN[-1])
    best = minimize(lambda x: loss(np.clip(x, lo, hi)), np.log([s0, f0]), method="Nelder-Mead",
                    options={"xatol": 0.01, "fatol": 1e-6, "maxfev": 200})
    s, f = (float(v) if v > SCAN[0] * 1.0001 else 0.0 for v in np.exp(np.clip(best.x, lo, hi)))
    r1, r0 = resid(s, f), resid(0.0, 0.0)
    fit.error_without_queue = float(np.sqrt(np.mean(r0 ** 2)))
    fit.error_with_queue = float(np.sqrt(np.mean(r1 ** 2)))
    m = len(r1)
    c1, c0 = float(np.sum(r1 ** 2)), float(np.sum(r0 ** 2))
    k = (s > 0) + (f > 0)
    F = (c0 - c1) / max(k, 1) / max(c1 / max(m - k, 1), 1e-300)
    crit = float(f_dist.ppf(0.95, max(k, 1), max(m - k, 1)))
    if k == 0 or F <= crit:
        fit.stream_why = (f"a queue of {s * 1e3:.3g} ms per token and {f * 1e3:.3g} ms more per request explains "
                          f"the client's delays no better than none (F = {F:.1f} < {crit:.1f} over {len(rows)} "
                          f"requests)")
        return fit
    fit.stream_s_per_token, fit.stream_s_per_request = s, f
    fit.frontend_s = max(icpt - s - f, 0.0)
    edge = [n for n, v in (("per token", s), ("per request", f)) if v >= SCAN[-1] * 0.999]
    if edge:
        fit.remark = (f"the service time {' and '.join(edge)} ended at the top of the scan ({SCAN[-1] * 1e3:.0f} ms): "
                      f"the client's delays in this bundle are larger than an output queue explains (a busy host?)")
    return fit


def describe(fe: FrontEndFit) -> str:
    """The front end in one paragraph (fit report, profile notes)."""
    if fe.frontend_s is None:
        return f"front end: not fitted ({fe.stream_why})"
    text = (f"front end, way in: {fe.frontend_s * 1e3:.2f} ms + {fe.serial_s_per_token * 1e6:.2f} us per prompt "
            f"token, one request at a time (client - server TTFT of {fe.lone_requests} lone requests)")
    if fe.stream_s_per_token or fe.stream_s_per_request:
        return text + (f"; way out: an output queue of {fe.stream_s_per_token * 1e3:.3f} ms per streamed token "
                       f"and {fe.stream_s_per_request * 1e3:.3f} ms more per request's first token "
                       f"({fe.loaded_requests} requests of {', '.join(fe.phases)}: client TTFT/E2E RMS log error "
                       f"{fe.error_with_queue:.2f} with it, {fe.error_without_queue:.2f} without)"
                       + (f"; {fe.remark}" if fe.remark else ""))
    return text + f"; no output queue: {fe.stream_why}"
