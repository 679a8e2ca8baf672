"""The linear layers one tensor-parallel rank runs per token, as GEMM weight shapes.

The step model charges linear FLOPs at a compute efficiency; measured kernels reach a
lower fraction of the peak on small weights (``hwdb.schema.GemmShapeCurve``), so the
efficiency of a deployment depends on the per-rank slices of its layers.  This module
lists those slices with their FLOP shares and turns a profile's shape curve into the
two curves the step model uses: one for the dense GEMMs (attention projections, dense
and shared-expert MLPs), one for the routed experts.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwdb.models import ModelArch
from hwdb.schema import EfficiencyCurve, GemmShapeCurve


@dataclass(frozen=True)
class RankGemms:
    """Per-rank weight sizes N*K (elements) of one token's linear layers, with FLOP shares."""

    dense: list[tuple[float, float]]
    experts: list[tuple[float, float]]


def _split(n: float, k: float, layers: int) -> list[tuple[float, float]]:
    return [(n * k, n * k * layers)] if layers and n > 0 and k > 0 else []


def rank_gemm_groups(a: ModelArch, tp: int, moe_tp: int | None = None) -> dict[str, list[tuple[float, float]]]:
    """The GEMMs of a token on one TP rank by weight group: columns split N, rows split K, as vLLM
    shards them.  Keys as :mod:`simulator.linear_groups`: attention, dense_mlp, shared_experts, experts.

    Softmax attention: a fused q/k/v projection (KV heads replicated when fewer than ranks) and
    the output projection.  MLA and linear-attention layers, whose projections mix replicated
    low-rank and sharded parts, count as two GEMMs of half their weights each.  MLPs: fused
    gate/up and down.  Shares are FLOPs per token (2 N K per GEMM, the factor 2 dropped).  ``moe_tp``: the
    ways each routed expert is sliced (expert parallelism keeps experts whole; default ``tp``).
    """
    h = a.hidden_size
    moe_tp = tp if moe_tp is None else moe_tp
    attn: list[tuple[float, float]] = []
    softmax_layers = a.num_layers - a.num_linear_layers
    if a.is_mla:
        half = a.attn_params_per_layer / (2 * tp)
        attn += [(half, half * softmax_layers)] * 2
    else:
        kv = max(1, a.num_kv_heads // tp) * a.head_dim * 2
        q = a.num_heads * a.head_dim * (2 if a.attn_output_gate else 1) / tp
        attn += _split(q + kv, h, softmax_layers) + _split(h, a.num_heads * a.head_dim / tp, softmax_layers)
    if a.num_linear_layers:
        half = a.linear_attn_params_per_layer / (2 * tp)
        attn += [(half, half * a.num_linear_layers)] * 2
    dense_mlp = a.num_layers - a.moe_layers
    out = {
        "attention": attn,
        "dense_mlp": (
            _split(2 * a.intermediate_size / tp, h, dense_mlp) + _split(h, a.intermediate_size / tp, dense_mlp)
        ),
        "shared_experts": [],
        "experts": [],
    }
    if a.is_moe:
        inter = a.moe_intermediate_size / tp
        shared = a.moe_layers * a.num_shared_experts
        out["shared_experts"] = _split(2 * inter, h, shared) + _split(h, inter, shared)
        routed = a.moe_layers * a.experts_per_token
        sliced = a.moe_intermediate_size / moe_tp
        out["experts"] = _split(2 * sliced, h, routed) + _split(h, sliced, routed)
    return out


def linear_kernels(a: ModelArch, experts_measured: bool) -> int:
    """Dense linear kernels one forward pass launches (each pays the memory curve's per-kernel floor):
    two attention projections per layer (fused q/k/v and output), two per dense MLP (fused gate/up and
    down), per MoE layer the router and two per shared expert block.  The routed experts' two grouped
    GEMMs count here only when no measured kernel curve times them: a measured fused-MoE latency
    already holds its kernels' floors.  The LM head's one floor per step (~3.5 us) is left to the
    fitted per-step overhead."""
    moe = a.moe_layers
    per_moe = (1 + (2 if a.num_shared_experts else 0) + (0 if experts_measured else 2)) if a.is_moe else 0
    return 2 * a.num_layers + 2 * (a.num_layers - moe) + per_moe * moe


def rank_gemms(a: ModelArch, tp: int) -> RankGemms:
    """The GEMMs of a token on one TP rank: dense (every non-routed group) and routed experts."""
    g = rank_gemm_groups(a, tp)
    return RankGemms(g["attention"] + g["dense_mlp"] + g["shared_experts"], g["experts"])


def shape_curves(curve: GemmShapeCurve, a: ModelArch, tp: int) -> tuple[EfficiencyCurve, float, float]:
    """(dense compute curve, routed-expert peak fraction, routed-expert ramp in step tokens).

    The routed experts get the peak fraction of their own (small) weight shapes but the ramp of
    the step's token count, not of the few tokens each expert sees: grouped MoE kernels are tuned
    for small per-expert M, and a per-expert ramp (tested: ``half_m x experts / top-k`` tokens)
    made MiniMax-M2.5 decode three times slower than measured (TPOT bias +216 % on the fitting rows).
    """
    g = rank_gemms(a, tp)
    dense = EfficiencyCurve(
        max_eff=min(1.0, curve.for_shapes(g.dense)),
        half=curve.half_m,
        source=f"per-rank GEMM shapes (simulator/gemm_shapes.py) on {curve.source}",
        empirical=True,
    )
    if not g.experts:
        return dense, 1.0, 0.0
    return dense, min(1.0, curve.for_shapes(g.experts)), curve.half_m
