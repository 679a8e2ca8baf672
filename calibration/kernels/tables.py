"""Measured vLLM kernel tables (aiconfigurator-core 0.12.0, Apache-2.0): loading, selection,
held-out shapes, and the kernel-time forms of ``simulator/perf.py`` that the fit uses.

Latencies in the tables are milliseconds; everything here is SI (seconds, bytes, FLOP/s).
See ``calibration/kernels/fit.py`` for the fitting and ``docs/kernel_fit.md`` for the method.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hwdb.schema import EfficiencyCurve
from simulator.inputs import read_yaml

# --------------------------------------------------------------------------- constants

DATASET = "aiconfigurator_vllm_0.24.0"
DATASET_CITE = "aiconfigurator-core 0.12.0 (github ai-dynamo/aiconfigurator, Apache-2.0)"
ENGINE, ENGINE_VERSION = "vllm", "0.24.0"

#: aiconfigurator system name -> canonical hwdb GPU name.
SYSTEMS: dict[str, str] = {"h100_sxm": "H100-SXM-80GB", "h200_sxm": "H200-SXM-141GB", "b200_sxm": "B200-SXM-180GB"}

#: GEMM kernels vLLM 0.24.0 uses by default: (gemm_dtype, kernel_source) per our dtype.
GEMM_KERNELS: dict[str, tuple[str, str]] = {
    "bf16": ("bfloat16", "torch.nn.functional.linear"),
    "fp8": ("fp8", "CutlassFP8ScaledMMLinearKernel"),
}
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0}
ACT_BYTES = 2.0  # activations in and out stay bf16 in both cases

# Fit ranges ("realistic" shapes; see docs/kernel_fit.md for why).
M_MIN, M_MAX = 1, 16384  # tokens in a step
MIN_NK = 256  # smallest layer dimension fitted
ATTN_HEAD_DIMS = (64, 128, 256)  # head sizes of common dense models (FA3 / FlashInfer-TRTLLM)
ATTN_MIN_HEADS = 4  # query heads per GPU
PREFILL_MIN_ISL = 1024  # prefill attention below this is a launch floor (see docs)
DECODE_MIN_CTX = 16  # KV length (tokens) per sequence
DECODE_MAX_BATCH = 512  # sequences per decode step

#: Held-out GEMM shapes (n = output features, k = input features): real layers
#: of Llama-3.1-70B and -8B under tensor parallelism that exist in the grid.
#: vLLM fuses gate and up; the grid lacks the fused width, so one half is used.
HELD_OUT_GEMM: dict[tuple[int, int], str] = {
    (2560, 8192): "Llama-3.1-70B TP4 qkv_proj",
    (8192, 2048): "Llama-3.1-70B TP4 o_proj",
    (7168, 8192): "Llama-3.1-70B TP4 gate|up half",
    (8192, 7168): "Llama-3.1-70B TP4 down_proj",
    (8192, 1024): "Llama-3.1-70B TP8 o_proj",
    (3584, 8192): "Llama-3.1-70B TP8 gate|up half",
    (8192, 3584): "Llama-3.1-70B TP8 down_proj",
    (6144, 4096): "Llama-3.1-8B TP1 qkv_proj",
    (4096, 4096): "Llama-3.1-8B TP1 o_proj",
    (3072, 4096): "Llama-3.1-8B TP2 qkv_proj",
    (4096, 2048): "Llama-3.1-8B TP2 o_proj",
    (7168, 4096): "Llama-3.1-8B TP2 gate|up half",
    (4096, 7168): "Llama-3.1-8B TP2 down_proj",
}
#: Held-out attention head configurations (query heads, KV heads, head_dim) per GPU.
HELD_OUT_ATTN: dict[tuple[int, int, int], str] = {
    (16, 2, 128): "Llama-3.1-70B TP4",
    (8, 1, 128): "Llama-3.1-70B TP8",
    (32, 8, 128): "Llama-3.1-8B TP1",
}

HOLDOUTS = ("models", "every5")


# --------------------------------------------------------------------------- loading


def _table_dir(root: Path, system: str) -> Path:
    return Path(root) / system


def table_paths(root: Path, system: str) -> dict[str, Path]:
    """Paths of the three tables used, keyed as in :func:`load_tables`."""
    d = _table_dir(root, system)
    v = ENGINE_VERSION
    return {
        "gemm": d / "gemm" / "vllm" / v / "gemm_perf.parquet",
        "context_attention": d / "attention" / "vllm" / v / "context_attention_perf.parquet",
        "generation_attention": d / "attention" / "vllm" / v / "generation_attention_perf.parquet",
    }


def load_tables(root: Path, system: str) -> dict[str, pd.DataFrame]:
    """Read the GEMM, context- and generation-attention tables of one system.

    Returns the raw tables (latency still in ms) keyed ``gemm``,
    ``context_attention`` and ``generation_attention``.
    """
    paths = table_paths(root, system)
    missing = [str(p) for p in paths.values() if not p.exists()]
    if missing:
        raise FileNotFoundError(f"kernel tables missing for '{system}': {missing}")
    cols = {
        "gemm": ["m", "n", "k", "gemm_dtype", "kernel_source", "latency"],
        "context_attention": [
            "kernel_source",
            "batch_size",
            "isl",
            "num_heads",
            "num_key_value_heads",
            "head_dim",
            "attn_dtype",
            "kv_cache_dtype",
            "step",
            "window_size",
            "latency",
        ],
        "generation_attention": [
            "kernel_source",
            "batch_size",
            "isl",
            "num_heads",
            "num_key_value_heads",
            "head_dim",
            "attn_dtype",
            "kv_cache_dtype",
            "step",
            "window_size",
            "latency",
        ],
    }
    return {key: pd.read_parquet(p, columns=cols[key]) for key, p in paths.items()}


def load_peaks(root: Path, system: str) -> dict[str, float]:
    """Datasheet peaks from aiconfigurator's ``systems/<system>.yaml``: FLOP/s and bytes/s."""
    path = Path(root) / f"{system}.yaml"
    gpu = read_yaml(path)["gpu"]
    return {"bf16": float(gpu["bfloat16_tc_flops"]), "fp8": float(gpu["fp8_tc_flops"]), "mem_bw": float(gpu["mem_bw"])}


# --------------------------------------------------------------------------- model forms

Curve = tuple[float, float]  # (max_eff, half)


def as_curve(c) -> Curve:
    if isinstance(c, EfficiencyCurve):
        return c.max_eff, c.half
    return float(c[0]), float(c[1])


def efficiency_at(x, c: Curve):
    mx, half = c
    return mx * x / (x + half)


def gemm_bytes(m, n, k, weight_bytes: float):
    """Bytes a linear layer moves: bf16 activations in and out plus the weight."""
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    return (m * k + m * n) * ACT_BYTES + k * n * weight_bytes


def gemm_time(m, n, k, weight_bytes: float, peak_flops: float, mem_bw: float, compute, memory):
    """Linear-layer time in seconds: the slower of the compute and the memory bound."""
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    t_c = 2.0 * m * n * k / (peak_flops * efficiency_at(m, as_curve(compute)))
    b = gemm_bytes(m, n, k, weight_bytes)
    t_m = b / (mem_bw * efficiency_at(b, as_curve(memory)))
    return np.maximum(t_c, t_m)


def prefill_attention_flops(batch, isl, num_heads, head_dim):
    """Causal prefill attention FLOPs: QK^T and PV, 2 FLOPs per MAC, half the square."""
    b, s, h, d = (np.asarray(v, dtype=float) for v in (batch, isl, num_heads, head_dim))
    return 4.0 * b * (s * s / 2.0) * h * d


def prefill_attention_time(batch, isl, num_heads, head_dim, peak_bf16: float, curve):
    tokens = np.asarray(batch, dtype=float) * np.asarray(isl, dtype=float)
    return prefill_attention_flops(batch, isl, num_heads, head_dim) / (
        peak_bf16 * efficiency_at(tokens, as_curve(curve))
    )


def decode_kv_bytes(batch, ctx, num_kv_heads, head_dim, kv_dtype_bytes):
    """KV-cache bytes one decode step reads: K and V for every cached token."""
    b, c, h, d, w = (np.asarray(v, dtype=float) for v in (batch, ctx, num_kv_heads, head_dim, kv_dtype_bytes))
    return b * c * 2.0 * h * d * w


def decode_attention_time(batch, ctx, num_kv_heads, head_dim, kv_dtype_bytes, mem_bw: float, curve):
    kvb = decode_kv_bytes(batch, ctx, num_kv_heads, head_dim, kv_dtype_bytes)
    return kvb / (mem_bw * efficiency_at(kvb, as_curve(curve)))


# --------------------------------------------------------------------------- selection


def select_gemm(gemm: pd.DataFrame) -> pd.DataFrame:
    """Default vLLM kernels, realistic range; adds ``dtype`` (bf16/fp8) and ``t`` (seconds)."""
    parts = []
    for dt, (gdt, src) in GEMM_KERNELS.items():
        sel = gemm[
            (gemm.gemm_dtype == gdt)
            & (gemm.kernel_source == src)
            & gemm.m.between(M_MIN, M_MAX)
            & (gemm.n >= MIN_NK)
            & (gemm.k >= MIN_NK)
        ]
        parts.append(sel.assign(dtype=dt))
    out = pd.concat(parts, ignore_index=True)
    out = out.assign(t=out.latency * 1e-3)
    return out.sort_values(["dtype", "n", "k", "m"], kind="mergesort").reset_index(drop=True)


def attn_common(df: pd.DataFrame) -> pd.DataFrame:
    return df[
        (df.window_size == 0)
        & (df.attn_dtype == "bfloat16")
        & df.head_dim.isin(ATTN_HEAD_DIMS)
        & (df.num_heads >= ATTN_MIN_HEADS)
    ]


def select_prefill(ctx: pd.DataFrame) -> pd.DataFrame:
    """Full-attention prefill with a bf16 KV cache (vLLM's default), isl >= PREFILL_MIN_ISL."""
    sel = attn_common(ctx)
    sel = sel[(sel.kv_cache_dtype == "bfloat16") & (sel.isl >= PREFILL_MIN_ISL)]
    sel = sel.assign(t=sel.latency * 1e-3)
    return sel.sort_values(
        ["num_heads", "num_key_value_heads", "head_dim", "isl", "batch_size"], kind="mergesort"
    ).reset_index(drop=True)


def select_decode(gen: pd.DataFrame, kv_cache_dtype: str = "bfloat16") -> pd.DataFrame:
    """Full-attention decode; adds ``ctx`` = KV length = ``step + isl``.

    In aiconfigurator's generation table ``isl`` is always 1 (the new token) and
    ``step`` is the number of cached tokens before it (2**j - 1); the kernel reads
    ``step + 1`` KV entries per sequence.  Latency grows with ``batch * step`` at
    large sizes (e.g. H200: 8 x 32767 and 64 x 4095 both take 0.27 ms).
    """
    sel = attn_common(gen)
    sel = sel.assign(ctx=sel.step + sel.isl)
    sel = sel[
        (sel.kv_cache_dtype == kv_cache_dtype) & (sel.ctx >= DECODE_MIN_CTX) & (sel.batch_size <= DECODE_MAX_BATCH)
    ]
    sel = sel.assign(t=sel.latency * 1e-3, kv_bytes_per_elem=1.0 if kv_cache_dtype == "fp8" else 2.0)
    return sel.sort_values(
        ["num_heads", "num_key_value_heads", "head_dim", "ctx", "batch_size"], kind="mergesort"
    ).reset_index(drop=True)


def holdout_mask_gemm(df: pd.DataFrame, holdout: str) -> np.ndarray:
    """True for held-out rows: real-model (n, k) pairs, or every 5th distinct pair."""
    pairs = list(zip(df.n.to_numpy(), df.k.to_numpy(), strict=True))  # columns of one frame
    if holdout == "models":
        keys = set(HELD_OUT_GEMM)
    elif holdout == "every5":
        keys = set(sorted(set(pairs))[2::5])
    else:
        raise ValueError(f"holdout must be one of {HOLDOUTS}, got {holdout!r}")
    return np.fromiter((p in keys for p in pairs), dtype=bool, count=len(pairs))


def holdout_mask_attn(df: pd.DataFrame, holdout: str) -> np.ndarray:
    """True for held-out rows: real-model head configurations, or every 5th distinct one."""
    cfgs = list(zip(df.num_heads.to_numpy(), df.num_key_value_heads.to_numpy(), df.head_dim.to_numpy(), strict=True))
    if holdout == "models":
        keys = set(HELD_OUT_ATTN)
    elif holdout == "every5":
        keys = set(sorted(set(cfgs))[2::5])
    else:
        raise ValueError(f"holdout must be one of {HOLDOUTS}, got {holdout!r}")
    return np.fromiter((c in keys for c in cfgs), dtype=bool, count=len(cfgs))
