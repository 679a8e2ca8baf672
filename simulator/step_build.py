"""Coefficients of a :class:`simulator.stepmodel.StepModel` from a deployment.

Everything that depends on the model, GPU, parallel layout, weight format and calibration
profile is folded here into a few numbers, so that a step's time is a few dozen float
operations whatever the batch.  Sources of each term:

* linear layers: per weight group (:mod:`simulator.linear_groups`) FLOPs over the group's
  compute dtype's peak and GEMM efficiency (the profile's GEMM-by-shape curve on this rank's
  own slices, :mod:`simulator.gemm_shapes`; bf16 the pooled curve), weights streamed at the
  memory curve;
* attention: prefill FLOPs at the bf16 peak (the attention kernels compute in bf16 whatever
  the weights) and the prefill-attention curve; the decode KV stream at the decode-attention curve;
* element-wise kernels: the bytes of the norms, rotary embedding, activation and MoE token
  permutation of a layer, at the memory curve's peak fraction;
* all-reduce: the profile's measured curve for this TP size, else the intra-node link;
* per-layer kernel floors, launches and host work: the engine profile.
"""

from __future__ import annotations

import math
from typing import cast

from hwdb.gdn import HEAD_ELEMS
from hwdb.mla import KV_DTYPES
from hwdb.moe import FORMATS
from hwdb.schema import EfficiencyCurve
from simulator.gemm_shapes import linear_kernels, rank_gemm_groups
from simulator.linear_groups import Group
from simulator.perf import Deployment, kv_bytes_per_token
from simulator.stepmodel import StepModel

ACT_BYTES = 2.0  # activations stay bf16 between kernels whatever the weight format


def _allreduce_tables(dep: Deployment) -> dict:
    """StepModel fields of the measured all-reduce for this TP size, or {} (the link model applies)."""
    curve = dep.profile.allreduce if dep.profile is not None else None
    graph = curve.table(dep.tp, graph=True) if curve is not None and dep.tp > 1 else None
    if curve is None or graph is None:
        return {}
    eager = curve.table(dep.tp, graph=False) or graph  # never None here: it falls back to the graph table
    return {"ar_sizes": graph[0], "ar_graph": _monotone(graph[1]), "ar_eager": _monotone(eager[1])}


def _monotone(lat: tuple[float, ...]) -> tuple[float, ...]:
    """The lower non-decreasing envelope of latencies by size (running minimum from the largest).

    The tables have bumps where one algorithm hands over to the next too late (B200 TP8: 26 us at
    256-512 KiB, 17 us at 1 MiB); the measured serving runs show no such step in TPOT between
    batch 8 and 32 (Llama-3.1-70B fp8 TP8: 6.9, 7.6, 9.2 ms), so a message is charged no more than
    a larger one costs."""
    out, low = [], math.inf
    for x in reversed(lat):
        low = min(low, x)
        out.append(low)
    return tuple(reversed(out))


def compute_curve(dep: Deployment, dtype: str, shapes: list[tuple[float, float]]) -> EfficiencyCurve:
    """The compute efficiency of GEMMs of ``shapes`` (per-rank N*K with FLOP shares) in ``dtype``.

    With the profile's GEMM-by-shape curve for that dtype: its peak fraction over these shapes and its
    M ramp.  Without one, bf16 takes the pooled curve (profile, else GPU defaults); fp8/fp4 take the
    fp8 table's peak fraction with the bf16 ramp: the fp8 fit's large ramp (half ~120-170 tokens) is
    the kernel's fixed cost (activation quantisation) charged per FLOP, which would make a batch-1
    decode compute-bound; that cost is per kernel and carried by the engine's per-layer overhead.
    """
    prof, g = dep.profile, dep.gpu
    pooled = prof.compute_efficiency if prof and prof.compute_efficiency else g.compute_efficiency
    shape = prof.gemm_shape_efficiency.get(dtype) if prof else None
    if shape is not None and shapes:
        return EfficiencyCurve(
            max_eff=min(1.0, shape.for_shapes(shapes)),
            half=shape.half_m,
            source=f"per-rank GEMM shapes (simulator/gemm_shapes.py) on {shape.source}",
            empirical=True,
        )
    if dtype in ("fp8", "fp4") and prof and prof.compute_efficiency_fp8:
        f8 = prof.compute_efficiency_fp8
        return EfficiencyCurve(max_eff=f8.max_eff, half=min(pooled.half, f8.half), source=f8.source, empirical=True)
    return pooled


def elementwise_bytes_per_token(dep: Deployment) -> float:
    """Bytes one rank's element-wise kernels move per token over the whole model (bf16 activations).

    Per layer, as vLLM's decoder layers run them: two fused residual-add + RMSNorm (read the hidden
    state and the residual, write both: 4 x hidden each, on every rank), rotary embedding on this
    rank's queries and keys (read and write), the gated activation (read gate and up, write one:
    3 x the rank's intermediate width) and, in MoE layers, the top-k partial outputs of every token
    (vLLM's fused MoE gathers a token's input inside the grouped GEMM but writes its k expert outputs,
    each hidden-wide on every TP rank, and reads them back to sum: 2 x k x hidden).
    """
    a, tp = dep.arch, dep.tp
    h = a.hidden_size
    qk = (
        (a.num_heads + max(1, a.num_kv_heads // tp) * tp) * a.head_dim / tp
        if not a.is_mla
        else a.num_heads * (a.qk_rope_head_dim or a.head_dim) / tp
    )
    dense_layers = a.num_layers - a.moe_layers
    per_layer = 8.0 * h + 2.0 * qk
    total = per_layer * a.num_layers + dense_layers * 3.0 * a.intermediate_size / tp
    if a.is_moe:
        # With a measured fused-MoE curve its activation, permutation and top-k sum are in that kernel's time.
        routed = 0 if dep.moe_curve is not None else a.experts_per_token
        inter = (routed + a.num_shared_experts) * a.moe_intermediate_size / tp
        total += a.moe_layers * (3.0 * inter + 2.0 * routed * h)
    return total * ACT_BYTES / dep.pp


def measured_experts(dep: Deployment, per_token: float) -> dict:
    """StepModel fields of the routed experts from the measured fused-MoE curve (hwdb/moe.py), or {}.

    The curve's compute side is ``6 T k h i / (tp ep) / (P eff)`` with ``eff = max_eff * m / (m + half_rows)
    * S / (S + half_nk)``, ``m = T k / E`` rows per expert and ``S`` one expert slice's h x i / tp: in the
    step model's form ``exp_a * T + exp_b`` with the shape factor in ``exp_a`` and the row ramp, in
    tokens, in ``exp_b``.  ``per_token``: parameters a token multiplies through in the routed experts."""
    c, a = dep.moe_curve, dep.arch
    if c is None or not a.is_moe:
        return {}
    peak = dep.gpu.flops(FORMATS[dep.moe_format][0])
    slice_nk = a.hidden_size * a.moe_intermediate_size / dep.moe_tp
    exp_a = 2.0 * per_token / dep.gpus / (peak * c.max_eff * slice_nk / (slice_nk + c.half_nk))
    bw = dep.gpu.memory_bandwidth_Bps.value
    return {
        "exp_a": exp_a,
        "exp_b": exp_a * c.half_rows * a.num_experts / a.experts_per_token,
        "exp_mem_eff": c.mem_eff,
        "exp_fixed_s": a.moe_layers * c.fixed_s,
        # an all-to-all dispatch hands a GPU only the rows routed to its experts, which it permutes
        "exp_s_per_token": (
            a.moe_layers
            * c.act_passes
            * a.experts_per_token
            * a.hidden_size
            * ACT_BYTES
            / bw
            / (dep.ep if dep.dp > 1 and dep.engine.moe_dispatch == "all_to_all" else 1)
        ),
        "exp_s_per_expert": a.moe_layers * c.per_expert_s / dep.ep,
    }


def moe_exchange(dep: Deployment) -> dict:
    """StepModel fields of the MoE layers' token exchange when the experts span more than one rank's GPUs
    (dp > 1 or ep > 1), per MoE layer: ``moe_comm_s_per_token`` x this rank's tokens + ``moe_comm_lat_s``.

    Expert parallel (ep > 1): an all-to-all dispatch of each token to its top-k experts and a combine
    back, each moving k hidden-wide bf16 rows of which (ep - 1) / ep leave the GPU; a rank's tp GPUs
    send a tp-th of its tokens each.  Tensor-parallel experts across dp ranks (ep = 1, dp > 1): the
    ranks' tokens are gathered and the partial outputs reduce-scattered, a ring all-reduce of dp x the
    rank's rows over the instance.  Within a node both run over the intra-node link; when the instance
    spans nodes, the share of peers on other nodes goes over the scale-out link at the same time (the
    slower side sets the time) and its latency is paid.  {} when the MoE layers stay within a rank."""
    a = dep.arch
    if not a.is_moe or (dep.dp == 1 and dep.ep == 1):
        return {}
    g = dep.gpus
    node = dep.gpu.gpus_per_node
    intra, inter = dep.intra_link, dep.scale_out_link
    off = 0.0 if g <= node or inter is None else (g - node) / (g - 1)
    bw_in = intra.effective_Bps
    lat = intra.latency_s.value if off == 0.0 or inter is None else max(intra.latency_s.value, inter.latency_s.value)
    row = a.hidden_size * ACT_BYTES
    if dep.ep > 1:
        per_token = 2.0 * a.experts_per_token * row * (dep.ep - 1) / dep.ep / dep.tp
        lat *= 2.0
    else:
        per_token = 2.0 * (g - 1) / g * dep.dp * row
    t_in = (1.0 - off) / bw_in
    t_out = off / inter.effective_Bps if off and inter is not None else 0.0
    return {"moe_comm_s_per_token": per_token * max(t_in, t_out), "moe_comm_lat_s": lat}


def linear_attention(dep: Deployment) -> dict:
    """StepModel fields of the linear-attention layers' own kernels (the convolution and the gated delta rule)
    from the measured curve (hwdb/gdn.py), summed over those layers for one GPU's share of the heads; {} when
    the model has none or no curve was measured for the GPU."""
    a, c = dep.arch, dep.gdn_curve
    if not a.num_linear_layers or c is None:
        return {}
    n = a.num_linear_layers
    scale = a.linear_key_head_dim * a.linear_value_head_dim / HEAD_ELEMS
    hv = a.linear_num_value_heads / dep.tp * scale
    hk = a.linear_num_key_heads / dep.tp
    x, g = c.context, c.generation
    return {
        "lin_ctx_fixed_s": n * x.fixed_s,
        "lin_ctx_seq_s": n * x.seq_s,
        "lin_ctx_prompt_s": n * x.seq_head_s * hv,
        "lin_ctx_tok_s": n * (x.tok_head_s * hv + x.tok_key_head_s * hk),
        "lin_gen_fixed_s": n * g.fixed_s,
        "lin_gen_seq_s": n * (g.seq_head_s * hv + g.seq_key_head_s * hk),
    }


def mla_attention(dep: Deployment) -> dict:
    """StepModel fields of an MLA model's attention from the measured kernel of its engine and KV dtype
    (hwdb/mla.py), for this GPU's heads; {} when that kernel was not measured apart (then the attention curves
    of the profile or GPU hold).  Per-pair and per-token terms cover a pipeline stage's layers, fixed ones
    every layer (a token passes them all), as the curves they replace do."""
    a, c = dep.arch, dep.mla_curve
    kv = KV_DTYPES.get(dep.kv_dtype)
    if not a.is_mla or c is None or kv not in c.context or kv not in c.generation:
        return {}
    x, g = c.context[kv], c.generation[kv]
    heads = a.num_heads / dep.tp
    layers, stage = a.full_attn_layers, math.ceil(a.full_attn_layers / dep.pp)
    peak, bw = dep.gpu.flops("bf16"), dep.gpu.memory_bandwidth_Bps.value
    d_qk = a.qk_nope_head_dim + a.qk_rope_head_dim
    return {
        "mla_fixed_s": layers * x.fixed_s,
        "mla_prompt_s": layers * x.seq_head_s * heads,
        "mla_seq_s": layers * x.seq_s,
        "mla_half_len": x.half_len,
        "mla_half_tok": x.half_rows / heads,
        "mla_pair_s": stage * 2.0 * (d_qk + a.v_head_dim) * heads / (peak * x.max_eff),
        "kv_max_eff": g.mem_eff,
        "kv_floor_bytes": layers * g.fixed_s * bw * g.mem_eff,
        "kv_comp_s_per_ctx": stage * 2.0 * heads * (2 * a.kv_lora_rank + a.qk_rope_head_dim) / (peak * g.comp_eff),
        "kv_seq_s": layers * g.seq_head_s * heads,
    }


def dsa_indexer(dep: Deployment) -> dict:
    """StepModel fields of a DeepSeek-sparse-attention model's lightning indexer at decode from its engine's
    measurement on this GPU (hwdb/mla.py MlaIndexer), or {}: replicated on every TP rank, its fixed and
    per-sequence costs are paid in every layer, its per-cached-token cost in a pipeline stage's layers."""
    a, c = dep.arch, dep.mla_curve
    kv = KV_DTYPES.get(dep.kv_dtype)
    if not a.index_n_heads or c is None or kv not in c.indexer:
        return {}
    x, layers = c.indexer[kv], a.full_attn_layers
    return {
        "dsa_fixed_s": layers * x.fixed_s,
        "dsa_seq_s": layers * x.seq_s,
        "dsa_ctx_s": math.ceil(layers / dep.pp) * x.ctx_s,
    }


def build_step_model(dep: Deployment) -> StepModel:
    """Coefficients for :class:`StepModel` from a deployment (profile overrides GPU defaults)."""
    apart = {**linear_attention(dep), **mla_attention(dep), **dsa_indexer(dep)}
    a, g, prof = dep.arch, dep.gpu, dep.profile
    gpus = dep.rank_gpus  # dense weights and this rank's own tokens: one data-parallel rank's GPUs
    meff = prof.memory_efficiency if prof and prof.memory_efficiency else g.memory_efficiency
    ceff = prof.compute_efficiency if prof and prof.compute_efficiency else g.compute_efficiency
    aeff = prof.attention_prefill_efficiency if prof and prof.attention_prefill_efficiency else ceff
    # Decode attention's KV stream: its own fitted curve where a profile has one, else the GEMM memory curve.
    deff = prof.attention_decode_efficiency if prof and prof.attention_decode_efficiency else meff
    plain = "fp16" if dep.weight_dtype == "fp16" or "bf16" not in g.peak_flops else "bf16"
    shapes = rank_gemm_groups(a, dep.tp, dep.moe_tp)
    comp_a = comp_b = exp_a = exp_b = 0.0
    measured: dict = {}
    parts = []
    dense_bytes = expert_bytes = 0.0
    lm = None
    for grp in dep.linear_groups():
        if grp.name == "experts":
            # Per expert index, over every GPU of the instance (dp ranks share the experts).  A measured kernel
            # streams at most the bytes its curve was fitted with: its own timing already holds the engine's
            # layout (vLLM's Hopper MXFP4 pads the experts in memory; the padding is in the measured kernel), and
            # a checkpoint that stores fewer (MXFP4 through the NVFP4 curve) streams its own.
            wb = min(FORMATS[dep.moe_format][1], grp.weight_bytes) if dep.moe_curve is not None else grp.weight_bytes
            expert_bytes = a.moe_layers * a.expert_params * wb / dep.gpus
        else:
            dense_bytes += grp.params * grp.weight_bytes / gpus
        if grp.name == "lm_head":
            lm = grp
            continue
        curve = compute_curve(dep, grp.compute_dtype, shapes.get(grp.name, []))
        if grp.name == "experts":
            # Per token routed through the MoE layers, over every GPU of the instance: a GPU's experts serve
            # all data-parallel ranks' tokens (the ramp is in those tokens).
            exp_a = 2.0 * grp.per_token / dep.gpus / (g.flops(grp.compute_dtype) * curve.max_eff)
            exp_b = exp_a * curve.half
            measured = measured_experts(dep, grp.per_token)
            if measured:
                exp_a, exp_b = measured["exp_a"], measured["exp_b"]
            parts.append((grp.name, grp.compute_dtype, exp_a, exp_b / exp_a))
            continue
        coef = 2.0 * grp.per_token / gpus / (g.flops(grp.compute_dtype) * curve.max_eff)
        comp_a += coef
        comp_b += coef * curve.half
        parts.append((grp.name, grp.compute_dtype, coef, curve.half))
    lm = cast(Group, lm)  # every model has an LM head (simulator.linear_groups)
    lm_curve = compute_curve(dep, lm.compute_dtype, [])
    lm_coef = 2.0 * lm.per_token / dep.tp / (g.flops(lm.compute_dtype) * lm_curve.max_eff)
    eng = dep.engine
    eager = eng.eager_launch_s_per_layer.value * math.ceil(a.num_layers / dep.pp)
    graph = eng.graph_launch_s.value
    cpu = eng.cpu
    cpu_costs = [
        cpu.step_s.value,
        cpu.per_running_seq_s.value,
        cpu.per_waiting_seq_s.value,
        cpu.per_token_s.value,
        cpu.per_sampled_seq_s.value,
    ]
    scale = eng.layer_overhead_scale.get(g.name)
    layer_s = (
        (eng.layer_overhead_s.value * a.num_layers if eng.layer_overhead_s else 0.0)
        + (eng.moe_layer_overhead_s.value * a.moe_layers if eng.moe_layer_overhead_s else 0.0)
    ) * (scale.value if scale is not None else 1.0)
    bw = g.memory_bandwidth_Bps.value
    elem = elementwise_bytes_per_token(dep) / (bw * meff.max_eff)
    moe_comm = moe_exchange(dep)
    if prof is not None and prof.step_overhead_s is not None:
        # A calibrated per-step overhead (a harness fit on the real server) replaces the engine's launch,
        # CPU and per-layer defaults: it measured all of them at once; its compute curve likewise measured
        # every kernel's per-token work together, element-wise ones included.
        graph = eager = prof.step_overhead_s
        cpu_costs = [0.0] * 5
        layer_s = elem = 0.0
    prefill_step = (prof.prefill_step_overhead_s or 0.0) if prof is not None else 0.0
    return StepModel(
        comp_a=comp_a,
        comp_b=comp_b,
        lm_coef=lm_coef,
        lm_half=lm_curve.half,
        attn_s_per_pair=4.0 * a.num_layers * a.attn_dim / gpus / (g.flops(plain) * aeff.max_eff),
        attn_half=aeff.half,
        dense_weight_bytes=dense_bytes,
        expert_bytes=expert_bytes,
        n_experts=a.num_experts,
        experts_per_token=a.experts_per_token,
        kv_bytes_per_token=kv_bytes_per_token(dep),
        act_bytes_per_token=4.0 * a.hidden_size * ACT_BYTES * a.num_layers / dep.pp,
        elem_s_per_token=elem,
        peak_bw=bw,
        meff=meff,
        # A token crosses every stage, so it pays every layer's kernel floors and all-reduces in series.
        mem_floor_bytes=linear_kernels(a, bool(measured)) * meff.half,
        # One message per all-reduce: this step's hidden states in bf16 (vLLM reduces activations in the
        # model dtype whatever the weight format).
        ar_msg_bytes_per_token=a.hidden_size * ACT_BYTES,
        # the q and k variances of every token, fp32, one all-reduce per attention layer
        ar_small_per_step=a.num_layers if a.qk_norm_whole else 0,
        ar_small_bytes_per_token=2 * 4.0 if a.qk_norm_whole else 0.0,
        # Attention and dense-MLP layers reduce over the rank's tp; MoE layers too when their experts are
        # TP-sharded within the rank alone, else they exchange tokens across the instance (moe_comm_*).
        ar_per_step=2 * a.num_layers - (a.moe_layers if moe_comm else 0),
        ar_bw=dep.intra_link.effective_Bps,
        ar_latency=dep.intra_link.latency_s.value,
        tp=dep.tp,
        pp=dep.pp,
        pp_handoff_s=dep.intra_link.latency_s.value,
        graph_launch=graph,
        eager_launch=eager,
        max_graph_tokens=0 if dep.knobs.enforce_eager else dep.knobs.max_cudagraph_capture_size,
        graphs_mixed=eng.graphs_for_mixed_batches,
        # SGLang runs a linear-attention model with its prefix cache on without the overlap scheduler.
        overlapped=eng.scheduling_overlapped
        and (eng.overlap_with_linear_prefix_cache or not a.num_linear_layers or not dep.knobs.prefix_caching),
        cpu_step=cpu_costs[0],
        cpu_run=cpu_costs[1],
        cpu_wait=cpu_costs[2],
        cpu_tok=cpu_costs[3],
        cpu_sample=cpu_costs[4],
        # Every layer runs in series for a token, whatever the pipeline split.
        layer_s=layer_s,
        compute_groups=tuple(parts) + (("lm_head", lm.compute_dtype, lm_coef, lm_curve.half),),
        exp_a=exp_a,
        exp_b=exp_b,
        moe_token_scale=dep.dp,
        moe_layers=a.moe_layers,
        prefill_step_s=prefill_step,
        moe_pads_dp=eng.moe_dispatch != "all_to_all",
        **{k: v for k, v in measured.items() if k not in ("exp_a", "exp_b")},
        **moe_comm,
        **({"kv_max_eff": deff.max_eff, "kv_floor_bytes": a.num_layers * deff.half} | apart),
        kernels_apart=bool(apart),
        **_allreduce_tables(dep),
    )
