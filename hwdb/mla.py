"""Measured multi-head latent attention (MLA) kernel curves: one file per GPU and engine release.

DeepSeek-style MLA caches one latent of ``d_c`` (kv_lora_rank) plus ``d_r`` rotary elements per token and
layer, shared by all heads.  Prefill runs it as ordinary causal attention over decompressed heads
(``d_qk = qk_nope + d_r`` for QK, ``d_v`` for PV); decode runs the absorbed form, every head reading the
latent: ``2 (2 d_c + d_r)`` FLOPs per head and cached token, against ``(d_c + d_r)`` cached elements read
once for all heads, so with many heads on a GPU (attention data parallel) decode turns compute-bound.

An :class:`MlaCurve` holds, per KV-cache dtype, the attention kernel's time for one layer on one GPU with
``n`` heads there (seconds)::

    context (b prompts of s tokens, W = b s n query rows over all heads):
        fixed_s + seq_head_s * b n
        + max(seq_s * s,
              2 (d_qk + d_v) n b s (s + 1) / 2 / (P_bf16 * max_eff * s / (s + half_len) * W / (W + half_rows)))
    generation (b sequences with C cached tokens in all):
        fixed_s + seq_head_s * b n
        + max(C (d_c + d_r) kv_bytes / (BW * mem_eff),  2 C n (2 d_c + d_r) / (P_bf16 * comp_eff))

A DeepSeek-sparse-attention model (GLM-5, DeepSeek-V3.2) also runs a lightning indexer in every attention layer,
which scores each cached token for the query and keeps the top 2,048.  ``indexer`` holds its decode cost
per layer (seconds), by KV dtype::

    fixed_s + seq_s * b + ctx_s * C

measured as the difference between the same engine's whole DSA attention module with the indexer and
without it (the skip-indexer variant that reuses an earlier layer's selection), which leaves the indexer's
projections, its scores over the cache and its top-k; it is replicated on every TP rank (the measured
difference does not change with TP).  Fitted by :mod:`calibration.kernels.dsa_fit`.

The context's ``seq_s`` term is a lone prompt's longest row block, which runs alone when a few heads leave
most of the GPU idle; its ``seq_head_s`` the set-up of each sequence and head, which many short prompts pay.
``P_bf16`` and ``BW`` are the GPU's (hwdb/data/gpus).  Fitted on the measured tables (DeepSeek-V3's dimensions)
by :mod:`calibration.kernels.mla_fit`; each phase's ``quality`` holds its error on held-out head counts.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from hwdb.profiles import FitQuality
from simulator.bounds import Range

KV_DTYPES = {"bf16": "bfloat16", "fp8": "fp8"}  # epdsim kv dtype -> the tables' name


class MlaContext(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fixed_s: Annotated[float, Range(0, 1e-2, "s", fix="give the fitted fixed cost per layer")]
    seq_s: Annotated[float, Range(0, 1e-5, "s per prompt token", fix="give the fitted cost")]
    seq_head_s: Annotated[float, Range(0, 1e-5, "s per prompt and head", fix="give the fitted cost")]
    max_eff: Annotated[float, Range(0, 2, "of the bf16 peak", lo_open=True, fix="give the fitted peak fraction")]
    half_len: Annotated[float, Range(0, 1e7, "tokens of a prompt", fix="give the fitted ramp")]
    half_rows: Annotated[float, Range(0, 1e9, "query rows x heads", fix="give the fitted ramp")]
    quality: FitQuality

    def time(self, b, s, heads, d_qk: int, d_v: int, peak_bf16: float):
        w = b * s * heads
        eff = self.max_eff * s / (s + self.half_len) * w / (w + self.half_rows)
        return (
            self.fixed_s
            + self.seq_head_s * b * heads
            + np.maximum(self.seq_s * s, 2.0 * (d_qk + d_v) * heads * b * s * (s + 1) / 2.0 / (peak_bf16 * eff))
        )


class MlaGeneration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fixed_s: Annotated[float, Range(0, 1e-2, "s", fix="give the fitted fixed cost per layer")]
    seq_head_s: Annotated[float, Range(0, 1e-5, "s per sequence and head", fix="give the fitted cost")]
    mem_eff: Annotated[float, Range(0, 1.5, "of the HBM bandwidth", lo_open=True, fix="give the fitted fraction")]
    comp_eff: Annotated[float, Range(0, 2, "of the bf16 peak", lo_open=True, fix="give the fitted fraction")]
    quality: FitQuality

    def time(self, b, ctx_total, heads, d_c: int, d_r: int, kv_bytes: float, peak_bf16: float, bw: float):
        mem = ctx_total * (d_c + d_r) * kv_bytes / (bw * self.mem_eff)
        comp = 2.0 * ctx_total * heads * (2 * d_c + d_r) / (peak_bf16 * self.comp_eff)
        return self.fixed_s + self.seq_head_s * b * heads + np.maximum(mem, comp)


class MlaIndexer(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fixed_s: Annotated[float, Range(0, 1e-2, "s", fix="give the fitted fixed cost per layer")]
    seq_s: Annotated[float, Range(0, 1e-5, "s per decoding sequence", fix="give the fitted cost")]
    ctx_s: Annotated[float, Range(0, 1e-8, "s per cached token", fix="give the fitted cost")]
    quality: FitQuality

    def time(self, b, ctx_total):
        return self.fixed_s + self.seq_s * b + self.ctx_s * ctx_total


class MlaCurve(BaseModel):
    """One engine's MLA attention kernels on one GPU, by KV-cache dtype (the tables' names)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    gpu: str
    engine: str
    engine_version: str = Field(min_length=1)
    kernel: str = Field(min_length=1)
    source: str = Field(min_length=3)
    context: dict[str, MlaContext]
    generation: dict[str, MlaGeneration]
    # the DSA lightning indexer's decode cost per layer by KV dtype; empty where it was not measured apart
    indexer: dict[str, MlaIndexer] = Field(default_factory=dict)
    indexer_source: str = ""
