"""Measured routed-expert (fused MoE) kernel curves: one file per GPU and engine release.

The routed experts of a MoE layer run as one fused kernel (token permutation, two grouped GEMMs with the
gated activation between them, and the weighted sum of each token's top-k outputs).  A
:class:`MoeCurve` gives its time on one GPU for ``T`` tokens entering the layer (every token of the
GPUs that share the experts: with data-parallel attention, all ranks' tokens), ``E`` experts of which
each token picks ``k``, hidden width ``h``, expert width ``i``, expert tensor parallel ``tp`` and
expert parallel ``ep`` (seconds)::

    m        = T k / E                               rows per expert
    touched  = E / ep * (1 - (1 - k / E) ** T)        local experts with at least one row (uniform routing)
    t = fixed_s
      + max(6 T k h i / (tp ep) / (P * eff),  touched * 3 h i / tp * w / (BW * mem_eff))
      + act_passes * T k h * 2 / BW                  permutation and top-k sum of every routed row (bf16)
      + per_expert_s * touched                       per-expert set-up of the grouped GEMMs
    eff      = max_eff * m / (m + half_rows) * S / (S + half_nk),   S = h i / tp

``P`` is the peak of the format's compute dtype and ``w`` its bytes per stored weight
(:data:`FORMATS`); ``BW`` the GPU's HBM bandwidth.  Fitted on the measured tables by
:mod:`calibration.kernels.moe_fit`; each curve's ``quality`` holds its error on held-out expert shapes.
"""

from __future__ import annotations

from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from hwdb.profiles import FitQuality
from simulator.bounds import Range

# Kernel weight formats of the measured tables -> (compute dtype whose peak the GEMMs run at, bytes per
# stored weight with its scales).  fp8_block: DeepSeek-style 128x128 scales (negligible); nvfp4: one fp8
# scale per 16 weights; int4_wo: W4A16 with a bf16 scale per 32 (Kimi-K2.5's compressed-tensors group);
# w4a16_mxfp4: one E8M0 scale per 32 weights, bf16 activations (Marlin / Triton on Hopper).
FORMATS = {
    "bfloat16": ("bf16", 2.0),
    "fp8": ("fp8", 1.0),
    "fp8_block": ("fp8", 1.0),
    "nvfp4": ("fp4", 0.5625),
    "int4_wo": ("bf16", 0.5625),
    "w4a16_mxfp4": ("bf16", 0.53125),
    "w4a8_mxfp4_mxfp8": ("fp8", 0.53125),
}


# A curve keyed ``<format>@<backend>`` times a kernel an engine runs for that format only when told to (vLLM's
# VLLM_MXFP4_USE_MARLIN=1, later --moe-backend marlin); the plain ``<format>`` key is the engine's default.
BACKEND_SEP = "@"


class MoeCurve(BaseModel):
    """Fitted coefficients of one fused-MoE kernel format (module docstring gives the form; SI units)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_eff: Annotated[float, Range(0, 1, "of the peak", lo_open=True, fix="give the fitted peak fraction")]
    half_rows: Annotated[float, Range(0, 1e5, "rows per expert", fix="give the fitted ramp")]
    half_nk: Annotated[float, Range(0, 1e12, "weight elements", fix="give the fitted shape ramp")]
    # above 1: the kernel reads fewer bytes than the touched experts hold (weights reused from L2 across rows)
    mem_eff: Annotated[float, Range(0, 1.5, "of the HBM bandwidth", lo_open=True, fix="give the fitted fraction")]
    fixed_s: Annotated[float, Range(0, 1e-2, "s", fix="give the fitted fixed cost per layer")]
    act_passes: Annotated[float, Range(0, 100, "passes", fix="give the fitted passes over the routed rows")]
    per_expert_s: Annotated[float, Range(0, 1e-3, "s", fix="give the fitted cost per touched expert")]
    kernel: str = Field(min_length=1)
    engine_version: str = Field(min_length=1)
    source: str = Field(min_length=3)
    quality: FitQuality

    def time(
        self,
        tokens: float,
        hidden: int,
        inter: int,
        experts: int,
        topk: int,
        tp: int,
        ep: int,
        peak_flops: float,
        weight_bytes: float,
        bw: float,
    ) -> float:
        """Seconds of one MoE layer on one GPU (the module docstring's form); the shape arguments may be
        numpy arrays (one latency per row, as the fit evaluates it)."""
        m = tokens * topk / experts
        s = hidden * inter / tp
        eff = self.max_eff * m / (m + self.half_rows) * s / (s + self.half_nk)
        touched = experts / ep * (1.0 - (1.0 - topk / experts) ** tokens)
        comp = 6.0 * tokens * topk * hidden * inter / (tp * ep) / (peak_flops * eff)
        mem = touched * 3.0 * hidden * inter / tp * weight_bytes / (bw * self.mem_eff)
        return (
            self.fixed_s
            + np.maximum(comp, mem)
            + self.act_passes * tokens * topk * hidden * 2.0 / bw
            + self.per_expert_s * touched
        )


class MoeKernels(BaseModel):
    """The fused-MoE curves of one GPU under one engine, by kernel format (:data:`FORMATS`); each curve
    names the release that measured it, ``engine_version`` is the newest of them."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    gpu: str
    engine: str
    engine_version: str
    source: str = Field(min_length=3)
    method: str
    # By kernel format: layouts whose experts are tensor-parallel (EP 1), and expert-parallel ones (EP > 1),
    # which the engines run on other kernels (dispatch to local experts, another grouped GEMM).
    curves: dict[str, MoeCurve] = {}
    ep_curves: dict[str, MoeCurve] = {}

    @field_validator("curves", "ep_curves")
    @classmethod
    def _known_formats(cls, v: dict[str, MoeCurve]) -> dict[str, MoeCurve]:
        for key in v:
            fmt, _, backend = key.partition(BACKEND_SEP)
            if fmt not in FORMATS or (BACKEND_SEP in key and not backend.isidentifier()):
                raise ValueError(
                    f"curve key {key!r}: give a kernel format of {sorted(FORMATS)}, optionally "
                    f"'{BACKEND_SEP}<backend>' (e.g. 'w4a16_mxfp4{BACKEND_SEP}marlin')"
                )
        return v
