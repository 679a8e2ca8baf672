"""The step's cost, the only implementation: :func:`step_cost` builds it from a StepModel's coefficients.

Every term of a step (:mod:`simulator.stepmodel` lists them) is written once here, as a closure over the
coefficients, which are read once when the closures are built instead of at every call.
:class:`~simulator.stepmodel.StepModel`'s methods (``step_time``, ``local_time``, ``moe_time``,
``linear_time``, ...) call these closures, and the engine's step loop calls :func:`step_functions`'
two directly, so a step's duration has one formula wherever it is asked for.  A decode-only step keeps
the terms that depend on its batch size alone once computed (:func:`step_cost`'s ``decode``).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from simulator.stepmodel import StepModel


class StepCost(NamedTuple):
    """A step model's cost closures, which :class:`~simulator.stepmodel.StepModel`'s methods call: ``step`` is
    ``step_time``; ``local``, ``moe``, ``linear``, ``attention``, ``curve_attention``, ``mla_attention``,
    ``linear_attention`` and ``allreduce`` are the ``*_time`` methods; ``experts`` is ``expert_roofline``,
    ``touched`` is ``touched_experts``.  ``decode(n, ctx, running)`` is ``step(n, n, 0.0, ctx, 0.0, running,
    0)``, a decode-only step of ``n`` sequences attending ``ctx`` tokens in all, with the same bits."""

    step: Callable[..., float]
    decode: Callable[[int, float, int], float]
    local: Callable[..., tuple[float, float]]
    moe: Callable[..., float]
    linear: Callable[..., tuple[float, float]]
    experts: Callable[[float], tuple[float, float]]
    touched: Callable[[float], float]
    attention: Callable[..., float]
    curve_attention: Callable[[int, float, float], float]
    mla_attention: Callable[[int, float, float, int], float]
    mla_prefill: Callable[[int, float], float]
    linear_attention: Callable[[int, int, float], float]
    allreduce: Callable[..., float]


def step_functions(m: StepModel):
    """The engine's step loop's two cost functions, ``(step, decode)`` (:class:`StepCost`)."""
    cost = m.cost
    return cost.step, cost.decode


def step_cost(m: StepModel) -> StepCost:
    """The closures of a step's cost over ``m``'s coefficients (:class:`StepCost`)."""
    comp_a, comp_b, lm_coef, lm_half = m.comp_a, m.comp_b, m.lm_coef, m.lm_half
    w_pp = m.dense_weight_bytes * m.pp
    kvb, actb, mem_floor = m.kv_bytes_per_token, m.act_bytes_per_token, m.mem_floor_bytes
    bw_lin = m.peak_bw * m.meff.max_eff
    attn_pp, attn_half = m.attn_s_per_pair, m.attn_half
    kv_floor, bw_kv = m.kv_floor_bytes, m.peak_bw * m.kv_max_eff
    elem, layer_s = m.elem_s_per_token, m.layer_s
    max_graph, mixed = m.max_graph_tokens, m.graphs_mixed
    tp, ar_n, ar_msg = m.tp, m.ar_per_step, m.ar_msg_bytes_per_token
    ar_small_n, ar_small = m.ar_small_per_step, m.ar_small_bytes_per_token
    ar_sizes, ar_graph, ar_eager = m.ar_sizes, m.ar_graph, m.ar_eager
    ring = 2.0 * (tp - 1) / tp
    ar_bw, ar_lat = m.ar_bw, m.ar_latency
    pp = m.pp
    pp_extra = (pp - 1) * m.pp_handoff_s
    g_launch, e_launch = m.graph_launch, m.eager_launch
    prefill_s = m.prefill_step_s
    cpu_step, cpu_run, cpu_wait, cpu_tok, cpu_sample = m.cpu_step, m.cpu_run, m.cpu_wait, m.cpu_tok, m.cpu_sample
    overlapped, apart = m.overlapped, m.kernels_apart
    n_exp, scale = m.n_experts, m.moe_token_scale
    exp_bytes, exp_a, exp_b = m.expert_bytes, m.exp_a, m.exp_b
    miss = 1.0 - m.experts_per_token / n_exp if n_exp else 1.0  # a token's chance to skip a given expert
    bw_exp = m.peak_bw * (m.exp_mem_eff or m.meff.max_eff)
    exp_fixed, exp_tok, exp_expert = m.exp_fixed_s, m.exp_s_per_token, m.exp_s_per_expert
    comm_tok, comm_lat, moe_layers = m.moe_comm_s_per_token, m.moe_comm_lat_s, m.moe_layers
    mla = m.mla_fixed_s
    mla_prompt, mla_seq, mla_pair, mla_half_len, mla_half_tok = (
        m.mla_prompt_s,
        m.mla_seq_s,
        m.mla_pair_s,
        m.mla_half_len,
        m.mla_half_tok,
    )
    kv_comp, kv_seq = m.kv_comp_s_per_ctx, m.kv_seq_s
    lin_ctx = m.lin_ctx_fixed_s
    lin_any = bool(m.lin_ctx_fixed_s or m.lin_gen_fixed_s)
    lin_ctx_seq, lin_ctx_prompt, lin_ctx_tok = m.lin_ctx_seq_s, m.lin_ctx_prompt_s, m.lin_ctx_tok_s
    lin_gen, lin_gen_seq = m.lin_gen_fixed_s, m.lin_gen_seq_s
    dsa, dsa_seq, dsa_ctx = m.dsa_fixed_s, m.dsa_seq_s, m.dsa_ctx_s

    def linear(tokens, seqs_logits=0, prefill_ctx=0.0):
        t_comp = comp_a * tokens + comp_b
        if seqs_logits:
            t_comp += lm_coef * seqs_logits * (tokens + lm_half) / tokens
        return t_comp, (w_pp + kvb * (prefill_ctx + tokens) + actb * tokens + mem_floor) / bw_lin

    def allreduce(message_bytes, graph=True):
        if tp <= 1:
            return 0.0
        if ar_sizes:
            return interp_linear(ar_sizes, ar_graph if graph else ar_eager, message_bytes)
        return ring * message_bytes / ar_bw + ar_lat

    def touched(routed):
        return n_exp * (1.0 - miss**routed)

    def experts(routed):
        if not n_exp:
            return 0.0, 0.0
        return exp_a * routed + exp_b, exp_bytes * touched(routed) * pp / bw_exp

    def moe(routed, own=None):
        if not n_exp:
            return 0.0
        hit = touched(routed)
        t_comp, t_mem = exp_a * routed + exp_b, exp_bytes * hit * pp / bw_exp
        t = t_comp if t_comp > t_mem else t_mem
        if exp_fixed:
            t += exp_fixed + exp_tok * routed + exp_expert * hit
        if comm_tok:
            own = routed / scale if own is None else own
            t += moe_layers * (comm_tok * own + comm_lat)
        return t

    def curve_attention(tokens, attn_pairs, decode_ctx):
        t = attn_pairs * attn_pp * (tokens + attn_half) / tokens if attn_pairs > 0.0 else 0.0
        if decode_ctx > 0.0:
            t += (kvb * decode_ctx + kv_floor) / bw_kv
        return t

    def mla_prefill(ptok, attn_pairs):
        ptok = ptok if ptok > 1 else 1
        seq = min(2.0 * attn_pairs / ptok, ptok)
        flops = attn_pairs * mla_pair * (seq + mla_half_len) / seq * (ptok + mla_half_tok) / ptok
        lone = mla_seq * seq
        return mla + mla_prompt * ptok / seq + (flops if flops > lone else lone)

    def mla_attention(tokens, attn_pairs, decode_ctx, decodes):
        t = mla_prefill(tokens - decodes, attn_pairs) if attn_pairs > 0.0 else 0.0
        if decode_ctx > 0.0:
            mem = kvb * decode_ctx / bw_kv
            comp = kv_comp * decode_ctx
            t += (mem if mem > comp else comp) + kv_floor / bw_kv + kv_seq * decodes
        return t

    def attention(tokens, attn_pairs, decode_ctx, decodes=0):
        t = (
            mla_attention(tokens, attn_pairs, decode_ctx, decodes)
            if mla
            else curve_attention(tokens, attn_pairs, decode_ctx)
        )
        if dsa and decodes:
            t += dsa + dsa_seq * decodes + dsa_ctx * decode_ctx
        return t

    def linear_attention(tokens, seqs_logits, attn_pairs):
        if not lin_any:
            return 0.0
        t, decodes = 0.0, (seqs_logits if attn_pairs > 0.0 else tokens)
        if attn_pairs > 0.0:
            ptok = tokens - seqs_logits if tokens > seqs_logits else 1
            seq = min(2.0 * attn_pairs / ptok, ptok)
            t += lin_ctx + lin_ctx_seq * seq + lin_ctx_prompt * ptok / seq + lin_ctx_tok * ptok
        if decodes > 0:
            t += lin_gen + lin_gen_seq * decodes
        return t

    def local(tokens, seqs_logits, attn_pairs, decode_ctx, prefill_ctx=0.0, running=0, waiting=0):
        t_comp, t_mem = linear(tokens, seqs_logits, prefill_ctx)
        if apart:
            att = attention(
                tokens, attn_pairs, decode_ctx, seqs_logits if attn_pairs > 0.0 else tokens
            ) + linear_attention(tokens, seqs_logits, attn_pairs)
        else:
            att = curve_attention(tokens, attn_pairs, decode_ctx)
        elem_t = elem * tokens
        idle = 1.0
        if pp > 1 and running < pp:
            # Fewer sequences than stages: the step's micro-batches cannot fill the pipeline, and a stage
            # idles while the others work on them (one sequence passes the stages in series), so the
            # per-stage work (and launch) that pp micro-batches would share takes pp / micro-batches as long.
            idle = pp / (running if running > 1 else 1)
            t_comp *= idle
            att *= idle
            elem_t *= idle
        t = (t_comp if t_comp > t_mem else t_mem) + att + elem_t + layer_s
        graph = tokens <= max_graph and (mixed or attn_pairs == 0.0)
        if tp > 1:
            t += ar_n * allreduce(ar_msg * tokens, graph) + (
                ar_small_n * allreduce(ar_small * tokens, graph) if ar_small_n else 0.0
            )
        if pp > 1:
            t += pp_extra
        t += (g_launch if graph else e_launch) * idle
        if attn_pairs > 0.0:
            t += prefill_s
        return t, cpu_step + cpu_run * running + cpu_wait * waiting + cpu_tok * tokens + cpu_sample * seqs_logits

    def step(tokens, seqs_logits, attn_pairs, decode_ctx, prefill_ctx=0.0, running=0, waiting=0):
        if tokens <= 0:
            return 0.0
        t, cpu = local(tokens, seqs_logits, attn_pairs, decode_ctx, prefill_ctx, running, waiting)
        if n_exp:
            t += moe(tokens * scale, tokens)
        if overlapped:
            return t if t > cpu else cpu
        return t + cpu

    w0 = cpu_wait * 0
    terms: dict[int, tuple] = {}  # n -> the decode step's terms that depend on n alone

    def decode_terms(n: int) -> tuple:
        t_comp, t_mem = linear(n, n, 0.0)
        graph = n <= max_graph
        t = terms[n] = (
            t_comp if t_comp > t_mem else t_mem,
            linear_attention(n, n, 0.0),
            elem * n,
            (ar_n * allreduce(ar_msg * n, graph) + (ar_small_n * allreduce(ar_small * n, graph) if ar_small_n else 0.0))
            if tp > 1
            else 0.0,
            g_launch if graph else e_launch,
            moe(n * scale, n),
            cpu_tok * n,
            cpu_sample * n,
        )
        return t

    # step()'s terms in its order; the all-reduce (tp = 1), pipeline (pp = 1) and routed-expert (dense)
    # terms are then +0.0, which leaves the positive sum as it is (as it leaves step()'s).
    ppx = pp_extra if pp > 1 else 0.0

    def decode(n, ctx, running):
        if n <= 0:
            return 0.0
        if running < pp:  # a pipeline its sequences cannot fill: step() prices the idle stages
            return step(n, n, 0.0, ctx, 0.0, running, 0)
        try:
            roof, lin, en, ar, launch, ex, tok, smp = terms[n]
        except KeyError:
            roof, lin, en, ar, launch, ex, tok, smp = decode_terms(n)
        if apart:
            att = attention(n, 0.0, ctx, n) + lin
        else:  # curve_attention(n, 0.0, ctx) written out: a call costs a sixth of this function
            att = (kvb * ctx + kv_floor) / bw_kv if ctx > 0.0 else 0.0
        t = roof + att + en + layer_s + ar + ppx + launch + ex
        cpu = cpu_step + cpu_run * running + w0 + tok + smp
        if overlapped:
            return t if t > cpu else cpu
        return t + cpu

    return StepCost(
        step,
        decode,
        local,
        moe,
        linear,
        experts,
        touched,
        attention,
        curve_attention,
        mla_attention,
        mla_prefill,
        linear_attention,
        allreduce,
    )


def interp_linear(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """``ys`` at ``x``, linear between the points of increasing ``xs``; the first value below them,
    the last segment's line above them (O(log n))."""
    i = bisect_left(xs, x)
    if i == 0:
        return ys[0]
    if i == len(xs):
        i -= 1
    x0, y0 = xs[i - 1], ys[i - 1]
    return y0 + (x - x0) * (ys[i] - y0) / (xs[i] - x0)
