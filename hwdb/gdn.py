"""Measured Gated-DeltaNet (linear attention) kernel curves: one file per GPU and engine release.

A hybrid model's linear-attention layers (Qwen3.5, Qwen3-Next) run two kernels per layer instead of
softmax attention: a short causal convolution over the q/k/v channels and the gated delta rule, which
updates a per-head ``dk x dv`` state.  Prefill runs them chunk by chunk over each prompt
(``causal_conv1d_fn`` + ``chunk_gated_delta_rule``), decode as one recurrent update per sequence
(``causal_conv1d_update`` + ``fused_recurrent_gated_delta_rule``).  A :class:`GdnCurve` gives the time
of both kernels of one layer on one GPU (seconds), for ``b`` sequences of ``s`` new tokens each, ``hv``
value heads and ``hk`` key heads on this GPU (heads of ``dk = dv = 128``, as every measured model has;
other head sizes scale by ``dk dv / 128^2``)::

    context:     fixed_s + seq_s * s + seq_head_s * b hv + tok_head_s * b s hv + tok_key_head_s * b s hk
    generation:  fixed_s + seq_head_s * b hv + seq_key_head_s * b hk

The context's ``seq_s`` term is the chunks a prompt's state passes through one after another (a long
prompt runs fewer blocks in parallel), ``seq_head_s`` the per-sequence state set-up and write-back,
the token terms the chunked delta rule (value heads) and the convolution (key channels).  Decode reads
and writes each sequence's state once (``seq_head_s``).  Fitted on the measured tables by
:mod:`calibration.kernels.gdn_fit`; each curve's ``quality`` holds its error on models the fit never saw.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from hwdb.profiles import FitQuality
from simulator.bounds import Range

HEAD_ELEMS = 128 * 128  # dk x dv of the measured heads


class GdnPhase(BaseModel):
    """One phase's coefficients (module docstring; seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    fixed_s: Annotated[float, Range(0, 1e-2, "s", fix="give the fitted fixed cost per layer")]
    seq_s: Annotated[float, Range(0, 1e-5, "s per token of the longest prompt", fix="give the fitted cost")] = 0.0
    seq_head_s: Annotated[float, Range(0, 1e-5, "s per sequence and value head", fix="give the fitted cost")]
    seq_key_head_s: Annotated[float, Range(0, 1e-5, "s per sequence and key head", fix="give the fitted cost")] = 0.0
    tok_head_s: Annotated[float, Range(0, 1e-6, "s per token and value head", fix="give the fitted cost")] = 0.0
    tok_key_head_s: Annotated[float, Range(0, 1e-6, "s per token and key head", fix="give the fitted cost")] = 0.0
    quality: FitQuality


class GdnCurve(BaseModel):
    """The two phases of one engine's Gated-DeltaNet kernels on one GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    gpu: str
    engine: str
    engine_version: str = Field(min_length=1)
    kernels: str = Field(min_length=1)
    source: str = Field(min_length=3)
    context: GdnPhase
    generation: GdnPhase

    def context_time(self, seqs, seq_len, hv, hk, head_scale: float = 1.0):
        """Seconds of one layer's prefill kernels for ``seqs`` prompts of ``seq_len`` new tokens each
        (numpy arrays allowed)."""
        c = self.context
        return (
            c.fixed_s
            + c.seq_s * seq_len
            + c.seq_head_s * seqs * hv * head_scale
            + (c.tok_head_s * hv * head_scale + c.tok_key_head_s * hk) * seqs * seq_len
        )

    def generation_time(self, seqs, hv, hk, head_scale: float = 1.0):
        """Seconds of one layer's decode kernels for ``seqs`` sequences (numpy arrays allowed)."""
        g = self.generation
        return g.fixed_s + (g.seq_head_s * hv * head_scale + g.seq_key_head_s * hk) * seqs
