"""Per-run figures read from the five anyscale terminal logs the sourced start-ups cite
(github.com/anyscale/ray-serve-llm-perf-examples, ``replica_initialization/experiment_terminal_output/``:
one p5.48xlarge with 8x H100, vLLM 0.11 dev): phase seconds, bytes loaded per rank and layer counts, from
which :mod:`calibration.coldstart.holdout` re-derives the ranges those runs feed."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class AnyscaleRun:
    """Per-run figures of one anyscale log (seconds; ``(min, max)`` over the ranks)."""

    model: str  # "llama70b" (Meta-Llama-3-70B, TP4), "qwen235b" (Qwen3-235B-A22B, TP8)
    tp: int
    init_s: float  # 'Waiting for init message' (engine) -> 'Starting to load model'
    capture_s: float  # 'Graph capturing finished in N secs'
    dynamo_s: tuple[float, float]  # 'Dynamo bytecode transform time'
    weights_s: tuple[float, float] | None = None  # 'Loading weights took' from the page cache (None: S3 streamer)
    compile_s: tuple[float, float] | None = None  # 'Compiling a graph for dynamic shape takes' (cold cache)
    hit_s: tuple[float, float] | None = None  # 'Directly load the compiled graph(s) ... took' (warm cache)


# Read from the five logs of the cases (timestamps of the engine process and worker lines).
ANYSCALE_RUNS = {
    "anyscale/llama70b-base": AnyscaleRun(
        "llama70b", 4, 22.0, 16.0, (12.05, 12.38), (15.82, 16.46), compile_s=(46.70, 49.91)
    ),  # 11:52:55 -> 11:53:17
    "anyscale/llama70b-s3-runai": AnyscaleRun(
        "llama70b", 4, 21.0, 16.0, (12.22, 12.70), compile_s=(47.35, 49.95)
    ),  # 12:05:37 -> 12:05:58
    "anyscale/llama70B-compile-cache": AnyscaleRun(
        "llama70b", 4, 20.0, 16.0, (11.75, 12.25), (16.08, 16.19), hit_s=(3.830, 3.870)
    ),  # 13:38:15 -> 13:38:35
    "anyscale/qwen235B-base": AnyscaleRun(
        "qwen235b", 8, 34.0, 44.0, (17.03, 18.01), (32.11, 32.67), compile_s=(92.91, 96.30)
    ),  # 14:43:40 -> 14:44:14
    "anyscale/qwen235B-compile-cache": AnyscaleRun(
        "qwen235b", 8, 34.0, 44.0, (16.74, 17.06), (31.97, 32.83), hit_s=(5.530, 5.702)
    ),  # 15:43:03 -> 15:43:37
}
# Bytes each rank loads, from the logs' 'Model loading took N GiB'.
RANK_BYTES = {"llama70b": 32.8601 * GIB, "qwen235b": 54.9205 * GIB}
LAYERS = {"llama70b": 80, "qwen235b": 94}  # Meta-Llama-3-70B: 80 dense; Qwen3-235B-A22B: 94 MoE layers
