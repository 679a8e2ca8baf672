"""Probe phases and their plan.

- ``prefill``: single requests one after another, ``max_tokens=1``, prompt lengths on a log grid.
  TTFT of a lone request is the prefill time (plus the front end's overhead).
- ``decode_c<N>`` (``decode_c<N>_p<P>`` at a second and further prompt length ``P``): N concurrent
  users (closed loop), fixed prompt and output lengths; the
  inter-token times at steady state are decode step times at batch size N.
- ``load_poisson_<x>``: open loop, Poisson arrivals (seeded), lengths drawn (seeded) from ranges;
  the rate is a fraction ``x`` of the capacity seen in the decode sweep (or absolute ``r<rate>``).
- ``load_closed_c<N>``: closed loop with N users and the load lengths.
- ``load_trace_<file>``: with ``--trace FILE``, instead of the two above: the file's requests at
  their recorded arrival offsets and lengths (:mod:`calibration.harness.trace_plan`).

Each phase scrapes ``/metrics`` before and after and stores the deltas of vLLM's histograms and
counters (:mod:`calibration.harness.phase_run` runs a phase).  A plan is plain JSON (stored in the
manifest) so that a resumed run repeats exactly the same request ids, prompts (seeded by id) and
arrival times.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from calibration.harness.bundle import Bundle, BundleError
from calibration.harness.loadgen import poisson_arrivals
from calibration.harness.trace_plan import trace_phase

PHASE_KINDS = ("prefill", "decode", "load")


#: the range of each plan field that counts something (inclusive; rates in req/s)
PLAN_BOUNDS = {
    "prefill_lengths": (1, 10_000_000),
    "prefill_repeats": (1, 1000),
    "decode_concurrency": (1, 4096),
    "decode_prompt": (1, 10_000_000),
    "decode_output": (1, 10_000_000),
    "decode_rounds": (1, 1000),
    "load_requests": (1, 1_000_000),
    "load_prompt": (1, 10_000_000),
    "load_output": (1, 10_000_000),
    "closed_concurrency": (1, 4096),
    "load_rates": (1e-4, 1e4),
    "load_fractions": (1e-3, 10.0),
}


@dataclass
class PlanOptions:
    quick: bool = False
    seed: int = 0
    kinds: tuple[str, ...] = PHASE_KINDS
    prefill_lengths: list[int] | None = None
    prefill_repeats: int | None = None
    decode_concurrency: list[int] | None = None
    decode_prompt: int | list[int] | None = None  # several: a decode sweep at each (the KV stream's cost)
    decode_output: int | None = None
    decode_rounds: int | None = None  # requests per user at each level; None: 4 quick, else 2
    load_fractions: list[float] | None = None
    load_rates: list[float] | None = None  # absolute req/s; replaces the fractions
    load_requests: int | None = None
    load_prompt: tuple[int, int] | None = None
    load_output: tuple[int, int] | None = None
    closed_concurrency: list[int] | None = None
    trace: str | None = None  # a trace file: the load test replays it instead
    trace_format: str = "auto"
    trace_limit: int | None = None

    def checked(self) -> PlanOptions:
        """This plan, when every counting field is inside :data:`PLAN_BOUNDS` (else a BundleError
        naming the flag, the value and the range: a 0 must not read as "the default")."""
        for name, (lo, hi) in PLAN_BOUNDS.items():
            v = getattr(self, name)
            if v is None:
                continue
            vals = list(v) if isinstance(v, (list, tuple)) else [v]
            if any(not (math.isfinite(x) and lo <= x <= hi) for x in vals) or (isinstance(v, tuple) and v[0] > v[1]):
                shown = ":".join(map(str, v)) if isinstance(v, tuple) else ",".join(map(str, vals))
                span = " to ".join(f"{int(x):,}" if float(x).is_integer() else f"{x:g}" for x in (lo, hi))
                raise BundleError(
                    f"--{name.replace('_', '-')} {shown}: each value must be from {span}"
                    + (" with LO <= HI" if isinstance(v, tuple) else "")
                )
        return self

    def resolved(self) -> ResolvedPlan:
        """This plan with each field left out at its default (``quick``: the short sweeps)."""
        q = self.quick
        return ResolvedPlan(
            quick=q,
            seed=self.seed,
            kinds=self.kinds,
            # quick: the plan the CPU recipe fits with (docs/validation/cpu.md; five launches checked against a
            # bursty trace none of them saw, tests/test_calibration_trace.py)
            prefill_lengths=self.prefill_lengths
            or ([16, 32, 64, 128, 256, 512, 1024] if q else [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]),
            prefill_repeats=self.prefill_repeats or 3,
            decode_concurrency=self.decode_concurrency or ([1, 2, 4, 8] if q else [1, 2, 4, 8, 16, 32, 64]),
            # two prompt lengths, so that the fit sees the decode attention's KV stream (calibration/fit/command.py)
            decode_prompt=self.decode_prompt or ([64, 512] if q else [128, 1024]),
            decode_output=self.decode_output or (64 if q else 128),
            decode_rounds=self.decode_rounds or (4 if q else 2),
            load_fractions=self.load_fractions or ([0.6] if q else [0.3, 0.6, 0.9]),
            load_rates=self.load_rates,
            load_requests=self.load_requests or (30 if q else 100),
            load_prompt=self.load_prompt or ((32, 256) if q else (64, 1024)),
            load_output=self.load_output or ((16, 64) if q else (32, 256)),
            closed_concurrency=([] if q else [16]) if self.closed_concurrency is None else self.closed_concurrency,
            trace=self.trace,
            trace_format=self.trace_format,
            trace_limit=self.trace_limit,
        )


@dataclass
class ResolvedPlan:
    """A :class:`PlanOptions` with its defaults filled in: the same fields in the same order (the
    manifest's ``plan_options``), none of the sweeps left out."""

    quick: bool
    seed: int
    kinds: tuple[str, ...]
    prefill_lengths: list[int]
    prefill_repeats: int
    decode_concurrency: list[int]
    decode_prompt: int | list[int]
    decode_output: int
    decode_rounds: int
    load_fractions: list[float]
    load_rates: list[float] | None
    load_requests: int
    load_prompt: tuple[int, int]
    load_output: tuple[int, int]
    closed_concurrency: list[int]
    trace: str | None
    trace_format: str
    trace_limit: int | None


def build_plan(opts: PlanOptions, max_model_len: int) -> list[dict]:
    """The phases to run, as JSON-ready dicts; requests are ``[id, prompt_len, max_tokens, arrival_s]``."""
    o = opts.resolved()
    plan: list[dict] = []
    if "prefill" in o.kinds:
        lengths = [n for n in o.prefill_lengths if n + 1 <= max_model_len]
        reqs = [[f"prefill-p{n}-r{k}", n, 1, None] for k in range(o.prefill_repeats) for n in lengths]
        plan.append({"name": "prefill", "kind": "prefill", "mode": "sequential", "concurrency": 1, "requests": reqs})
    if "decode" in o.kinds:
        out = o.decode_output
        prompts = o.decode_prompt if isinstance(o.decode_prompt, list) else [o.decode_prompt]
        for j, p in enumerate(dict.fromkeys(min(p, max(1, max_model_len - out)) for p in prompts)):
            # the first prompt length keeps the plain names; a decode sweep at another is decode_c<N>_p<P>
            tag = "" if j == 0 else f"_p{p}"
            for c in o.decode_concurrency:
                reqs = [[f"decode-c{c}{tag.replace('_', '-')}-{i}", p, out, None] for i in range(c * o.decode_rounds)]
                plan.append(
                    {
                        "name": f"decode_c{c}{tag}",
                        "kind": "decode",
                        "mode": "closed",
                        "concurrency": c,
                        "requests": reqs,
                    }
                )
    if "load" in o.kinds and o.trace:
        plan.append(trace_phase(o.trace, o.trace_format, o.trace_limit, max_model_len))
    elif "load" in o.kinds:
        rng = random.Random(f"load:{o.seed}")
        lo_p, hi_p = o.load_prompt
        lo_o, hi_o = o.load_output
        hi_p = min(hi_p, max_model_len - hi_o)
        sizes = [(rng.randint(lo_p, max(lo_p, hi_p)), rng.randint(lo_o, hi_o)) for _ in range(o.load_requests)]
        targets = [("r", r) for r in o.load_rates] if o.load_rates else [("f", f) for f in o.load_fractions]
        for kind, x in targets:
            name = f"load_poisson_{kind}{x:g}" if kind == "r" else f"load_poisson_{x:g}"
            reqs = [[f"{name}-{i}", pl, ol, None] for i, (pl, ol) in enumerate(sizes)]
            ph = {
                "name": name,
                "kind": "load",
                "mode": "open",
                "requests": reqs,
                "arrival_seed": o.seed,
                "rate": x if kind == "r" else None,
                "rate_fraction": x if kind == "f" else None,
            }
            plan.append(ph)
        for c in o.closed_concurrency:
            name = f"load_closed_c{c}"
            reqs = [[f"{name}-{i}", pl, ol, None] for i, (pl, ol) in enumerate(sizes)]
            plan.append({"name": name, "kind": "load", "mode": "closed", "concurrency": c, "requests": reqs})
    return plan


def decode_capacity(bundle: Bundle) -> float | None:
    """Highest output-token throughput (tokens/s) over the decode phases measured so far."""
    best = None
    for ph in bundle.manifest.get("plan", []):
        if ph["kind"] != "decode":
            continue
        recs = bundle.requests(ph["name"])
        if len(recs) < 2:
            continue
        t0 = min(r["t_send"] for r in recs)
        t1 = max(r["t_send"] + r["e2e_s"] for r in recs)
        tok = sum(r["output_tokens"] or 0 for r in recs)
        if t1 > t0:
            best = max(best or 0.0, tok / (t1 - t0))
    return best


def resolve_rate(bundle: Bundle, phase: dict, fallback_rate: float = 1.0) -> dict:
    """Fix an open-loop phase's rate and arrival times once (they are then kept in the manifest)."""
    if phase["mode"] != "open" or all(r[3] is not None for r in phase["requests"]):
        return phase
    if phase.get("rate") is None:
        cap = decode_capacity(bundle)
        mean_out = sum(r[2] for r in phase["requests"]) / len(phase["requests"])
        if cap:
            phase["rate"] = round(phase["rate_fraction"] * cap / mean_out, 4)
            phase["rate_basis"] = (
                f"{phase['rate_fraction']:g} x decode capacity {cap:.1f} tok/s / mean output {mean_out:.1f} tokens"
            )
        else:
            phase["rate"] = fallback_rate
            phase["rate_basis"] = "no decode sweep in the bundle: fallback rate"
    arr = poisson_arrivals(len(phase["requests"]), phase["rate"], seed=hash_seed(phase["name"], phase["arrival_seed"]))
    for r, a in zip(phase["requests"], arr, strict=True):  # one arrival per request
        r[3] = round(a, 6)
    return phase


def hash_seed(name: str, seed: int) -> int:
    return random.Random(f"{name}:{seed}").randrange(2**31)


def summarize_phase(bundle: Bundle, name: str) -> dict:
    """Client-side summary of a phase: counts, TTFT and ITL quantiles, output throughput.

    ``failed`` counts request ids with no successful record; ``retried`` those that failed once
    and succeeded later (a resumed phase).  Throughput adds up the segments' own spans, so the
    time a dead server was down does not count."""
    all_recs = bundle.records(name, "request")
    recs = bundle.requests(name)
    ok_ids = {r["id"] for r in recs}
    bad_ids = {r["id"] for r in all_recs if not r.get("ok")}
    planned = next((len(p["requests"]) for p in bundle.manifest.get("plan", []) if p["name"] == name), None)
    out: dict[str, Any] = {
        "phase": name,
        "planned": planned,
        "ok": len(recs),
        "done": bundle.phase_done(name),
        "failed": len(bad_ids - ok_ids),
        "retried": len(bad_ids & ok_ids),
        "segments": bundle.next_segment(name),
    }
    if not recs:
        return out
    ttft = sorted(r["ttft_s"] for r in recs if r.get("ttft_s") is not None)
    itl = sorted(b - a for r in recs for a, b in pairwise(r["token_times_s"]))
    span = 0.0
    for seg in sorted({r.get("segment", 0) for r in recs}):
        rs = [r for r in recs if r.get("segment", 0) == seg]
        span += max(r["t_send"] + (r["e2e_s"] or 0) for r in rs) - min(r["t_send"] for r in rs)
    tok = sum(r["output_tokens"] or 0 for r in recs)
    out.update(
        ttft_p50=_q(ttft, 0.5),
        ttft_p90=_q(ttft, 0.9),
        itl_p50=_q(itl, 0.5),
        itl_p90=_q(itl, 0.9),
        output_tokens=tok,
        prompt_tokens=sum(r["prompt_tokens"] or 0 for r in recs),
        throughput_tok_s=tok / span if span > 0 else math.nan,
    )
    srv = [
        r["server_metrics"]["time_to_first_token_ms"] / 1e3
        for r in recs
        if r.get("server_metrics") and r["server_metrics"].get("time_to_first_token_ms") is not None
    ]
    if srv:
        out["server_ttft_p50"] = _q(sorted(srv), 0.5)
    itl_srv = [
        r["server_metrics"]["mean_itl_ms"] / 1e3
        for r in recs
        if r.get("server_metrics") and r["server_metrics"].get("mean_itl_ms")
    ]
    if itl_srv:
        out["server_mean_itl_p50"] = _q(sorted(itl_srv), 0.5)
    return out


def _q(xs: list[float], q: float) -> float:
    if not xs:
        return math.nan
    i = q * (len(xs) - 1)
    lo = math.floor(i)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)
