"""The step-time model as closures for the engine's step loop: :func:`step_functions`.

The closures do :meth:`simulator.stepmodel.StepModel.step_time`'s float operations in the same order with
the coefficients read once, so they give the same bits (tests/test_step_functions.py) at a fraction of the
attribute lookups; a decode step keeps the terms that depend on its batch alone once computed.
"""
from __future__ import annotations

from simulator.stepmodel import StepModel, interp_linear


def step_functions(m: StepModel):
    """``m.step_time`` as closures over its coefficients, for the engine's step loop: ``(step, decode)``.

    ``step(tokens, seqs_logits, attn_pairs, decode_ctx, prefill_ctx, running, waiting)`` is
    ``m.step_time``; ``decode(n, ctx, running)`` is ``m.step_time(n, n, 0.0, ctx, 0.0, running, 0) + 0.0``,
    a decode-only step of ``n`` sequences attending ``ctx`` tokens in all.  Both do the same float
    operations in the same order as the methods (so the same bits: tests/test_step_functions.py), with
    the coefficients read once instead of at every call, and ``decode`` keeps the terms that depend on
    ``n`` alone once computed.  A model with routed experts, linear-attention or MLA kernels keeps the methods.
    """
    if m.n_experts or m.kernels_apart:
        return m.step_time, (lambda n, ctx, running: m.step_time(n, n, 0.0, ctx, 0.0, running, 0) + 0.0)
    comp_a, comp_b, lm_coef, lm_half = m.comp_a, m.comp_b, m.lm_coef, m.lm_half
    w_pp = m.dense_weight_bytes * m.pp
    kvb, actb, mem_floor = m.kv_bytes_per_token, m.act_bytes_per_token, m.mem_floor_bytes
    bw_lin = m.peak_bw * m.meff.max_eff
    attn_pp, attn_half = m.attn_s_per_pair, m.attn_half
    kv_floor, bw_kv = m.kv_floor_bytes, m.peak_bw * m.kv_max_eff
    elem, layer_s = m.elem_s_per_token, m.layer_s
    max_graph, mixed = m.max_graph_tokens, m.graphs_mixed
    tp, ar_n, ar_msg = m.tp, m.ar_per_step, m.ar_msg_bytes_per_token
    ar_sizes, ar_graph, ar_eager = m.ar_sizes, m.ar_graph, m.ar_eager
    ring = 2.0 * (tp - 1) / tp
    ar_bw, ar_lat = m.ar_bw, m.ar_latency
    pp = m.pp
    pp_extra = (pp - 1) * m.pp_handoff_s
    g_launch, e_launch = m.graph_launch, m.eager_launch
    cpu_step, cpu_run, cpu_wait, cpu_tok, cpu_sample = m.cpu_step, m.cpu_run, m.cpu_wait, m.cpu_tok, m.cpu_sample
    overlapped = m.overlapped

    def step(tokens, seqs_logits, attn_pairs, decode_ctx, prefill_ctx=0.0, running=0, waiting=0):
        if tokens <= 0:
            return 0.0
        t_comp = comp_a * tokens + comp_b
        if seqs_logits:
            t_comp += lm_coef * seqs_logits * (tokens + lm_half) / tokens
        t_mem = (w_pp + kvb * (prefill_ctx + tokens) + actb * tokens + mem_floor) / bw_lin
        att = attn_pairs * attn_pp * (tokens + attn_half) / tokens if attn_pairs > 0.0 else 0.0
        if decode_ctx > 0.0:
            att += (kvb * decode_ctx + kv_floor) / bw_kv
        elem_t = elem * tokens
        idle = 1.0
        if pp > 1 and running < pp:
            idle = pp / (running if running > 1 else 1)
            t_comp *= idle
            att *= idle
            elem_t *= idle
        t = (t_comp if t_comp > t_mem else t_mem) + att + elem_t + layer_s
        graph = tokens <= max_graph and (mixed or attn_pairs == 0.0)
        if tp > 1:
            mb = ar_msg * tokens
            if ar_sizes:
                t += ar_n * interp_linear(ar_sizes, ar_graph if graph else ar_eager, mb)
            else:
                t += ar_n * (ring * mb / ar_bw + ar_lat)
        if pp > 1:
            t += pp_extra
        t += (g_launch if graph else e_launch) * idle
        cpu = cpu_step + cpu_run * running + cpu_wait * waiting + cpu_tok * tokens + cpu_sample * seqs_logits
        if overlapped:
            return t if t > cpu else cpu
        return t + cpu

    w0 = cpu_wait * 0
    terms: dict[int, tuple] = {}             # n -> the decode step's terms that depend on n alone

    def decode_terms(n: int) -> tuple:
        t_comp = comp_a * n + comp_b
        t_comp += lm_coef * n * (n + lm_half) / n
        t_mem = (w_pp + kvb * (0.0 + n) + actb * n + mem_floor) / bw_lin
        graph = n <= max_graph
        ar = 0.0
        if tp > 1:
            mb = ar_msg * n
            if ar_sizes:
                ar = ar_n * interp_linear(ar_sizes, ar_graph if graph else ar_eager, mb)
            else:
                ar = ar_n * (ring * mb / ar_bw + ar_lat)
        t = terms[n] = (t_comp if t_comp > t_mem else t_mem, elem * n, ar, g_launch if graph else e_launch,
                        cpu_tok * n, cpu_sample * n)
        return t

    # The step's terms add in step()'s order; the all-reduce (tp = 1) and pipeline (pp = 1) terms are
    # then +0.0, which leaves the positive sum as it is.
    ppx = pp_extra if pp > 1 else 0.0

    def decode(n, ctx, running):
        if n <= 0:
            return 0.0
        if running < pp:     # a pipeline its sequences cannot fill: step() prices the idle stages
            return step(n, n, 0.0, ctx, 0.0, running, 0) + 0.0
        roof, en, ar, launch, tok, smp = terms.get(n) or decode_terms(n)
        t = roof + (0.0 + (kvb * ctx + kv_floor) / bw_kv if ctx > 0.0 else 0.0) + en + layer_s + ar + ppx + launch
        cpu = cpu_step + cpu_run * running + w0 + tok + smp
        if overlapped:
            return (t if t > cpu else cpu) + 0.0
        return t + cpu + 0.0

    return step, decode
