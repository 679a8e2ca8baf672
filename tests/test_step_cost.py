"""The step's cost (simulator/step_closures.py, the only implementation) against hand-computed cases.

A made-up model with round coefficients: a decode step that streams its weights (memory-bound), a long
prompt chunk that is compute-bound, routed experts (one token touches exactly top-k of them), and a
pipeline its sequences cannot fill.  Then, on real models that take each branch (dense, measured and
ring all-reduce, pipeline, routed experts, MLA and linear-attention kernels, attention data parallelism),
the engine's decode function, which keeps the terms that depend on the batch size once computed, gives
the bits of the general step on the same decode-only step.
"""

from __future__ import annotations

import dataclasses
import pickle
import random

import pytest

from hwdb.schema import EfficiencyCurve
from simulator.resolved import resolve
from simulator.step_closures import step_functions
from simulator.stepmodel import StepModel
from tests.conftest import pool, scenario

BW, MEM_EFF, KV_EFF = 2e12, 0.8, 0.7
WEIGHTS, KV_TOKEN, ACT_TOKEN, MEM_FLOOR, KV_FLOOR = 16e9, 131072.0, 8192.0, 1e6, 1e5
COMP_A, COMP_B, LM, LM_HALF = 1e-6, 1e-4, 2e-7, 64.0
PAIR_S, PAIR_HALF = 1e-12, 128.0
ELEM, LAYER, GRAPH, EAGER = 1e-8, 5e-4, 1e-4, 3e-4
CPU = dict(cpu_step=2e-4, cpu_run=1e-6, cpu_wait=5e-7, cpu_tok=1e-8, cpu_sample=2e-7)


def hand_model(**over) -> StepModel:
    base = dict(
        comp_a=COMP_A,
        comp_b=COMP_B,
        lm_coef=LM,
        lm_half=LM_HALF,
        attn_s_per_pair=PAIR_S,
        attn_half=PAIR_HALF,
        dense_weight_bytes=WEIGHTS,
        expert_bytes=0.0,
        n_experts=0,
        experts_per_token=0,
        kv_bytes_per_token=KV_TOKEN,
        act_bytes_per_token=ACT_TOKEN,
        peak_bw=BW,
        meff=EfficiencyCurve(max_eff=MEM_EFF, half=1e6, source="hand-made"),
        mem_floor_bytes=MEM_FLOOR,
        ar_msg_bytes_per_token=0.0,
        ar_per_step=0,
        ar_bw=1e11,
        ar_latency=1e-5,
        tp=1,
        pp=1,
        pp_handoff_s=2e-5,
        graph_launch=GRAPH,
        eager_launch=EAGER,
        max_graph_tokens=512,
        graphs_mixed=False,
        overlapped=False,
        layer_s=LAYER,
        kv_max_eff=KV_EFF,
        kv_floor_bytes=KV_FLOOR,
        elem_s_per_token=ELEM,
        **CPU,
    )
    return StepModel(**(base | over))


def host(tokens, logits, running, waiting=0):
    return (
        CPU["cpu_step"]
        + CPU["cpu_run"] * running
        + CPU["cpu_wait"] * waiting
        + CPU["cpu_tok"] * tokens
        + CPU["cpu_sample"] * logits
    )


def test_a_decode_step_streams_the_weights_and_the_kv_cache():
    m = hand_model()
    n, ctx = 64, 64 * 1000.0
    weights = (WEIGHTS + (KV_TOKEN + ACT_TOKEN) * n + MEM_FLOOR) / (BW * MEM_EFF)
    compute = COMP_A * n + COMP_B + LM * n * (n + LM_HALF) / n
    assert weights > 50 * compute  # memory-bound
    kv = (KV_TOKEN * ctx + KV_FLOOR) / (BW * KV_EFF)
    gpu = weights + kv + ELEM * n + LAYER + GRAPH  # in a CUDA graph: n <= 512
    want = gpu + host(n, n, n)  # host time not overlapped
    assert m.step_time(n, n, 0.0, ctx, 0.0, n, 0) == pytest.approx(want, rel=1e-12)
    assert m.decode_time(n, 1000) == pytest.approx(want, rel=1e-12)
    assert step_functions(m)[1](n, ctx, n) == m.decode_time(n, 1000)
    overlapped = dataclasses.replace(m, overlapped=True)
    assert overlapped.decode_time(n, 1000) == pytest.approx(gpu, rel=1e-12)  # the host's time hides


def test_a_long_prompt_chunk_is_compute_bound_and_runs_eagerly():
    m = hand_model()
    c, done, decodes = 16384, 0, 16
    tokens, pairs = c + decodes, c * (c + 1) / 2
    compute = COMP_A * tokens + COMP_B + LM * (decodes + 1) * (tokens + LM_HALF) / tokens
    weights = (WEIGHTS + (KV_TOKEN + ACT_TOKEN) * tokens + MEM_FLOOR) / (BW * MEM_EFF)
    assert compute > weights
    attention = pairs * PAIR_S * (tokens + PAIR_HALF) / tokens + (KV_TOKEN * decodes * 500 + KV_FLOOR) / (BW * KV_EFF)
    want = compute + attention + ELEM * tokens + LAYER + EAGER + host(tokens, decodes + 1, decodes + 1, 3)
    got = m.step_time(tokens, decodes + 1, pairs, decodes * 500.0, float(done), decodes + 1, 3)
    assert got == pytest.approx(want, rel=1e-12)
    with_prefill_cost = dataclasses.replace(m, prefill_step_s=1e-3)
    assert with_prefill_cost.step_time(
        tokens, decodes + 1, pairs, decodes * 500.0, 0.0, decodes + 1, 3
    ) == pytest.approx(want + 1e-3, rel=1e-12)
    assert with_prefill_cost.decode_time(8, 100) == m.decode_time(8, 100)  # a decode-only step has no chunk


def test_routed_experts_one_token_touches_top_k_of_them():
    m = hand_model(n_experts=8, experts_per_token=2, expert_bytes=1e8, exp_a=1e-6, exp_b=1e-5)
    assert m.touched_experts(1) == pytest.approx(2.0, rel=1e-12)
    assert m.touched_experts(10_000) == pytest.approx(8.0, rel=1e-12)
    assert m.moe_time(1) == pytest.approx(max(1e-6 + 1e-5, 2 * 1e8 / (BW * MEM_EFF)), rel=1e-12)
    dense = hand_model()
    assert m.decode_time(1, 100) == pytest.approx(dense.decode_time(1, 100) + 2 * 1e8 / (BW * MEM_EFF), rel=1e-12)


def test_a_pipeline_one_sequence_cannot_fill_idles_its_stages():
    m, one = hand_model(pp=2), hand_model()
    n, ctx = 1, 1000.0
    weights = (WEIGHTS * 2 + (KV_TOKEN + ACT_TOKEN) * n + MEM_FLOOR) / (BW * MEM_EFF)  # every stage's weights
    kv = (KV_TOKEN * ctx + KV_FLOOR) / (BW * KV_EFF)
    want = weights + 2 * kv + 2 * ELEM * n + LAYER + 2e-5 + 2 * GRAPH + host(n, n, 1)
    assert m.step_time(n, n, 0.0, ctx, 0.0, 1, 0) == pytest.approx(want, rel=1e-12)
    assert step_functions(m)[1](n, ctx, 1) == m.step_time(n, n, 0.0, ctx, 0.0, 1, 0)
    assert m.step_time(n, n, 0.0, ctx, 0.0, 1, 0) > one.step_time(n, n, 0.0, ctx, 0.0, 1, 0)


def test_the_model_pickles_without_its_closures():
    m = hand_model()
    m.decode_time(4, 10)
    back = pickle.loads(pickle.dumps(m))
    assert back == m and back.decode_time(4, 10) == m.decode_time(4, 10)


MODELS = {
    "8b h100 tp1": dict(model="Llama-3.1-8B", pools=pool(gpu="H100", tp=1)),
    "8b h200 tp2": dict(model="Llama-3.1-8B", pools=pool(gpu="H200", tp=2)),
    "70b a100 tp2 pp2": dict(model="Llama-2-70B", pools=pool(gpu="A100-80GB", tp=2, pp=2)),
    "moe": dict(model="Qwen3-30B-A3B", pools=pool(gpu="H200", tp=2)),
    "moe dp2 sglang": dict(model="Qwen3-30B-A3B", pools=pool(gpu="H200", tp=2, dp=2, engine={"engine": "sglang"})),
    "mla": dict(
        model="DeepSeek-V3",
        pools=pool(gpu="B200", tp=8, dtype="fp8", kv_cache_dtype="fp8", engine={"engine": "sglang"}),
    ),
    "linear attention": dict(
        model="Qwen3.5-397B-A17B", pools=pool(gpu="B200", tp=4, dtype="fp8", engine={"engine": "sglang"})
    ),
}


def _models():
    for name, over in MODELS.items():
        step = resolve(scenario(**over)).pools[0].step
        yield name, step
        yield (
            name + " ring, serial host",
            dataclasses.replace(step, ar_sizes=(), ar_graph=(), ar_eager=(), overlapped=not step.overlapped),
        )


@pytest.mark.parametrize("name,m", list(_models()), ids=lambda x: x if isinstance(x, str) else "")
def test_the_decode_function_gives_the_general_steps_bits(name, m):
    step, dec = step_functions(m)
    assert (step, dec) == (m.cost.step, m.cost.decode)
    rnd = random.Random(7)
    for _ in range(500):
        n = rnd.choice([1, 2, 7, 64, 255, 256, 257, 511, 512, 513, 1024, 4096])
        ctx = n * rnd.randint(0, 20000)
        # a fifth of the draws with fewer sequences than a pipeline's stages (the idle-stage branch)
        running = rnd.randint(0, 600) if rnd.random() < 0.8 else rnd.randint(0, 3)
        assert dec(n, ctx, running).hex() == step(n, n, 0.0, ctx, 0.0, running, 0).hex()
    assert step(0, 0, 0.0, 0.0) == dec(0, 0, 0) == 0.0
