"""Replay of LLMServingSim's ShareGPT-300 vLLM runs: measured against epdsim's prediction.

casys-kaist/LLMServingSim (MIT) published real vLLM 0.19.0 serving measurements of one workload,
300 ShareGPT requests arriving at about 10 req/s, on workstation GPUs:

* ``rtx4090-llama8b``  Llama-3.1-8B, 1x GeForce RTX 4090, TP1
* ``pro6000-llama8b``  Llama-3.1-8B, 1x RTX PRO 6000 Blackwell Server Edition, TP1
* ``pro6000-qwen32b``  Qwen3-32B, 2x RTX PRO 6000 Blackwell Server Edition, TP2 (PCIe, no NVLink)

The figures in :data:`RUNS` were computed here from their per-request records
(``bench/examples/<HW>/<model>/vllm/requests.jsonl`` at commit :data:`COMMIT`) with their definitions
(``bench/README.md``): TTFT = first token - engine queue entry, TPOT = (last - first token) /
(output tokens - 1), E2E = last token - queue entry, throughput = output tokens / (last token - first
queue entry); they reproduce the ``vLLM`` column of each run's ``validation/summary.txt``.  The mean of
``running`` in ``vllm/timeseries.csv`` (one sample a second) is the measured concurrency.  Only the
measured facts are used, none of that project's code.

The same requests (``../shared/data/traces/sharegpt300/{llama3,qwen3}_tokenizer.jsonl``, the
runs' token counts and arrival offsets) are replayed through :func:`simulator.run.simulate` with the
runs' engine arguments (``vllm/meta.json``).  The anchor of the measured latencies is the engine's
queue entry, after the API server, so the predicted TTFT and E2E leave out the simulated front end
(``frontend_s``).  ``python -m calibration.validation.sharegpt_replay`` prints the table; the reading is in
docs/validation/sharegpt.md.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from simulator.run import simulate
from simulator.scenario import Scenario, parse_scenario

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
TRACE_DIR = Path("data/traces/sharegpt300")  # under the shared folder

SOURCE_REPO = "casys-kaist/LLMServingSim"
COMMIT = "5daddb21a545658d5150b535712d0494584b5278"  # 2026-08-21 "Key bench/examples by hardware, ..."

# Metric name -> (unit the table uses, scale from epdsim's seconds).
UNITS = {
    "ttft_mean_s": 1.0,
    "ttft_p50_s": 1.0,
    "ttft_p90_s": 1.0,
    "ttft_p99_s": 1.0,
    "tpot_mean_ms": 1e3,
    "tpot_p50_ms": 1e3,
    "tpot_p90_ms": 1e3,
    "tpot_p99_ms": 1e3,
    "e2e_mean_s": 1.0,
    "e2e_p90_s": 1.0,
    "output_tokens_per_s": 1.0,
    "duration_s": 1.0,
    "mean_running_seqs": 1.0,
    "kv_cache_tokens": 1.0,
}
# The figures the headline comparison (and tests/test_sharegpt_replay.py) is about; the others are
# reported for the reading (tails, concurrency, KV capacity).
HEADLINE = ("ttft_mean_s", "ttft_p90_s", "tpot_mean_ms", "tpot_p90_ms", "e2e_mean_s", "output_tokens_per_s")


@dataclass(frozen=True)
class Run:
    """One measured vLLM run: deployment, engine arguments, measured figures and where they are."""

    name: str
    model: str  # epdsim model name
    gpu: str  # epdsim GPU name
    tp: int
    trace: str  # file under ../shared/data/traces/sharegpt300
    engine: dict  # epdsim EngineConfig fields, as the run set them
    measured: dict  # metric -> value, units as the metric's suffix
    source: str  # folder under bench/examples at COMMIT
    notes: str = ""
    dtype: str = "bf16"
    extra: dict = field(default_factory=dict)


RUNS: tuple[Run, ...] = (
    Run(
        name="rtx4090-llama8b",
        model="Llama-3.1-8B",
        gpu="RTX-4090",
        tp=1,
        trace="llama3_tokenizer.jsonl",
        # meta.json engine_kwargs: max_num_seqs 256, max_num_batched_tokens 2048, max_model_len 32768,
        # dtype bfloat16, kv_cache_dtype auto; kv_cache: gpu_memory_utilization 0.9, block_size 16,
        # prefix caching on, 2588 GPU blocks = 41408 KV tokens (profiled by vLLM, used as a check only).
        engine={
            "max_num_seqs": 256,
            "max_num_batched_tokens": 2048,
            "max_model_len": 32768,
            "gpu_memory_utilization": 0.9,
            "block_size": 16,
            "enable_prefix_caching": True,
        },
        measured={
            "ttft_mean_s": 65.4566,
            "ttft_p50_s": 60.1109,
            "ttft_p90_s": 121.1217,
            "ttft_p99_s": 137.3563,
            "tpot_mean_ms": 32.4466,
            "tpot_p50_ms": 30.7593,
            "tpot_p90_ms": 38.1268,
            "tpot_p99_ms": 56.0039,
            "e2e_mean_s": 86.5783,
            "e2e_p90_s": 141.6009,
            "output_tokens_per_s": 1066.38,
            "duration_s": 183.568,
            "mean_running_seqs": 32.30,
            "kv_cache_tokens": 41408,
        },
        source="bench/examples/RTX4090/Llama-3.1-8B",
        notes="vLLM 0.19.0, torch 2.10.0+cu128, GeForce RTX 4090 (25,250,627,584 bytes); KV-cache bound "
        "(kv_cache_pct reaches 100 %, at most 49 running)",
    ),
    Run(
        name="pro6000-llama8b",
        model="Llama-3.1-8B",
        gpu="RTX-PRO-6000-Blackwell-Server",
        tp=1,
        trace="llama3_tokenizer.jsonl",
        # meta.json engine_kwargs: max_num_seqs 128, max_num_batched_tokens 2048, max_model_len null
        # (model default, 131072), dtype bfloat16, kv_cache_dtype auto; gpu_memory_utilization not
        # recorded: vLLM's default 0.9 (the run's LLMServingSim config.json also says mem_util 0.9).
        engine={
            "max_num_seqs": 128,
            "max_num_batched_tokens": 2048,
            "gpu_memory_utilization": 0.9,
            "block_size": 16,
            "enable_prefix_caching": True,
        },
        measured={
            "ttft_mean_s": 7.0972,
            "ttft_p50_s": 9.4427,
            "ttft_p90_s": 16.8527,
            "ttft_p99_s": 19.7553,
            "tpot_mean_ms": 32.4580,
            "tpot_p50_ms": 33.4246,
            "tpot_p90_ms": 36.4849,
            "tpot_p99_ms": 37.3442,
            "e2e_mean_s": 28.2007,
            "e2e_p90_s": 35.4507,
            "output_tokens_per_s": 2969.26,
            "duration_s": 65.926,
            "mean_running_seqs": 94.88,
        },
        source="bench/examples/RTXPRO6000/Llama-3.1-8B",
        notes="vLLM 0.19.0; max_num_seqs bound (128 running at the peak, up to 104 waiting)",
    ),
    Run(
        name="pro6000-qwen32b",
        model="Qwen3-32B",
        gpu="RTX-PRO-6000-Blackwell-Server",
        tp=2,
        trace="qwen3_tokenizer.jsonl",
        # meta.json engine_kwargs: tensor_parallel_size 2, max_num_seqs 128, max_num_batched_tokens
        # 2048, max_model_len null (40960), dtype bfloat16, kv_cache_dtype auto.
        engine={
            "max_num_seqs": 128,
            "max_num_batched_tokens": 2048,
            "gpu_memory_utilization": 0.9,
            "block_size": 16,
            "enable_prefix_caching": True,
        },
        measured={
            "ttft_mean_s": 36.9052,
            "ttft_p50_s": 40.7018,
            "ttft_p90_s": 84.3187,
            "ttft_p99_s": 93.3471,
            "tpot_mean_ms": 80.3111,
            "tpot_p50_ms": 84.2773,
            "tpot_p90_ms": 94.5493,
            "tpot_p99_ms": 97.0837,
            "e2e_mean_s": 90.4081,
            "e2e_p90_s": 118.2563,
            "output_tokens_per_s": 1249.50,
            "duration_s": 159.653,
            "mean_running_seqs": 101.08,
        },
        source="bench/examples/RTXPRO6000/Qwen3-32B",
        notes="vLLM 0.19.0; TP2 over PCIe (the RTX PRO 6000 has no NVLink); max_num_seqs bound",
    ),
)


def shared_dir(shared: str | Path | None = None) -> Path:
    return Path(shared) if shared is not None else SHARED


def scenario(run: Run, shared: str | Path | None = None) -> Scenario:
    """The epdsim scenario of ``run``: one colocated instance, the trace replayed as recorded."""
    path = shared_dir(shared) / TRACE_DIR / run.trace
    return parse_scenario(
        {
            "name": f"sharegpt300-{run.name}",
            "description": f"{run.model} on {run.tp}x {run.gpu}: LLMServingSim ShareGPT-300 vLLM run "
            f"({SOURCE_REPO}@{COMMIT[:7]}:{run.source})",
            "seed": 0,
            "model": run.model,
            "pools": [{"name": "main", "gpu": run.gpu, "tp": run.tp, "dtype": run.dtype, "engine": run.engine}],
            "workload": {"arrival": {"kind": "trace", "path": str(path), "format": "plain"}},
        },
        origin=f"calibration.validation.sharegpt_replay[{run.name}]",
    )


def predict(run: Run, shared: str | Path | None = None) -> tuple[dict, dict]:
    """(predicted metrics in the units of :data:`UNITS`, run facts: completed, requests, preemptions)."""
    res = simulate(scenario(run, shared))
    req = res.requests
    done = req[req["outcome"] == "completed"]
    # Engine-side latencies: the measured anchor is vLLM's queue entry, after the API server.
    front = done["frontend_s"].fillna(0.0) if "frontend_s" in done else 0.0
    ttft = (done["ttft_s"] - front).to_numpy()
    e2e = (done["e2e_s"] - front).to_numpy()
    tpot = done["tpot_s"].dropna().to_numpy()
    s = res.summary

    def q(x, p: float) -> float:
        return float(pd.Series(x).quantile(p / 100.0))  # linear interpolation, as numpy's default

    pred = {
        "ttft_mean_s": float(ttft.mean()),
        "ttft_p50_s": q(ttft, 50),
        "ttft_p90_s": q(ttft, 90),
        "ttft_p99_s": q(ttft, 99),
        "tpot_mean_ms": float(tpot.mean()) * 1e3,
        "tpot_p50_ms": q(tpot, 50) * 1e3,
        "tpot_p90_ms": q(tpot, 90) * 1e3,
        "tpot_p99_ms": q(tpot, 99) * 1e3,
        "e2e_mean_s": float(e2e.mean()),
        "e2e_p90_s": q(e2e, 90),
        "output_tokens_per_s": float(s["output_tokens_per_s"]),
        "duration_s": float(s["duration_s"]),
        "mean_running_seqs": float(s["mean_batch_size"]),
        "kv_cache_tokens": float(res.info["kv_cache_tokens_per_instance"]),
    }
    facts = {
        "requests": int(s["requests"]),
        "completed": int(s["completed"]),
        "rejected": int(s["rejected"]),
        "unfinished": int(s["unfinished"]),
        "preemptions": int(s["preemptions"]),
        "perf_model": res.info["perf_model"],
    }
    return pred, facts


def table(shared: str | Path | None = None, runs: tuple[Run, ...] = RUNS) -> tuple[pd.DataFrame, dict]:
    """Rows (run, metric, measured, predicted, error) with error = predicted / measured - 1, and the
    per-run facts of the simulation (completed requests, preemptions, perf model)."""
    rows, facts = [], {}
    for run in runs:
        pred, facts[run.name] = predict(run, shared)
        for metric, meas in run.measured.items():
            p = pred[metric]
            rows.append(
                {
                    "run": run.name,
                    "metric": metric,
                    "measured": float(meas),
                    "predicted": p,
                    "error": (p / meas - 1.0) if meas else math.nan,
                }
            )
    return pd.DataFrame(rows, columns=["run", "metric", "measured", "predicted", "error"]), facts


def format_table(df: pd.DataFrame) -> str:
    lines = [f"{'run':<17} {'metric':<20} {'measured':>11} {'predicted':>11} {'error':>8}", "-" * 71]
    for r in df.itertuples(index=False):
        mark = "" if r.metric in HEADLINE else "  (info)"
        lines.append(f"{r.run:<17} {r.metric:<20} {r.measured:>11.4g} {r.predicted:>11.4g} {r.error:>+8.1%}{mark}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m calibration.validation.sharegpt_replay", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--shared", default=None, help=f"the shared data folder (default {SHARED})")
    ap.add_argument("--csv", default=None, help="also write the table to this CSV file")
    args = ap.parse_args(argv)
    if not (shared_dir(args.shared) / TRACE_DIR).is_dir():
        print(f"no {TRACE_DIR} under {shared_dir(args.shared)}: give --shared")
        return 2
    df, facts = table(args.shared)
    print(f"measured: {SOURCE_REPO}@{COMMIT} bench/examples/*/vllm (vLLM 0.19.0); error = predicted/measured - 1")
    print(format_table(df))
    print()
    for name, f in facts.items():
        print(f"{name}: {f['completed']}/{f['requests']} completed, {f['preemptions']} preemptions; {f['perf_model']}")
    head = df[df["metric"].isin(HEADLINE)]
    worst = head.loc[head["error"].abs().groupby(head["run"]).idxmax()]
    print(
        "worst headline error per run: "
        + ", ".join(f"{r.run} {r.metric} {r.error:+.1%}" for r in worst.itertuples(index=False))
    )
    if args.csv:
        df.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
