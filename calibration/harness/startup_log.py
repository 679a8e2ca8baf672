"""Start-up phases of a vLLM server read from its log: weights loaded, torch.compile, CUDA-graph capture,
KV-cache size, engine init, API ready.

:func:`parse_startup_log` matches each line against :data:`STARTUP_PATTERNS`; times are seconds since
the launch (the arrival times :class:`~calibration.harness.server.ServerProcess` stamps on the lines)
or, for lines without them (a saved log), since the log's first time-stamped line; sizes are GiB,
lengths tokens.  Phases the log does not show are simply absent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_LOG_TIME = re.compile(r"\b(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d+))?\b")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"

#: (phase, regex, {group index: field}) in the order they normally appear.
STARTUP_PATTERNS: list[tuple[str, re.Pattern, dict[int, str]]] = [
    ("version", re.compile(r"vLLM API server version (\S+)|\bversion (\d+\.\d+\.\d+\S*)"), {}),
    ("engine_args", re.compile(r"non-default args: (\{.*\})"), {}),
    ("max_model_len", re.compile(r"Using max model len " + _NUM), {1: "tokens"}),
    ("engine_core_start", re.compile(r"Initializing a V1 LLM engine|Initializing an LLM engine"), {}),
    ("model_load_start", re.compile(r"Starting to load model"), {}),
    ("weights_loaded", re.compile(r"Loading weights took " + _NUM + r"\s*s"), {1: "seconds"}),
    (
        "model_loaded",
        re.compile(r"Model loading took " + _NUM + r"\s*(?:GiB|GB)(?: memory)? and " + _NUM + r"\s*s"),
        {1: "gib", 2: "seconds"},
    ),
    ("warmup_start", re.compile(r"Warming up model|Warming up the model|Starting warmup"), {}),
    ("aot_compile_saved", re.compile(r"saved AOT compiled function"), {}),
    (
        "aot_compile_loaded",
        re.compile(r"[Ll]oad(?:ed|ing)? (?:the )?AOT compiled|Directly load the compiled graph"),
        {},
    ),
    ("warmup_done", re.compile(r"Warming up done|Warmup finished|[Ww]arm-?up (?:run )?(?:is )?(?:done|complete)"), {}),
    ("dynamo_transform", re.compile(r"Dynamo bytecode transform time: " + _NUM + r"\s*s"), {1: "seconds"}),
    (
        "graph_compile",
        re.compile(
            r"Compiling a graph for (?:dynamic shape|compile range \S+|general shape) "
            r"takes " + _NUM + r"\s*s"
        ),
        {1: "seconds"},
    ),
    ("torch_compile", re.compile(r"torch\.compile takes " + _NUM + r"\s*s in total"), {1: "seconds"}),
    ("kv_cache_memory", re.compile(r"Available KV cache memory: " + _NUM + r"\s*GiB"), {1: "gib"}),
    ("kv_cache_size", re.compile(r"(?:GPU|CPU|XPU|TPU|HPU)? ?KV cache size: " + _NUM + r" tokens"), {1: "tokens"}),
    (
        "max_concurrency",
        re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + "x"),
        {1: "tokens_per_request", 2: "concurrency"},
    ),
    (
        "cuda_graph_capture",
        re.compile(r"Graph capturing finished in " + _NUM + r"\s*secs?(?:, took " + _NUM + r"\s*GiB)?"),
        {1: "seconds", 2: "gib"},
    ),
    ("engine_init", re.compile(r"init engine \(.*?\) took " + _NUM + r"\s*s"), {1: "seconds"}),
    ("api_server_start", re.compile(r"Starting vLLM (?:API )?server(?: \d+)? on (\S+)"), {}),
    ("api_ready", re.compile(r"Application startup complete"), {}),
]


def _log_clock(line: str) -> float | None:
    """Seconds since the start of the month from vLLM's ``MM-DD hh:mm:ss`` prefix (year-less)."""
    m = _LOG_TIME.search(line)
    if not m:
        return None
    _mo, dd, hh, mi, ss, frac = m.groups()
    return ((int(dd) * 24 + int(hh)) * 60 + int(mi)) * 60 + int(ss) + (float("0." + frac) if frac else 0.0)


def parse_startup_log(lines: Iterable[str | tuple[float, str]]) -> dict:
    """Start-up phases from a vLLM log.

    ``lines`` are plain strings or ``(t, line)`` with ``t`` seconds since the launch (arrival
    time stamped by :class:`ServerProcess`).  Without arrival times the log's own clock is used,
    relative to its first time-stamped line (one-second resolution).  Returns
    ``{"events": [...], "summary": {...}}``; every event has ``phase``, ``t`` (seconds since
    launch, or since the first log line) and the numbers its line carries (``seconds``, ``gib``,
    ``tokens``...).  The summary has ``<phase>_t`` for every phase seen and the durations vLLM
    logs itself (``weights_load_s``, ``torch_compile_s``, ``cuda_graph_capture_s``,
    ``engine_init_s``...) or that follow from two events (``warmup_s``: the CPU backend's
    "Warming up model for the compilation" to "Warming up done").  Phases absent from the log are absent from both.
    """
    events: list[dict] = []
    t0_clock: float | None = None
    seen: set[str] = set()
    last_t = None
    for item in lines:
        t, line = item if isinstance(item, tuple) else (None, item)
        clock = _log_clock(line)
        if clock is not None and t0_clock is None:
            t0_clock = clock
        if t is None:
            # uvicorn's own lines carry no clock: they inherit the previous line's
            t = clock - t0_clock if clock is not None and t0_clock is not None else last_t
        last_t = t
        for phase, rx, fields in STARTUP_PATTERNS:
            m = rx.search(line)
            if not m:
                continue
            if phase in seen and phase not in (
                "graph_compile",
                "dynamo_transform",
                "weights_loaded",
                "model_loaded",
                "cuda_graph_capture",
            ):
                continue
            if phase == "version" and "version" in seen:
                continue
            ev: dict = {"phase": phase, "t": None if t is None else round(t, 3)}
            for g, name in fields.items():
                if m.group(g) is not None:
                    ev[name] = float(m.group(g).replace(",", ""))
            if phase == "version":
                ev["version"] = m.group(1) or m.group(2)
            elif phase == "engine_args":
                ev["text"] = m.group(1)
            elif phase == "api_server_start":
                ev["url"] = m.group(1)
            events.append(ev)
            seen.add(phase)
    summary: dict = {}
    for ev in events:
        summary.setdefault(f"{ev['phase']}_t", ev["t"])
    durations = {
        "weights_loaded": "weights_load_s",
        "model_loaded": "model_load_s",
        "torch_compile": "torch_compile_s",
        "cuda_graph_capture": "cuda_graph_capture_s",
        "engine_init": "engine_init_s",
        "dynamo_transform": "dynamo_transform_s",
        "graph_compile": "graph_compile_s",
    }
    for ev in events:
        key = durations.get(ev["phase"])
        if key and "seconds" in ev:
            # several workers (TP ranks) or several compiled graphs: the sum is the time spent
            # by one worker only when there is one; keep the maximum per phase, a safe reading.
            summary[key] = max(summary.get(key, 0.0), ev["seconds"])
    if summary.get("warmup_start_t") is not None and summary.get("warmup_done_t") is not None:
        summary["warmup_s"] = round(summary["warmup_done_t"] - summary["warmup_start_t"], 3)
    for ev in events:
        if ev["phase"] == "kv_cache_size":
            summary["kv_cache_tokens"] = int(ev["tokens"])
        if ev["phase"] == "model_loaded" and "gib" in ev:
            summary["weights_gib"] = ev["gib"]
        if ev["phase"] == "cuda_graph_capture" and "gib" in ev:
            summary["cuda_graph_gib"] = ev["gib"]
        if ev["phase"] == "version":
            summary["vllm_version"] = ev["version"]
    return {"events": events, "summary": summary}
