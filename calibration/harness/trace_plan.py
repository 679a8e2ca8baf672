"""A load phase replayed from a trace file (``calibrate run --trace FILE``).

The trace is read with the simulator's own readers (:func:`simulator.traces.read_trace`: Azure
CSV, Mooncake JSONL, plain CSV/JSONL; the formats ``epdsim simulate`` reads), so a file that
``simulate`` accepts is sent to the server as it was recorded: each request at its arrival offset,
with its prompt length (exact token ids) and its output length (``max_tokens`` with
``ignore_eos``).  The phase stores the arrivals in the plan like a Poisson phase does, so a resumed
run sends the same requests at the same offsets, and it describes the workload (``workload``:
file, SHA-256, format, count, span, mean rate, inter-arrival CV) for the reports.

What is not replayed: prefix-sharing hashes (``hash_ids``).  The harness's prompts never share a
prefix, so a trace's cache hits are not reproduced; the phase's notes say so when the file has them.
"""

from __future__ import annotations

import hashlib
import math
import re
import warnings
from itertools import pairwise
from pathlib import Path

from calibration.harness.bundle import BundleError
from simulator.traces import TraceError, TraceWarning, detect_format, read_trace

TRACE_FORMATS = ("auto", "azure", "mooncake", "plain")


def read(path: str, fmt: str = "auto", limit: int | None = None):
    """The :class:`simulator.traces.Trace` of ``path``; :class:`BundleError` names the flag and the fix."""
    if fmt not in TRACE_FORMATS:
        raise BundleError(f"--trace-format {fmt}: unknown; use one of {', '.join(TRACE_FORMATS)}")
    if limit is not None and limit < 1:
        raise BundleError(f"--trace-limit {limit}: give a number of requests >= 1")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TraceWarning)  # the adjustments are kept in trace.notes
            return read_trace(path, fmt, limit)
    except TraceError as exc:
        raise BundleError(f"--trace {path}: {exc}") from None


def describe(trace, path: Path, fmt: str) -> dict:
    """What the reports say about a trace workload (rates in requests per second)."""
    arr = [float(x) for x in trace.arrival_s]
    gaps = [b - a for a, b in pairwise(arr)]
    span = arr[-1] if arr else 0.0
    mean_gap = sum(gaps) / len(gaps) if gaps else math.nan
    cv = math.sqrt(sum((g - mean_gap) ** 2 for g in gaps) / len(gaps)) / mean_gap if gaps and mean_gap > 0 else math.nan
    notes = list(trace.notes)
    if trace.hash_ids is not None:
        notes.append(
            "the file's hash_ids (shared prefixes) are not replayed: the harness's prompts never share a prefix"
        )
    return {
        "kind": "trace",
        "path": str(path),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "format": fmt,
        "requests": len(trace),
        "span_s": round(span, 6),
        "mean_rate": round((len(trace) - 1) / span, 6) if span > 0 else None,
        "interarrival_cv": round(cv, 4) if math.isfinite(cv) else None,
        "prompt_tokens": [int(trace.input_tokens.min()), int(trace.input_tokens.max())],
        "output_tokens": [int(trace.output_tokens.min()), int(trace.output_tokens.max())],
        "notes": notes,
    }


def trace_phase(path: str, fmt: str, limit: int | None, max_model_len: int) -> dict:
    """The plan entry of a trace load test; refuses requests the server cannot hold."""
    p = Path(path).resolve()
    trace = read(str(p), fmt, limit)
    fmt = detect_format(p) if fmt == "auto" else fmt
    total = trace.input_tokens + trace.output_tokens
    over = [i for i, t in enumerate(total) if int(t) > max_model_len]
    if over:
        i = over[0]
        raise BundleError(
            f"--trace {path}: {len(over)} of {len(trace)} requests need more than the server's "
            f"max_model_len {max_model_len} tokens (the first, request {i}: input_tokens "
            f"{int(trace.input_tokens[i])} + output_tokens {int(trace.output_tokens[i])}); replay "
            f"lengths as recorded needs a server with a larger --max-model-len, or drop those rows "
            f"from the file (or --trace-limit fewer requests)"
        )
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "-", p.stem).strip("-.") or "file"
    name = f"load_trace_{stem}"
    reqs = [
        [f"{name}-{i}", int(a_in), int(a_out), round(float(t), 6)]
        for i, (t, a_in, a_out) in enumerate(zip(trace.arrival_s, trace.input_tokens, trace.output_tokens, strict=True))
    ]  # a trace's columns: one entry per request
    return {
        "name": name,
        "kind": "load",
        "mode": "open",
        "requests": reqs,
        "rate": None,
        "workload": describe(trace, p, fmt),
    }


def workload_text(ph: dict) -> str:
    """The load a phase ran, in words, from what the plan says it was."""
    w = ph.get("workload") or {}
    if w.get("kind") == "trace":
        rate = f"mean {w['mean_rate']:.3g} req/s" if w.get("mean_rate") else "one burst"
        cv = f", inter-arrival CV {w['interarrival_cv']:.2f}" if w.get("interarrival_cv") is not None else ""
        return f"trace {Path(w['path']).name} ({w['format']}, {w['requests']} requests, {rate}{cv}, as recorded)"
    if ph.get("mode") == "open" and ph.get("rate"):
        return f"Poisson {ph['rate']:g} req/s"
    if ph.get("concurrency") and ph.get("mode") == "closed":
        return f"closed loop, {ph['concurrency']} users"
    return str(ph.get("mode"))
