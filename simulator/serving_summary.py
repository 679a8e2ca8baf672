"""The figures ``vllm bench serve`` prints at the end of a run, computed from a simulation's results.

:func:`serving_summary` returns plain numbers (seconds, tokens, per second); :func:`serving_block`
writes them as vLLM's result block, with the SLO thresholds beside the goodput so that the two can
be read side by side with a real benchmark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simulator import fmt

if TYPE_CHECKING:
    import pandas as pd

    from simulator.engine.results import Results


def peak_concurrency(req: pd.DataFrame) -> int:
    """Most requests in the system at once: arrived and not yet finished (a request without a finish
    time, rejected or unfinished, leaves at its arrival when rejected and stays to the end otherwise)."""
    if req.empty:
        return 0
    arr = req["arrival_s"].to_numpy(dtype=float)
    fin = req["finish_s"].to_numpy(dtype=float).copy()
    if "outcome" in req:
        fin[(req["outcome"] == "rejected").to_numpy()] = arr[(req["outcome"] == "rejected").to_numpy()]
    fin[~np.isfinite(fin)] = np.inf
    times = np.concatenate([arr, fin])
    delta = np.concatenate([np.ones(len(arr)), -np.ones(len(fin))])
    order = np.lexsort((delta, times))  # at equal times departures come first
    return int(np.cumsum(delta[order]).max())


def serving_summary(res: Results) -> dict:
    """Successful and failed requests, duration, total tokens, request / output / total token throughput,
    goodput (requests meeting every SLO per second) with the SLO thresholds and the attainment, the
    configured concurrency of a closed loop and the peak concurrency."""
    s, req, scn = res.summary, res.requests, res.scenario
    done = req[req["outcome"] == "completed"]
    if "warmup" in req:
        done = done[~done["warmup"].to_numpy()]
    dur = float(s["duration_s"])
    arrival = scn.workload.arrival
    good = s["slo_attainment"] * s["requests"] / dur if dur > 0 and s["requests"] else float("nan")
    return {
        "successful_requests": int(s["completed"]),
        "failed_requests": int(s["rejected"] + s["unfinished"]),
        "duration_s": dur,
        "total_input_tokens": int(done["input_tokens"].sum()),
        "total_output_tokens": int(done["output_tokens"].sum()),
        "request_throughput_rps": float(s["throughput_rps"]),
        "output_token_throughput_tps": float(s["output_tokens_per_s"]),
        "total_token_throughput_tps": float(
            s.get("total_tokens_per_s", (done["input_tokens"].sum() + done["output_tokens"].sum()) / dur)
        ),
        "request_goodput_rps": float(good),
        "slo_ttft_s": scn.slo.ttft_s,
        "slo_tpot_s": scn.slo.tpot_s,
        "slo_attainment": float(s["slo_attainment"]),
        "max_concurrency": getattr(arrival, "concurrency", None),
        "peak_concurrency": peak_concurrency(req),
    }


def offered_load(workload, arrival_s) -> dict:
    """The load a run offers.  ``kind``: the arrival kind.  Open loop: ``rate_rps``, requests/s, from the
    scenario (``rate_source: "scenario"``), or, for a trace replayed at its own pace or a shaped rate,
    the arrivals' mean rate (n - 1) / (last - first arrival) (``"arrivals"``; NaN with fewer than two
    distinct times).  Closed loop: ``concurrency`` (users) and ``think_time_s`` (s between a reply and the
    user's next request)."""
    a = workload.arrival
    if a.kind == "closed":
        return {"kind": a.kind, "concurrency": int(a.concurrency), "think_time_s": float(a.think_time_s)}
    rate = getattr(a, "rate", None)
    if rate is not None:
        return {"kind": a.kind, "rate_rps": float(rate), "rate_source": "scenario"}
    t = np.asarray(arrival_s, dtype=float)
    span = float(t.max() - t.min()) if len(t) > 1 else 0.0
    return {"kind": a.kind, "rate_rps": (len(t) - 1) / span if span > 0 else float("nan"), "rate_source": "arrivals"}


def offered_load_text(load: dict) -> str:
    """``load`` (from :func:`offered_load`) as "poisson arrivals at 4.00 req/s" or "closed loop of 32 users"."""
    if load["kind"] == "closed":
        think = f", think time {fmt.duration(load['think_time_s'])}" if load["think_time_s"] else ""
        return f"closed loop of {load['concurrency']:,} users{think}"
    how = " (mean of the arrivals)" if load["rate_source"] == "arrivals" else ""
    return f"{load['kind']} arrivals at {fmt.rate(load['rate_rps'])}{how}"


def slo_text(ttft_s: float | None, tpot_s: float | None) -> str:
    parts = [f"TTFT <= {fmt.duration(ttft_s)}" if ttft_s else "", f"TPOT <= {fmt.duration(tpot_s)}" if tpot_s else ""]
    return ", ".join(p for p in parts if p) or "no SLO"


def serving_block(b: dict, width: int = 50) -> str:
    """``b`` (from :func:`serving_summary`) as vLLM's "Serving Benchmark Result" block."""
    rows = [
        ("Successful requests", f"{b['successful_requests']:,}"),
        ("Failed requests", f"{b['failed_requests']:,}"),
        *([("Maximum request concurrency", str(b["max_concurrency"]))] if b["max_concurrency"] else []),
        ("Peak concurrent requests", f"{b['peak_concurrency']:,}"),
        ("Benchmark duration (s)", f"{b['duration_s']:,.2f}"),
        ("Total input tokens", f"{b['total_input_tokens']:,}"),
        ("Total generated tokens", f"{b['total_output_tokens']:,}"),
        ("Request throughput (req/s)", f"{b['request_throughput_rps']:,.2f}"),
        ("Request goodput (req/s)", f"{b['request_goodput_rps']:,.2f}"),
        ("  SLO", slo_text(b["slo_ttft_s"], b["slo_tpot_s"])),
        ("  SLO attainment", fmt.percent(b["slo_attainment"])),
        ("Output token throughput (tok/s)", f"{b['output_token_throughput_tps']:,.2f}"),
        ("Total token throughput (tok/s)", f"{b['total_token_throughput_tps']:,.2f}"),
    ]
    key_w = max(len(k) for k, _ in rows) + 2
    val_w = max(width - key_w, max(len(v) for _, v in rows))
    lines = [" Serving Benchmark Result (simulated) ".center(key_w + val_w, "=")]
    lines += [f"{k + ':':<{key_w}}{v:>{val_w}}" for k, v in rows]
    lines.append("=" * (key_w + val_w))
    return "\n".join(lines)
