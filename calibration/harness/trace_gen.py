"""Bursty request traces for calibration replays (``epdsim calibrate make-trace``).

A fit is only worth what it predicts on a load it was not fitted on.  This writes such a load: a
plain CSV trace (``arrival_s,input_tokens,output_tokens``, the format ``calibrate run --trace`` and
``epdsim simulate`` read) whose arrivals come in bursts and whose requests are of several kinds.

* **Arrivals**: a two-state Markov-modulated Poisson process.  The source alternates between a quiet
  and a busy state, each held for an exponential time (mean ``sojourn_s``), and sends requests as a
  Poisson process at the state's rate (``rates``, req/s).  The long-run mean rate is the rates
  weighted by the states' shares of time, ``sojourn_i / sum(sojourn)``; the inter-arrival CV is above
  1 when the rates differ (Poisson: 1).
* **Lengths**: each request belongs to a class drawn with the classes' shares; its prompt and output
  lengths are uniform integers in the class's inclusive ranges.

The default is the shape a user of issue 34 replayed: 240 requests, 0.5 and 6 req/s held 20 s and
6.5 s on average (mean 1.85 req/s), chat 64-200 -> 32-128 tokens (60 %), documents 900-1,200 -> 8-24
(25 %), mid 400 -> 200 (15 %).  The same arguments and seed give the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.markup import escape

from calibration.harness.bundle import BundleError

#: the largest request count, rate and token length a trace may ask for (a replay must end)
MAX_REQUESTS, MAX_RATE, MAX_TOKENS = 1_000_000, 10_000.0, 1_000_000


class TraceGenError(ValueError):
    """A bad generator argument: the message names the flag, the value and the fix."""


@dataclass(frozen=True)
class LengthClass:
    """A kind of request: its share of the trace and its prompt/output token ranges (inclusive)."""

    name: str
    share: float
    prompt: tuple[int, int]
    output: tuple[int, int]


DEFAULT_CLASSES = (
    LengthClass("chat", 0.60, (64, 200), (32, 128)),
    LengthClass("documents", 0.25, (900, 1200), (8, 24)),
    LengthClass("mid", 0.15, (400, 400), (200, 200)),
)


def parse_class(text: str) -> LengthClass:
    """``NAME:SHARE:PROMPT:OUTPUT`` with each length ``N`` or ``LO-HI``, e.g. ``chat:0.6:64-200:32-128``."""
    parts = text.split(":")
    fix = "give NAME:SHARE:PROMPT:OUTPUT, e.g. chat:0.6:64-200:32-128"
    if len(parts) != 4 or not parts[0].strip():
        raise TraceGenError(f"--class {text!r}: {fix}")
    try:
        share = float(parts[1])
    except ValueError:
        raise TraceGenError(f"--class {text!r}: share {parts[1]!r} is not a number; {fix}") from None
    if not (math.isfinite(share) and 0 < share <= 1e6):
        raise TraceGenError(
            f"--class {text!r}: share {parts[1]} must be a finite number > 0 (shares are normalised over the classes)"
        )

    def span(what: str, s: str) -> tuple[int, int]:
        lo_hi = s.split("-")
        try:
            lo, hi = (int(lo_hi[0]), int(lo_hi[-1])) if len(lo_hi) <= 2 else (0, -1)
        except ValueError:
            raise TraceGenError(f"--class {text!r}: {what} length {s!r} is not N or LO-HI tokens; {fix}") from None
        if not 1 <= lo <= hi <= MAX_TOKENS:
            raise TraceGenError(
                f"--class {text!r}: {what} length {s!r} must be N or LO-HI with 1 <= LO <= HI <= {MAX_TOKENS:,} tokens"
            )
        return lo, hi

    return LengthClass(parts[0].strip(), share, span("prompt", parts[2]), span("output", parts[3]))


def _pair(flag: str, values, lo: float, hi: float, unit: str) -> tuple[float, float]:
    vals = tuple(float(v) for v in values)
    if len(vals) != 2 or not all(math.isfinite(v) and lo < v <= hi for v in vals):
        raise TraceGenError(
            f"{flag} {','.join(map(str, values))}: give two numbers, quiet and busy state, each "
            f"> {lo:g} and <= {hi:g} {unit}"
        )
    return vals


def mmpp_arrivals(
    n: int, rates: tuple[float, float], sojourn_s: tuple[float, float], rng: np.random.Generator
) -> np.ndarray:
    """``n`` arrival times (s, the first at 0) of the two-state MMPP (module docstring); the first
    state is drawn with the states' shares of time."""
    share_busy = sojourn_s[1] / (sojourn_s[0] + sojourn_s[1])
    state = int(rng.random() < share_busy)
    t = 0.0
    out: list[float] = []
    while len(out) < n:
        leave = t + rng.exponential(sojourn_s[state])
        while len(out) < n:
            nxt = t + rng.exponential(1.0 / rates[state])
            if nxt >= leave:  # the state ends first; memoryless, so the next state starts afresh
                break
            t = nxt
            out.append(t)
        t, state = leave, 1 - state
    arr = np.asarray(out)
    return arr - arr[0]


def generate(
    n: int = 240,
    seed: int = 0,
    rates=(0.5, 6.0),
    sojourn_s=(20.0, 6.5),
    classes: tuple[LengthClass, ...] = DEFAULT_CLASSES,
) -> list[tuple[float, int, int, str]]:
    """The trace's rows: (arrival s, prompt tokens, output tokens, class name), in arrival order."""
    if not 1 <= int(n) <= MAX_REQUESTS or int(n) != n:
        raise TraceGenError(f"--requests {n}: give a whole number from 1 to {MAX_REQUESTS:,}")
    rates = _pair("--rates", rates, 0.0, MAX_RATE, "req/s")
    sojourn_s = _pair("--sojourn", sojourn_s, 0.0, 1e6, "s")
    if not classes:
        raise TraceGenError("--class: give at least one class")
    rng = np.random.default_rng(seed)
    arrivals = mmpp_arrivals(int(n), rates, sojourn_s, rng)
    share = np.array([c.share for c in classes], dtype=float)
    kinds = rng.choice(len(classes), size=int(n), p=share / share.sum())
    rows = []
    for a, k in zip(arrivals.tolist(), kinds.tolist(), strict=True):  # n of each
        c = classes[k]
        rows.append(
            (
                round(a, 6),
                int(rng.integers(c.prompt[0], c.prompt[1] + 1)),
                int(rng.integers(c.output[0], c.output[1] + 1)),
                c.name,
            )
        )
    return rows


def write(path: Path, rows) -> None:
    """The rows as a plain CSV trace (the class name is not a column the readers know: it stays out)."""
    path.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{a:.6f},{i},{o}\n" for a, i, o, _ in rows))


def summary(rows) -> str:
    """The trace in one paragraph: count, span, mean rate, inter-arrival CV and the classes drawn."""
    arr = np.array([r[0] for r in rows])
    gaps = np.diff(arr)
    cv = float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else float("nan")
    span = float(arr[-1] - arr[0]) if len(arr) > 1 else 0.0
    rate = (len(arr) - 1) / span if span > 0 else float("nan")
    names = dict.fromkeys(r[3] for r in rows)
    kinds = ", ".join(f"{k} {sum(r[3] == k for r in rows)}" for k in names)
    return (
        f"{len(rows)} requests over {span:.1f} s (mean {rate:.2f} req/s, inter-arrival CV {cv:.2f}); "
        f"classes: {kinds}; outputs up to {max(r[2] for r in rows)} tokens"
    )


def cmd_make_trace(a, con) -> int:
    """``epdsim calibrate make-trace``: write the trace the arguments describe (exit 0), or refuse them
    (BundleError)."""

    def pair(flag: str, text: str):
        try:
            return tuple(float(x) for x in text.split(","))
        except ValueError:
            raise BundleError(f"{flag} {text}: give two numbers separated by a comma, e.g. 0.5,6") from None

    out = Path(a.out)
    if out.is_dir() or (out.exists() and not a.force):
        raise BundleError(
            f"{out}: {'is a folder' if out.is_dir() else 'exists'}; give a new file name"
            + ("" if out.is_dir() else " or --force to overwrite it")
        )
    if not out.parent.is_dir():
        raise BundleError(f"{out}: its folder {out.parent} does not exist; create it first")
    try:
        rows = generate(
            a.requests,
            a.seed,
            pair("--rates", a.rates),
            pair("--sojourn", a.sojourn),
            tuple(parse_class(c) for c in a.classes) or DEFAULT_CLASSES,
        )
    except TraceGenError as exc:
        raise BundleError(str(exc)) from None
    write(out, rows)
    con.print(f"{escape(str(out))}: {summary(rows)}")
    return 0


def add_make_trace_parser(subparsers) -> None:
    """``epdsim calibrate make-trace``'s arguments, under ``epdsim calibrate``'s sub-commands."""
    desc = (
        "Write a plain CSV trace (arrival_s,input_tokens,output_tokens): arrivals from a two-state "
        "Markov-modulated Poisson process (a quiet and a busy rate, each held an exponential time) and lengths "
        "from request classes (calibration/harness/trace_gen.py). "
        "Replay it with `calibrate run --trace FILE --phases "
        "load` and check a fit with `calibrate validate` on a load it was not fitted on."
    )
    t = subparsers.add_parser(
        "make-trace", description=desc, help="write a bursty trace of several request kinds to replay with --trace"
    )
    t.add_argument("out", help="the CSV file to write")
    t.add_argument("--requests", type=int, default=240, help="requests in the trace (240)")
    t.add_argument("--seed", type=int, default=0, help="random seed: the same arguments and seed give the same file")
    t.add_argument("--rates", default="0.5,6", help="quiet,busy arrival rates in req/s (0.5,6)")
    t.add_argument("--sojourn", default="20,6.5", help="mean seconds the source stays quiet,busy (20,6.5)")
    t.add_argument(
        "--class",
        dest="classes",
        action="append",
        default=[],
        metavar="NAME:SHARE:PROMPT:OUTPUT",
        help="a request class, lengths N or LO-HI tokens (repeatable; default chat:0.6:64-200:32-128, "
        "documents:0.25:900-1200:8-24, mid:0.15:400:200)",
    )
    t.add_argument("--force", action="store_true", help="overwrite an existing file")
    t.set_defaults(calibrate_func=cmd_make_trace)
