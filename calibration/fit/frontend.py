"""The front end's figures (:mod:`simulator.engine.frontend`) fitted from a bundle's client and server
timestamps: what the client sees beyond the engine.

* **The way in** (``frontend_s``, ``serial_s_per_token``): the lone requests of the prefill sweep
  (one in flight, nothing queued) see ``client TTFT - server TTFT = frontend_s + serial_s_per_token x
  prompt + one streamed token``.  A line through the median difference at each prompt length (least
  squares, slope >= 0) gives the sum; the streamed token's share is taken off once it is known.  The
  slope is the API server's serial part (its one tokenizer thread): a lone request does not queue
  there, so the slope is its service time per prompt token; the simulator serves it one request at a
  time in the order they were sent (:class:`simulator.engine.frontend.WayIn`).
* **The way out** (``stream_s_per_output``, ``stream_s_per_chunk``, ``stream_s_per_request``): every
  request of the bundle's open-loop load tests (else, without one, of the decode sweeps at 2 or more
  users) is put through the API server's event loop, as the simulator does, at the times the server
  emitted its tokens: the request was sent at ``t_send`` (client clock), reached the engine through the
  way in, was picked up when the step then running ended (the engine core takes requests between
  steps; the server's own clock starts there: the end of another request's prompt step, or on average
  half a decode step while others decode), its first token came the server's TTFT (queue + prefill)
  after that and the others ``mean_itl_ms`` apart.  The loop's costs (per output processed, per chunk
  sent, and more for a request's first chunk) are those whose client-side first and last token times
  (TTFT and E2E) come closest to the measured ones, while a lone request's one output and first chunk
  fit inside its measured delay (a residual per lone request for any excess; soft-L1 least squares on
  log ratios: a scan of 0.01-30 ms per chunk and per first chunk, then Nelder-Mead on their
  logarithms).  The cost per output is not fitted (0): where each chunk carries one token it cannot be
  told from the cost per chunk, and fitted there it would serve a burst's tokens one by one.  A cost that ends
  at the scan's floor is 0.  The loop is kept when it explains the measured delays significantly better
  than none (F-test of the two fits at 5%); otherwise the front end is the way-in delay alone and the
  report says why.

The loop is :func:`simulator.engine.frontend.api_server`, the simulator's own.  Seconds throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from calibration.fit.points import server_ttft_s
from calibration.harness.bundle import Bundle
from simulator.engine.frontend import FrontEnd, WayIn, api_server

#: scale of the soft-L1 loss on log(predicted / measured) client times
SOFT_L1_SCALE = 0.25
#: the service times scanned before the refinement (s); the first is the floor, read as 0
SCAN = np.logspace(-5, math.log10(0.03), 24)


@dataclass
class FrontEndFit:
    """The fitted front end (seconds) and how it was found."""

    frontend_s: float | None = None
    serial_s_per_token: float = 0.0
    stream_s_per_output: float = 0.0
    stream_s_per_chunk: float = 0.0
    stream_s_per_request: float = 0.0
    lone_requests: int = 0
    loaded_requests: int = 0
    phases: list[str] = field(default_factory=list)
    stream_why: str = ""  # why there is no queue ("" when it was fitted)
    remark: str = ""  # a caveat of the fitted queue
    error_without_queue: float | None = None  # RMS of log(client time / measured), no queue
    error_with_queue: float | None = None  # the same with the fitted queue

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
            if (
                srv is None
                or r.get("t_send") is None
                or r.get("ttft_s") is None
                or r.get("e2e_s") is None
                or o < 1
                or (o > 1 and not sm.get("mean_itl_ms"))
            ):
                continue
            rows.append(
                {
                    "phase": ph["name"],
                    "t_send": r["t_send"],
                    "prompt": int(r["prompt_tokens"]),
                    "out": o,
                    "srv_ttft": srv,
                    "itl": (sm.get("mean_itl_ms") or 0.0) / 1e3,
                    "queue": (sm.get("queue_time_ms") or 0.0) / 1e3,
                    "ttft": r["ttft_s"],
                    "e2e": r["e2e_s"],
                }
            )
        if rows:
            out += rows
            names.append(ph["name"])
    return out, names


def client_predictions(rows: list[dict], way_in: FrontEnd, loop: FrontEnd) -> tuple[np.ndarray, np.ndarray]:
    """Client TTFT and E2E of ``rows`` through the way in ``way_in`` (its way-out fields unused) and the
    API server's event loop ``loop`` (its way-out fields: :func:`simulator.engine.frontend.api_server`)."""
    ttft = np.empty(len(rows))
    e2e = np.empty(len(rows))
    for phase in dict.fromkeys(r["phase"] for r in rows):
        idx = sorted((i for i, r in enumerate(rows) if r["phase"] == phase), key=lambda i: rows[i]["t_send"])
        way = WayIn(way_in)
        seen_at = {i: way.seen(rows[i]["t_send"], rows[i]["prompt"]) for i in idx}
        emit, owner = [], []
        busy: list[tuple[float, float]] = []  # (start, end) of the prompt steps so far
        decoding: list[tuple[float, float, float]] = []  # (start, end, step) of the decodes so far
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
        emit_a = np.array(emit)
        order = np.argsort(emit_a, kind="stable")
        owner_a = np.array(owner)[order]
        got = api_server(emit_a[order], owner_a, loop)
        # outputs of one request keep their order: its first is its earliest, its last its latest
        firsts = np.unique(owner_a, return_index=True)
        lasts = np.unique(owner_a[::-1], return_index=True)
        for i, k in zip(*firsts, strict=True):  # np.unique: values and their indices
            ttft[i] = got[k] - rows[i]["t_send"]
        for i, k in zip(*lasts, strict=True):
            e2e[i] = got[len(got) - 1 - k] - rows[i]["t_send"]
    return ttft, e2e


def _loop(costs) -> FrontEnd:
    """The event loop of costs (per output, per chunk, per first chunk), each at the scan's floor read as 0."""
    b, c, f = (float(v) if v > SCAN[0] * 1.0001 else 0.0 for v in costs)
    return FrontEnd(stream_s_per_output=b, stream_s_per_chunk=c, stream_s_per_request=f)


def fit_frontend(b: Bundle) -> FrontEndFit:
    """The front end of bundle ``b`` (see the module docstring); ``frontend_s`` None without lone requests."""
    from scipy.optimize import minimize  # noqa: PLC0415 - scipy loads when a fit runs, not with the module
    from scipy.stats import f as f_dist  # noqa: PLC0415 - slow to import; only this fit's F-test needs it

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
        fit.stream_why = (
            f"{len(rows)} requests with several in flight (decode sweeps at 2 or more users, load "
            f"tests) have client and server times: too few to see the API server's loop"
        )
        return fit
    meas = np.concatenate([[r["ttft"] for r in rows], [r["e2e"] for r in rows]])
    n_lone = fit.lone_requests

    def resid(loop: FrontEnd) -> np.ndarray:
        # A lone request's client - server TTFT holds one output and one first chunk: taken off the way in.
        # A loop costlier than that delay would predict the lone requests late: one residual per lone
        # request says by how much (0 while the loop fits inside it).
        lone = loop.stream_s_per_output + loop.stream_s_per_chunk + loop.stream_s_per_request
        t, e = client_predictions(rows, FrontEnd(max(icpt - lone, 0.0), serial_s_per_token=slope), loop)
        late = math.log(max(lone, icpt) / icpt) if icpt > 0 else 0.0
        return np.concatenate([np.log(np.maximum(np.concatenate([t, e]), 1e-9) / meas), np.full(n_lone, late)])

    def loss(x) -> float:
        z = (resid(_loop(np.exp(x))) / SOFT_L1_SCALE) ** 2
        return float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))

    # The cost per output is left at 0: on a load where each chunk carries one token it cannot be told
    # from the cost per chunk, and put there it serves every token of a burst one by one (a FIFO that
    # backs up, as the per-token queue did), where vLLM's per-output work is one token's detokenisation.
    floor = SCAN[0]
    _, c0, f0 = min((loss(np.log([floor, c, f])), c, f) for c in SCAN for f in SCAN)
    lo, hi = math.log(SCAN[0]), math.log(SCAN[-1])
    best = minimize(
        lambda x: loss(np.log([floor, *np.exp(np.clip(x, lo, hi))])),
        np.log([c0, f0]),
        method="Nelder-Mead",
        options={"xatol": 0.01, "fatol": 1e-6, "maxfev": 200},
    )
    costs = [floor, *np.exp(np.clip(best.x, lo, hi))]
    loop = _loop(costs)
    r1, r0 = resid(loop), resid(FrontEnd())
    fit.error_without_queue = float(np.sqrt(np.mean(r0**2)))
    fit.error_with_queue = float(np.sqrt(np.mean(r1**2)))
    m = len(r1)
    c1, c0_ = float(np.sum(r1**2)), float(np.sum(r0**2))
    named = {
        "per output": loop.stream_s_per_output,
        "per chunk": loop.stream_s_per_chunk,
        "per first chunk": loop.stream_s_per_request,
    }
    k = sum(v > 0 for v in named.values())
    F = (c0_ - c1) / max(k, 1) / max(c1 / max(m - k, 1), 1e-300)
    crit = float(f_dist.ppf(0.95, max(k, 1), max(m - k, 1)))
    if k == 0 or F <= crit:
        fit.stream_why = (
            f"an event loop of {', '.join(f'{v * 1e3:.3g} ms {n}' for n, v in named.items())} "
            f"explains the client's delays no better than none (F = {F:.1f} < {crit:.1f} over "
            f"{len(rows)} requests)"
        )
        return fit
    fit.stream_s_per_output, fit.stream_s_per_chunk = loop.stream_s_per_output, loop.stream_s_per_chunk
    fit.stream_s_per_request = loop.stream_s_per_request
    fit.frontend_s = max(icpt - sum(named.values()), 0.0)
    edge = [n for n, v in named.items() if v >= SCAN[-1] * 0.999]
    if edge:
        fit.remark = (
            f"the cost {' and '.join(edge)} ended at the top of the scan ({SCAN[-1] * 1e3:.0f} ms): "
            f"the client's delays in this bundle are larger than the API server's loop explains "
            f"(a busy host?)"
        )
    return fit


def describe(fe: FrontEndFit) -> str:
    """The front end in one paragraph (fit report, profile notes)."""
    if fe.frontend_s is None:
        return f"front end: not fitted ({fe.stream_why})"
    text = (
        f"front end, way in: {fe.frontend_s * 1e3:.2f} ms + {fe.serial_s_per_token * 1e6:.2f} us per prompt "
        f"token, one request at a time (client - server TTFT of {fe.lone_requests} lone requests)"
    )
    if fe.stream_s_per_output or fe.stream_s_per_chunk or fe.stream_s_per_request:
        return text + (
            f"; way out, the API server's loop (fitted): {fe.stream_s_per_output * 1e3:.3f} ms per "
            f"output processed, {fe.stream_s_per_chunk * 1e3:.3f} ms per chunk streamed and "
            f"{fe.stream_s_per_request * 1e3:.3f} ms more per request's first "
            f"({fe.loaded_requests} requests of {', '.join(fe.phases)}: client TTFT/E2E RMS log error "
            f"{fe.error_with_queue:.2f} with it, {fe.error_without_queue:.2f} without)"
            + (f"; {fe.remark}" if fe.remark else "")
        )
    return text + f"; no API server loop: {fe.stream_why}"
