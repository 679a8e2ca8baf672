"""Check the step-time model against kernel measurements that no fit used.

Two independent sources, read from ``../shared/data/kernels`` (facts only; no
file is copied into this repository):

* Vidur (github microsoft/vidur, MIT): per-operator GPU times of
  Llama-2-70B layers on H100 at TP 1/2/4/8 (``compute_h100_..._mlp.csv``,
  milliseconds per operator per layer, medians over repeats), and NCCL
  all-reduce kernel times on a DGX H100 (``network_h100_dgx_all_reduce.csv``;
  ``size`` is bytes: Vidur's profiler logs ``elements * 2``).
* aiconfigurator (github ai-dynamo/aiconfigurator, Apache-2.0), vLLM 0.24.0
  collection: ``comm/nccl/2.29.2/nccl_perf.parquet`` (nccl-tests, fp16) and
  ``comm/vllm/0.24.0/custom_allreduce_perf.parquet`` (vLLM's
  ``tensor_model_parallel_all_reduce`` under a CUDA graph, bf16).  In both,
  ``message_size`` counts *elements* (the collectors log ``bytes // 2`` and the
  tensor's numel), so bytes = 2 x message_size; latency is milliseconds.

The model side reproduces :meth:`simulator.stepmodel.StepModel.step_time` term by
term from a built :class:`~simulator.stepmodel.StepModel`; nothing here changes the
simulator.  ``docs/validation/perf.md`` reports the results and
``tests/test_perf_validation.py`` and ``tests/test_perf_vs_measured.py`` lock them in.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from hwdb.models import ModelArch
from hwdb.schema import DTYPE_BYTES, WEIGHT_BYTES
from simulator.perf import Deployment
from simulator.step_build import compute_curve
from simulator.stepmodel import StepModel

VIDUR = "vidur"
VIDUR_LINEAR_CSV = "compute_h100_meta-llama_Llama-2-70b-hf_mlp.csv"
VIDUR_ALLREDUCE_CSV = "network_h100_dgx_all_reduce.csv"
AIC = "aiconfigurator_vllm_0.24.0"
AIC_NCCL = "comm/nccl/2.29.2/nccl_perf.parquet"
AIC_VLLM = "comm/vllm/0.24.0/custom_allreduce_perf.parquet"

#: Vidur operators that are linear layers: fused QKV, O, fused gate+up, down.
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")

#: Token-count regimes of the linear comparison (inclusive bounds).
MEMORY_BOUND_MAX_TOKENS = 64
COMPUTE_BOUND_MIN_TOKENS = 512

#: All-reduce size bands (bytes), named by the tokens they hold at hidden 8192 in bf16.
AR_MIN_BYTES, AR_MAX_BYTES = 8192 * 2 * 1, 8192 * 2 * 8192
AR_BANDS: tuple[tuple[str, float, float], ...] = (
    ("16-256 KiB (1-16 tok)", 16 * 2**10, 256 * 2**10),
    ("256 KiB-2 MiB (16-128 tok)", 256 * 2**10, 2 * 2**20),
    ("2-16 MiB (128-1k tok)", 2 * 2**20, 16 * 2**20),
    ("16-128 MiB (1k-8k tok)", 16 * 2**20, 128 * 2**20),
)


# --------------------------------------------------------------------------- model side


def linear_weight_bytes(arch: ModelArch, tp: int, dtype: str = "bf16") -> float:
    """Bytes of the decoder layers' linear weights one TP rank reads per step.

    For a dense model this is every layer's QKV, O, gate/up and down weights
    (no embedding table, no LM head), which is what Vidur's four linear
    operators time.  For an MoE model it counts active experts only.
    """
    return arch.linear_params_per_token * DTYPE_BYTES[dtype] / tp


def linear_time(sm: StepModel, tokens: int, weight_bytes: float | None = None) -> float:
    """The linear-layer part of ``StepModel.step_time`` for a step of ``tokens`` new tokens: the dense
    layers' roofline ``max(*sm.linear_time(tokens))`` plus the routed experts' (``sm.moe_time``), with no
    LM head rows, attention, element-wise kernels, all-reduce or host overhead.

    ``weight_bytes`` replaces the dense weights the step streams (``dense_weight_bytes``: the decoder
    layers and the LM head, not the input embedding); pass :func:`linear_weight_bytes` for a dense model
    to compare with per-layer operator timings.  The memory side keeps ``mem_floor_bytes = 4 x layers x
    meff.half`` (a token crosses every stage): the memory curve was fitted per GEMM, ``B / (BW * me(B)) =
    (B + half) / (BW * max_eff)``, so each of the four GEMMs of a layer pays ``half / (BW * max_eff)``
    (about 3.5 us on H100).
    """
    if tokens <= 0:
        return 0.0
    t_comp, t_mem = sm.linear_time(tokens)
    if weight_bytes is not None:
        t_mem += (weight_bytes - sm.dense_weight_bytes) * sm.pp / (sm.peak_bw * sm.meff.max_eff)
    return max(t_comp, t_mem) + sm.moe_time(tokens * sm.moe_token_scale, tokens)


def allreduce_time(sm: StepModel, message_bytes: float) -> float:
    """One TP all-reduce of ``message_bytes`` as ``step_time`` charges it in a CUDA graph
    (``StepModel.allreduce_time``: the profile's measured curve, else a ring over the link)."""
    return sm.allreduce_time(message_bytes)


# --------------------------------------------------------------------------- measured side


def load_vidur_linear(path: Path, num_layers: int) -> pd.DataFrame:
    """Vidur's linear-operator time per step: columns ``tp``, ``tokens``, ``measured_s``.

    Sums the medians of the four linear operators of one layer (ms), averages
    rows repeated for the same (TP, tokens), and multiplies by ``num_layers``.
    """
    cols = [f"time_stats.{op}.median" for op in LINEAR_OPS]
    d = pd.read_csv(path, usecols=cols + ["num_tokens", "num_tensor_parallel_workers"])
    d["layer_ms"] = d[cols].sum(axis=1)
    g = d.groupby(["num_tensor_parallel_workers", "num_tokens"], as_index=False)["layer_ms"].mean()
    return pd.DataFrame(
        {
            "tp": g["num_tensor_parallel_workers"].astype(int),
            "tokens": g["num_tokens"].astype(int),
            "measured_s": g["layer_ms"] * 1e-3 * num_layers,
        }
    )


def load_vidur_allreduce(path: Path) -> pd.DataFrame:
    """Vidur's NCCL all-reduce kernel times: columns ``gpus``, ``bytes``, ``measured_s``."""
    d = pd.read_csv(path, usecols=["num_workers", "size", "collective", "time_stats.all_reduce.median"])
    d = d[d["collective"] == "all_reduce"]
    g = d.groupby(["num_workers", "size"], as_index=False)["time_stats.all_reduce.median"].mean()
    return pd.DataFrame(
        {
            "gpus": g["num_workers"].astype(int),
            "bytes": g["size"].astype(float),
            "measured_s": g["time_stats.all_reduce.median"] * 1e-3,
        }
    )


def load_aic_allreduce(path: Path) -> pd.DataFrame:
    """aiconfigurator all-reduce latencies: columns ``gpus``, ``bytes``, ``measured_s``.

    NCCL table: fp16 rows.  vLLM table: the CUDA-graph backend (what vLLM runs
    when the step fits a captured graph).  ``message_size`` is elements of 2 bytes.
    """
    d = pd.read_parquet(path)
    d = d[d["op_name"] == "all_reduce"]
    if "nccl_dtype" in d.columns:
        d = d[d["nccl_dtype"] == "half"]
    if "backend" in d.columns:
        d = d[d["backend"] == "vllm_graph"]
    g = d.groupby(["num_gpus", "message_size"], as_index=False)["latency"].median()
    return pd.DataFrame(
        {
            "gpus": g["num_gpus"].astype(int),
            "bytes": g["message_size"].astype(float) * 2.0,
            "measured_s": g["latency"] * 1e-3,
        }
    )


# --------------------------------------------------------------------------- comparisons


def summarize(err: pd.Series | np.ndarray) -> dict[str, float]:
    """n, median and p90 of |err|, and the signed median, of relative errors ``model/measured - 1``."""
    e = np.asarray(err, dtype=float)
    a = np.abs(e)
    return {
        "n": int(e.size),
        "median": float(np.median(a)),
        "p90": float(np.quantile(a, 0.9)),
        "signed_median": float(np.median(e)),
    }


def compare_linear(
    models: dict[int, StepModel], arch: ModelArch, measured: pd.DataFrame, dtype: str = "bf16"
) -> pd.DataFrame:
    """Model vs measured linear time per step; ``models`` maps TP degree to a StepModel.

    Adds columns ``model_s`` (:func:`linear_time`, per-layer weights only), ``err``
    and ``regime`` ('memory' for tokens <= 64, 'compute' for >= 512, else 'ridge').
    """
    out = measured.copy()
    out["model_s"] = [
        linear_time(models[tp], t, linear_weight_bytes(arch, tp, dtype))
        for tp, t in zip(out["tp"], out["tokens"], strict=True)
    ]
    out["err"] = out["model_s"] / out["measured_s"] - 1.0
    out["regime"] = regime_of(out["tokens"])
    return out


def regime_of(tokens) -> np.ndarray:
    """'memory' for tokens (GEMM m) <= 64, 'compute' for >= 512, 'ridge' between."""
    t = np.asarray(tokens)
    return np.where(t <= MEMORY_BOUND_MAX_TOKENS, "memory", np.where(t >= COMPUTE_BOUND_MIN_TOKENS, "compute", "ridge"))


def compare_allreduce(
    models: dict[int, StepModel], measured: pd.DataFrame, lo: float = AR_MIN_BYTES, hi: float = AR_MAX_BYTES
) -> pd.DataFrame:
    """Model vs measured all-reduce time for GPU counts in ``models``, messages in [lo, hi] bytes.

    Adds ``model_s``, ``err`` and ``band`` (the :data:`AR_BANDS` label).
    """
    m = measured[measured["gpus"].isin(list(models)) & measured["bytes"].between(lo, hi)].copy()
    m["model_s"] = [allreduce_time(models[g], b) for g, b in zip(m["gpus"], m["bytes"], strict=True)]
    m["err"] = m["model_s"] / m["measured_s"] - 1.0
    m["band"] = [band_of(b) for b in m["bytes"]]
    return m


def band_of(nbytes: float) -> str:
    for name, lo, hi in AR_BANDS:
        if lo <= nbytes < hi or (hi == AR_BANDS[-1][2] and nbytes == hi):
            return name
    return "out of range"


def error_table(df: pd.DataFrame, by: list[str], err: str = "err") -> pd.DataFrame:
    """One row per group: n, median |err|, p90 |err|, signed median (fractions)."""
    rows = []
    for key, g in df.groupby(by, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key, strict=True)), **summarize(g[err])})  # one key value per column
    return pd.DataFrame(rows)


def format_table(df: pd.DataFrame) -> str:
    """Markdown table; error columns printed as percentages."""
    cols = list(df.columns)
    pct = {"median", "p90", "signed_median"}
    head = (
        "| "
        + " | ".join(
            "median |err|"
            if c == "median"
            else "p90 |err|"
            if c == "p90"
            else "signed median"
            if c == "signed_median"
            else c
            for c in cols
        )
        + " |"
    )
    lines = [head, "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        cells = []
        for c, v in zip(cols, r, strict=True):
            if c in pct:
                cells.append(f"{100 * v:+.1f} %" if c == "signed_median" else f"{100 * v:.1f} %")
            else:
                cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def interp_measured(measured: pd.DataFrame, gpus: int, nbytes: float) -> float:
    """Measured all-reduce time at ``nbytes`` for ``gpus`` GPUs, log-log interpolated (NaN outside the data)."""
    m = measured[measured["gpus"] == gpus].sort_values("bytes")
    if m.empty or not m["bytes"].iloc[0] <= nbytes <= m["bytes"].iloc[-1]:
        return float("nan")
    return float(np.exp(np.interp(np.log(nbytes), np.log(m["bytes"]), np.log(m["measured_s"]))))


# --------------------------------------------------------------------------- source cross-check

AIC_GEMM = "gemm/vllm/0.24.0/gemm_perf.parquet"
#: vLLM 0.24.0's default linear kernel per weight dtype, as aiconfigurator's GEMM table names it.
AIC_GEMM_KERNELS = {
    "bf16": ("bfloat16", "torch.nn.functional.linear"),
    "fp8": ("fp8", "CutlassFP8ScaledMMLinearKernel"),
}


def load_aic_gemm(path: Path, dtype: str) -> pd.Series:
    """aiconfigurator GEMM latencies (seconds, median of repeats) of vLLM's default ``dtype`` kernel, by (m, n, k)."""
    gemm_dtype, kernel = AIC_GEMM_KERNELS[dtype]
    g = pd.read_parquet(path, columns=["m", "n", "k", "gemm_dtype", "kernel_source", "latency"])
    g = g[(g["gemm_dtype"] == gemm_dtype) & (g["kernel_source"] == kernel)]
    return g.groupby(["m", "n", "k"])["latency"].median() * 1e-3


def dense_layer_gemms(arch: ModelArch, tp: int) -> dict[str, tuple[int, int]]:
    """(n, k) = (output, input) features of one rank's four GEMMs, keyed by Vidur operator name."""
    h, d = arch.hidden_size, arch.head_dim
    return {
        "attn_pre_proj": ((arch.num_heads + 2 * arch.num_kv_heads) * d // tp, h),
        "attn_post_proj": (h, arch.num_heads * d // tp),
        "mlp_up_proj": (2 * arch.intermediate_size // tp, h),
        "mlp_down_proj": (h, arch.intermediate_size // tp),
    }


def gemm_time(dep: Deployment, m: int, n: int, k: int, dtype: str = "bf16") -> float:
    """One GEMM as the step model prices it (docs/kernel_fit.md): ``max(2mnk / (P ce(m)), B / (BW me(B)))``,
    ``B = (mk + mn) 2 + kn w``, with ``ce`` the deployment's compute curve for this one (n, k) shape in
    ``dtype`` (:func:`simulator.step_build.compute_curve`) and ``w`` the dtype's bytes per weight."""
    prof, g = dep.profile, dep.gpu
    meff = prof.memory_efficiency if prof and prof.memory_efficiency else g.memory_efficiency
    ce = compute_curve(dep, dtype, [(float(n * k), 1.0)])
    b = (m * k + m * n) * 2.0 + k * n * WEIGHT_BYTES[dtype]
    return max(2.0 * m * n * k / (g.flops(dtype) * ce.at(m)), b / (g.memory_bandwidth_Bps.value * meff.at(b)))


def vidur_vs_aic_gemm(vidur_csv: Path, aic_gemm: Path, arch: ModelArch, models: dict[int, Deployment]) -> pd.DataFrame:
    """Vidur's per-operator times next to aiconfigurator's bf16 GEMM times of the same (m, n, k).

    Only cells present in both grids (Vidur: Llama-2-70B layers at TP 1-8;
    aiconfigurator: the vLLM 0.24.0 default ``torch.nn.functional.linear``).
    Columns: tp, op, m, n, k, vidur_s, aic_s, model_s (:func:`gemm_time`),
    ``vidur_vs_aic`` = vidur/aic - 1 and ``model_vs_aic`` = model/aic - 1.
    """
    aic = load_aic_gemm(aic_gemm, "bf16")
    cols = [f"time_stats.{op}.median" for op in LINEAR_OPS]
    v = pd.read_csv(vidur_csv, usecols=cols + ["num_tokens", "num_tensor_parallel_workers"])
    v = v.groupby(["num_tensor_parallel_workers", "num_tokens"])[cols].mean()
    rows = []
    for (tp, m), r in v.iterrows():
        if tp not in models:
            continue
        for op, (n, k) in dense_layer_gemms(arch, int(tp)).items():
            key = (int(m), n, k)
            if key in aic.index:
                rows.append(
                    {
                        "tp": int(tp),
                        "op": op,
                        "m": int(m),
                        "n": n,
                        "k": k,
                        "vidur_s": r[f"time_stats.{op}.median"] * 1e-3,
                        "aic_s": aic[key],
                        "model_s": gemm_time(models[int(tp)], int(m), n, k),
                    }
                )
    out = pd.DataFrame(rows)
    out["vidur_vs_aic"] = out["vidur_s"] / out["aic_s"] - 1.0
    out["model_vs_aic"] = out["model_s"] / out["aic_s"] - 1.0
    return out
