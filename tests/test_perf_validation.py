"""Validate ``simulator/perf.py`` against kernel measurements that no fit used (docs/validation/perf.md).

Run ``.venv/bin/python -m pytest tests/test_perf_validation.py -s`` to see the error tables.

Two groups of tests:

* Roofline sanity checks that need no data: which bound wins, TP scaling, fp8
  bytes and compute curve, MoE expert reads, the input embedding left out of
  the streamed bytes, MLA KV replication, the per-GEMM memory floor, and that
  ``calibration.perf_check`` reproduces ``StepModel.step_time`` term by term.
* Comparisons with Vidur's H100 Llama-2-70B operator timings and all-reduce
  table, and aiconfigurator's GEMM, NCCL and vLLM all-reduce tables (H100,
  H200), read from ``../shared/data/kernels``.  They skip when ``../shared`` is
  absent.

Each threshold is the achieved error (vLLM 0.24.0 profiles and hwdb links as
committed) plus max(3 points, 20 % of it), rounded up to a whole percent (lower
bounds: minus the same).  The data files and the model are deterministic, so
the headroom is not for noise: it lets a profile refit move an error by a few
points, and it is smaller than the effect of each fixed defect, so reverting
any one of them fails a test.  The achieved numbers are in
docs/validation/perf.md.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import hwdb
from calibration import perf_check as pc
from simulator.perf import plan_memory, regime
from simulator.step_build import build_step_model
from simulator.scenario import PoolConfig, deployment_for

SHARED = Path(__file__).resolve().parents[2] / "shared"
KERNELS = SHARED / "data" / "kernels"
needs_shared = pytest.mark.skipif(not KERNELS.is_dir(),
                                  reason=f"{KERNELS} is absent (CI has ../shared); these tests read measured kernel data")


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


def _dep(db, model: str, gpu: str = "H100", tp: int = 1, dtype: str = "bf16", pp: int = 1):
    return deployment_for(PoolConfig(gpu=gpu, tp=tp, pp=pp, dtype=dtype), db.model(model), db)


def _sm(db, model: str, gpu: str = "H100", tp: int = 1, dtype: str = "bf16", pp: int = 1):
    return build_step_model(_dep(db, model, gpu, tp, dtype, pp))


def _show(title: str, table: pd.DataFrame) -> None:
    print(f"\n{title}\n{pc.format_table(table)}")


# =========================================================================== no data needed

def test_step_time_is_the_sum_of_its_kernels(db):
    """step_time = linear roofline + attention + element-wise + all-reduces + per-layer floors + launch
    (host work overlapped), and perf_check reproduces the linear and all-reduce parts."""
    for model, tp in (("Llama-3.1-8B", 1), ("Llama-2-70B", 4), ("Qwen3-30B-A3B", 2)):
        sm = dataclasses.replace(_sm(db, model, tp=tp), cpu_step=0.0, cpu_run=0.0, cpu_wait=0.0, cpu_tok=0.0,
                                 cpu_sample=0.0)
        hidden = db.model(model).arch.hidden_size
        for tokens in (1, 7, 64, 300, 512, 4096):
            graph = tokens <= sm.max_graph_tokens
            launch = sm.graph_launch if graph else sm.eager_launch
            ar = sm.ar_per_step * sm.allreduce_time(tokens * hidden * 2.0, graph) if tp > 1 else 0.0
            if graph:
                assert ar == pytest.approx(sm.ar_per_step * pc.allreduce_time(sm, tokens * hidden * 2.0), rel=1e-12)
            parts = (max(sm.linear_time(tokens, tokens, 0.0)) + sm.moe_time(tokens)
                     + sm.attention_time(tokens, 0.0, tokens * 1000.0) + sm.elem_s_per_token * tokens
                     + sm.layer_s + ar + launch)
            assert sm.step_time(tokens, tokens, 0.0, tokens * 1000.0) == pytest.approx(parts, rel=1e-12)
            assert pc.linear_time(sm, tokens) == pytest.approx(max(sm.linear_time(tokens)) + sm.moe_time(tokens),
                                                               rel=1e-12)
            assert (sm.moe_time(tokens) > 0) == (model == "Qwen3-30B-A3B")
            # regime's expert sides are moe_time's roofline (moe_time adds only the token exchange)
            comm = sm.moe_layers * (sm.moe_comm_s_per_token * tokens + sm.moe_comm_lat_s) if sm.moe_comm_s_per_token else 0.0
            assert max(sm.expert_roofline(tokens)) + comm == pytest.approx(sm.moe_time(tokens), rel=1e-12, abs=1e-15)
            assert sm.elem_s_per_token > 0 and sm.attention_time(tokens, 0.0, tokens * 1000.0) > 0


def test_allreduce_is_the_measured_curve_where_profiled_else_a_ring_over_the_link(db):
    sm = _sm(db, "Llama-2-70B", tp=8)          # H100 has a vLLM profile with a measured all-reduce
    prof = db.profile_for("H100-SXM-80GB")
    sizes, lat = prof.allreduce.table(8)
    i = sizes.index(2.0 ** 24)                 # a measured size (16 MiB): the table's own figure
    assert pc.allreduce_time(sm, sizes[i]) == pytest.approx(min(lat[i:]), rel=1e-12)
    mid = (sizes[i] + sizes[i + 1]) / 2        # between two sizes: linear in bytes
    assert min(lat[i:]) <= pc.allreduce_time(sm, mid) <= min(lat[i + 1:])
    # Never cheaper for a larger message (the tables' algorithm hand-over bumps are smoothed from below).
    grid = [2.0 ** e for e in range(8, 30)]
    assert all(pc.allreduce_time(sm, a) <= pc.allreduce_time(sm, b) for a, b in zip(grid, grid[1:]))
    # Without a profile (a datasheet GPU), a ring over the node's link.
    l4 = _sm(db, "Llama-3.1-8B", gpu="L40S", tp=2)
    link = db.link(db.gpu("L40S").intra_node_link)
    nbytes = 4096 * 2 * 1000
    assert not l4.ar_sizes and pc.allreduce_time(l4, nbytes) == pytest.approx(
        2 * 1 / 2 * nbytes / link.effective_Bps + link.latency_s.value, rel=1e-12)
    assert pc.allreduce_time(_sm(db, "Llama-2-70B", tp=1, gpu="H200"), nbytes) == 0.0


def test_memory_floor_is_the_per_gemm_sum(db):
    """(B + 4 x layers x half) / (BW*max_eff) is the sum of the fitted per-GEMM memory times."""
    arch = db.model("Llama-2-70B").arch
    for tp in (1, 8):
        sm = _sm(db, "Llama-2-70B", tp=tp)
        assert sm.mem_floor_bytes == 4 * arch.num_layers * sm.meff.half
        gemms = pc.dense_layer_gemms(arch, tp).values()
        per_gemm = sum(k * n * 2.0 / (sm.peak_bw * sm.meff.at(k * n * 2.0)) for n, k in gemms) * arch.num_layers
        wb = pc.linear_weight_bytes(arch, tp)
        assert wb == pytest.approx(sum(k * n * 2.0 for n, k in gemms) * arch.num_layers, rel=1e-12)
        assert pc.linear_time(sm, 1, wb) == pytest.approx(per_gemm, rel=1e-3)  # act bytes of one token differ
    # A token crosses every pipeline stage, so it pays every layer's GEMM floors in series.
    assert _sm(db, "Llama-2-70B", tp=4, pp=2).mem_floor_bytes == 4 * 80 * sm.meff.half


def test_decode_batch1_is_memory_bound(db):
    for model, tp in (("Llama-3.1-8B", 1), ("Llama-2-70B", 4), ("Qwen3-32B", 2)):
        sm = _sm(db, model, tp=tp)
        assert regime(sm, 1, 1, 0.0, 1024.0) == "memory"
        t_comp, t_mem = sm.linear_time(1)
        assert t_mem > 5 * t_comp  # the compute side is far below


def test_prefill_4096_is_compute_bound(db):
    for model, tp in (("Llama-3.1-8B", 1), ("Llama-2-70B", 4), ("Qwen3-32B", 2)):
        sm = _sm(db, model, tp=tp)
        assert regime(sm, 4096, 1, 4096 * 4097 / 2, 0.0) == "compute"
        t_comp, t_mem = sm.linear_time(4096)
        assert t_comp > 2 * t_mem


def test_tp2_halves_linear_time_of_large_prefill(db):
    one, two = _sm(db, "Llama-3.1-8B", tp=1), _sm(db, "Llama-3.1-8B", tp=2)
    assert pc.linear_time(one, 4096) / pc.linear_time(two, 4096) == pytest.approx(2.0, rel=0.02)
    # The whole prefill also adds two all-reduces per layer (64 x 32 MiB at TP2: ~12 ms on H100 by vLLM's
    # measured all-reduce, against ~38 ms of GEMMs), replicated norms and the host overhead, which TP
    # does not divide: a 4096-token prefill gains ~1.5x, not 2x.
    ratio = one.prefill_time(4096) / two.prefill_time(4096)
    assert 1.4 < ratio < 1.75


def test_fp8_weights_halve_weight_bytes_and_use_the_fp8_curve(db):
    dep = _dep(db, "Llama-3.1-8B", dtype="fp8")
    bf, f8 = _sm(db, "Llama-3.1-8B"), build_step_model(dep)
    a = dep.arch
    # Every decoder weight is fp8 (1 byte); the LM head stays bf16 in fp8 checkpoints.
    assert f8.dense_weight_bytes == pytest.approx(bf.dense_weight_bytes / 2 + a.lm_head_params, rel=1e-12)
    groups = {name: (dtype, coef, half) for name, dtype, coef, half in f8.compute_groups}
    assert groups["attention"][0] == groups["dense_mlp"][0] == "fp8" and groups["lm_head"][0] == "bf16"
    # fp8 takes the GEMM-by-shape curve on this deployment's own rank slices: below the curve's peak
    # (the slices are finite), with its M ramp; bf16 keeps the pooled profile curve.
    p16, shape = dep.profile.compute_efficiency, dep.profile.gemm_shape_efficiency["fp8"]
    assert groups["dense_mlp"][2] == shape.half_m
    bgroups = {name: (dtype, coef, half) for name, dtype, coef, half in bf.compute_groups}
    assert bgroups["dense_mlp"][2] == p16.half and bgroups["dense_mlp"][0] == "bf16"
    params = a.num_layers * a.dense_mlp_params
    eff8 = 2 * params / (groups["dense_mlp"][1] * dep.gpu.flops("fp8"))
    assert 0.5 * shape.max_eff < eff8 < shape.max_eff and eff8 < p16.max_eff
    # Decode at batch 1 streams the weights: fp8 saves half of the decoder's; the floors and activations stay.
    saved = pc.linear_time(bf, 1) - pc.linear_time(f8, 1)
    saved_bytes = bf.dense_weight_bytes - f8.dense_weight_bytes + bf.kv_bytes_per_token - f8.kv_bytes_per_token
    assert saved == pytest.approx(saved_bytes / (bf.peak_bw * bf.meff.max_eff), rel=1e-9)   # weights and the KV write
    assert 0.5 < pc.linear_time(f8, 1) / pc.linear_time(bf, 1) < 0.65


def test_attention_computes_at_the_bf16_peak_whatever_the_weights(db):
    """The prefill-attention curve was fitted on bf16 kernels against the bf16 peak; fp8 weights do not
    make attention faster (only the linear layers)."""
    bf, f8 = _sm(db, "Llama-3.1-70B", gpu="B200", tp=8), _sm(db, "Llama-3.1-70B", gpu="B200", tp=8, dtype="fp8")
    pairs = 8192 * 8193 / 2
    assert f8.attention_time(8192, pairs, 0.0) == pytest.approx(bf.attention_time(8192, pairs, 0.0), rel=1e-12)
    # The linear layers gain from fp8 tensor cores, though TP8's small slices keep them well below 2x.
    assert f8.comp_a < 0.9 * bf.comp_a


def test_quantised_checkpoints_keep_their_bf16_groups(db):
    """gpt-oss-120b's MXFP4 release quantises the experts only: attention, router and LM head stay bf16
    (its config's modules_to_not_convert); Kimi-K2.5's INT4 release also keeps the shared experts and the
    dense first layer."""
    oss = _dep(db, "gpt-oss-120b", gpu="B200", dtype="fp4")
    groups = {g.name: g for g in oss.linear_groups()}
    assert groups["experts"].compute_dtype == "fp4" and groups["experts"].weight_bytes == pytest.approx(0.53125)
    assert groups["attention"].weight_bytes == 2.0 and groups["attention"].compute_dtype == "bf16"
    assert groups["lm_head"].weight_bytes == groups["router"].weight_bytes == 2.0
    a = oss.arch
    expected = sum(g.params * g.weight_bytes for g in groups.values()) + a.embedding_params * 2.0
    assert oss.model_weight_bytes == pytest.approx(expected, rel=1e-12)
    assert 63e9 < oss.model_weight_bytes < 67e9   # the release's safetensors are ~65 GB (MXFP4 experts + bf16)
    kimi = {g.name: g for g in _dep(db, "Kimi-K2.5", gpu="H200", tp=8, dtype="int4").linear_groups()}
    assert kimi["experts"].compute_dtype == "bf16" and kimi["experts"].weight_bytes == pytest.approx(0.5625)
    assert all(kimi[n].weight_bytes == 2.0 for n in ("attention", "shared_experts", "dense_mlp", "lm_head"))
    # Without a bf16_modules entry every decoder group takes the format (Llama fp8): only the LM head stays.
    llama = {g.name: g for g in _dep(db, "Llama-3.1-70B", gpu="H100", tp=4, dtype="fp8").linear_groups()}
    assert llama["attention"].weight_bytes == 1.0 and llama["lm_head"].weight_bytes == 2.0


def test_input_embedding_is_not_streamed(db):
    """The untied input embedding is a gather of T rows: in memory (plan_memory), not in the streamed bytes."""
    dep = _dep(db, "Llama-3.1-8B")
    a = dep.arch
    assert not a.tie_embeddings
    assert _sm(db, "Llama-3.1-8B").dense_weight_bytes == (a.total_params - a.embedding_params) * 2.0
    assert plan_memory(dep).weight_bytes == a.total_params * 2.0
    # Tied, the one table is also the LM head, which every step streams.
    tied = dataclasses.replace(dep, arch=dataclasses.replace(a, tie_embeddings=True))
    assert build_step_model(tied).dense_weight_bytes == tied.arch.total_params * 2.0


def test_moe_decode_batch1_reads_a_fraction_of_the_experts(db):
    moe, dense = _sm(db, "Qwen3-30B-A3B"), _sm(db, "Qwen3-32B")
    a_moe = db.model("Qwen3-30B-A3B").arch
    assert a_moe.total_params == pytest.approx(db.model("Qwen3-32B").arch.total_params, rel=0.1)
    # One token touches experts_per_token of n_experts experts in each MoE layer.
    read = moe.dense_weight_bytes + moe.expert_bytes * moe.experts_per_token
    allb = moe.dense_weight_bytes + moe.expert_bytes * moe.n_experts
    assert read / allb < 0.2
    assert moe.mem_floor_bytes == 4 * a_moe.num_layers * moe.meff.half
    assert moe.streamed_weight_bytes(1) == pytest.approx(read, rel=1e-12)
    # Dense kernels and the grouped expert kernels run one after the other, each memory-bound at batch 1.
    nb = read + moe.act_bytes_per_token + moe.kv_bytes_per_token + moe.mem_floor_bytes   # weights, activations, the new KV
    assert pc.linear_time(moe, 1) == pytest.approx(nb / (moe.peak_bw * moe.meff.max_eff), rel=1e-12)
    # About a tenth of the weights read, but each layer's fixed kernel cost (the fitted per-layer and
    # MoE-layer terms) does not shrink with the active parameters, so the step is not 10x shorter.
    assert moe.decode_time(1, 1024) < 0.35 * dense.decode_time(1, 1024)
    # A large batch touches nearly every expert.
    assert pc.linear_time(moe, 4096) > 5 * pc.linear_time(moe, 1)


def test_mla_kv_bytes_are_replicated_across_tp(db):
    a = db.model("DeepSeek-V3").arch
    kv = {tp: _sm(db, "DeepSeek-V3", gpu="H200", tp=tp, dtype="fp8").kv_bytes_per_token for tp in (1, 2, 8)}
    assert kv[1] == kv[2] == kv[8] == a.num_layers * (a.kv_lora_rank + a.qk_rope_head_dim) * 1.0
    # GQA heads, by contrast, are split until each rank holds one KV head.
    gqa = {tp: _sm(db, "Llama-3.1-70B", tp=tp).kv_bytes_per_token for tp in (1, 2, 8)}
    assert gqa[2] == gqa[1] / 2 and gqa[8] == gqa[1] / 8


# =========================================================================== measured data

@pytest.fixture(scope="module")
def linear_cmp(db):
    if not KERNELS.is_dir():
        pytest.skip(f"{KERNELS} is absent")
    m = db.model("Llama-2-70B")
    models = {tp: _sm(db, "Llama-2-70B", tp=tp) for tp in (1, 2, 4, 8)}
    meas = pc.load_vidur_linear(KERNELS / pc.VIDUR / pc.VIDUR_LINEAR_CSV, m.arch.num_layers)
    return pc.compare_linear(models, m.arch, meas)


def _by(df: pd.DataFrame, col: str, err: str = "err") -> dict:
    return {k: pc.summarize(g[err]) for k, g in df.groupby(col)}


@needs_shared
def test_linear_layers_vs_vidur_h100_llama2_70b(linear_cmp):
    c = linear_cmp
    assert set(c["tp"]) == {1, 2, 4, 8} and len(c) > 1000
    _show("Linear layers, Llama-2-70B on H100, model (step_time form) vs Vidur: all points",
          pc.error_table(c.assign(points="all"), ["points"]))
    _show("... by regime (memory: tokens <= 64, compute: >= 512, ridge: between)",
          pc.error_table(c, ["regime"]))
    _show("... by regime and TP", pc.error_table(c, ["regime", "tp"]).sort_values(["regime", "tp"]))
    allp = pc.summarize(c["err"])
    assert allp["median"] < 0.16 and allp["p90"] < 0.40
    reg = _by(c, "regime")
    assert reg["memory"]["median"] < 0.09 and reg["memory"]["p90"] < 0.12
    assert reg["compute"]["median"] < 0.14 and reg["compute"]["p90"] < 0.35
    assert reg["ridge"]["median"] < 0.24 and reg["ridge"]["p90"] < 0.49
    for tp, g in c.groupby("tp"):
        assert pc.summarize(g.loc[g["regime"] == "compute", "err"])["median"] < 0.16, tp
        # The per-GEMM memory floor is what keeps high-TP decode right (TP 8 was -15.7 % with one floor).
        assert pc.summarize(g.loc[g["regime"] == "memory", "err"])["median"] < 0.10, tp


@needs_shared
def test_linear_tp_scaling_vs_vidur(linear_cmp):
    """Measured time ratios between TP degrees, against the model's."""
    p_meas = linear_cmp.pivot(index="tokens", columns="tp", values="measured_s")
    p_mod = linear_cmp.pivot(index="tokens", columns="tp", values="model_s")
    rows = []
    for a, b in ((1, 2), (2, 4), (4, 8), (1, 8)):
        for name, sel in (("tokens <= 64", p_meas.index <= 64), ("tokens >= 2048", p_meas.index >= 2048)):
            rows.append({"tp": f"{a}->{b}", "tokens": name,
                         "measured": round(float((p_meas[a] / p_meas[b])[sel].median()), 2),
                         "model": round(float((p_mod[a] / p_mod[b])[sel].median()), 2)})
    t = pd.DataFrame(rows)
    _show("Speed-up from more TP (time ratio), median over token counts", t)
    big, small = t[t["tokens"] == "tokens >= 2048"], t[t["tokens"] == "tokens <= 64"]
    assert np.allclose(big["model"], big["measured"], rtol=0.10)
    assert np.allclose(small["model"], small["measured"], rtol=0.08)


@needs_shared
def test_vidur_vs_aiconfigurator_gemm_source_gap(db):
    """On cells both sources measured, Vidur is slower than aiconfigurator; the model sits near the latter."""
    arch = db.model("Llama-2-70B").arch
    models = {tp: _dep(db, "Llama-2-70B", tp=tp) for tp in (1, 2, 4, 8)}
    x = pc.vidur_vs_aic_gemm(KERNELS / pc.VIDUR / pc.VIDUR_LINEAR_CSV,
                             KERNELS / pc.AIC / "h100_sxm" / pc.AIC_GEMM, arch, models)
    x["regime"] = pc.regime_of(x["m"])
    _show("Same GEMM cells (m, n, k): Vidur / aiconfigurator - 1",
          pc.error_table(x, ["regime"], "vidur_vs_aic"))
    _show("Same cells: per-GEMM model / aiconfigurator - 1", pc.error_table(x, ["regime"], "model_vs_aic"))
    comp = x[x["regime"] == "compute"]
    assert len(comp) > 100
    assert pc.summarize(comp["vidur_vs_aic"])["signed_median"] > 0.13
    assert pc.summarize(comp["model_vs_aic"])["median"] < 0.11
    assert pc.summarize(x["model_vs_aic"])["median"] < 0.12


@needs_shared
def test_fp8_linear_vs_aiconfigurator(db):
    """fp8 linear layers (fp8 peak x the profile's fp8 Cutlass curve) against aiconfigurator's Cutlass fp8 GEMMs.

    Not independent of the fit: the fp8 curve was fitted on this table, with
    these Llama-3.1-70B TP4 shapes held out.  One curve for all shapes is too
    slow on these large ones and too fast on small ones (docs/kernel_fit.md).
    """
    sm8, sm16 = _dep(db, "Llama-3.1-70B", tp=4, dtype="fp8"), _dep(db, "Llama-3.1-70B", tp=4)
    path = KERNELS / pc.AIC / "h100_sxm" / pc.AIC_GEMM
    f8, bf = pc.load_aic_gemm(path, "fp8"), pc.load_aic_gemm(path, "bf16")
    g = pc.dense_layer_gemms(db.model("Llama-3.1-70B").arch, 4)
    n_up, k_up = g.pop("mlp_up_proj")  # the table has the gate and up halves, not the fused width
    layer = list(g.values()) + [(n_up // 2, k_up)] * 2
    x = f8[[(n, k) in set(layer) for _, n, k in f8.index]].rename("measured_s").reset_index()
    x["err"] = [pc.gemm_time(sm8, m, n, k, "fp8") / t - 1.0 for m, n, k, t in x.itertuples(index=False)]
    x["regime"] = pc.regime_of(x["m"])
    _show("fp8 GEMMs of Llama-3.1-70B TP4 on H100 (aiconfigurator Cutlass fp8): model / measured - 1",
          pc.error_table(x, ["regime"]))
    # Whole layer (sum of its GEMMs) at prefill sizes, and the fp8 speed-up over bf16.
    ms = sorted(set(x["m"]) & {m for m, _, _ in bf.index})
    rows = []
    for m in ms:
        if m < pc.COMPUTE_BOUND_MIN_TOKENS or any((m, n, k) not in bf.index or (m, n, k) not in f8.index
                                                 for n, k in layer):
            continue
        meas8, meas16 = sum(f8[(m, n, k)] for n, k in layer), sum(bf[(m, n, k)] for n, k in layer)
        mod8 = sum(pc.gemm_time(sm8, m, n, k, "fp8") for n, k in layer)
        mod16 = sum(pc.gemm_time(sm16, m, n, k, "bf16") for n, k in layer)
        rows.append({"m": m, "err": mod8 / meas8 - 1.0, "measured_speedup": meas16 / meas8,
                     "model_speedup": mod16 / mod8})
    lay = pd.DataFrame(rows)
    _show("fp8 layer (sum of 5 GEMMs), m >= 512: model / measured - 1", pc.error_table(lay.assign(m=">= 512"), ["m"]))
    _show("... bf16 / fp8 time (fp8 speed-up), median over m",
          pd.DataFrame([{"n": len(lay), "measured": round(float(lay["measured_speedup"].median()), 2),
                         "model": round(float(lay["model_speedup"].median()), 2)}]))
    comp = pc.summarize(x.loc[x["regime"] == "compute", "err"])
    assert comp["n"] > 50 and comp["median"] < 0.24
    assert pc.summarize(x.loc[x["regime"] == "memory", "err"])["median"] < 0.15
    assert len(lay) > 20 and pc.summarize(lay["err"])["median"] < 0.40


AR_LIMITS = {  # source -> median |err| limit per band (band order as pc.AR_BANDS), H100 and H200
    "aic vLLM graph": (0.13, 0.32, 0.26, 0.22),
    "aic NCCL 2.29": (0.65, 0.58, 0.60, 0.22),
    "Vidur NCCL": (1.02, 0.93, 0.44, 0.19),
}


@needs_shared
def test_allreduce_vs_measured(db):
    """The vLLM graph-captured table is the reference (decode steps run in CUDA graphs); the NCCL ones are context."""
    m = db.model("Llama-2-70B")
    frames = []
    for system, gpu in (("h100_sxm", "H100"), ("h200_sxm", "H200")):
        models = {tp: _sm(db, "Llama-2-70B", gpu=gpu, tp=tp) for tp in (2, 4, 8)}
        sources = {"aic vLLM graph": pc.load_aic_allreduce(KERNELS / pc.AIC / system / pc.AIC_VLLM),
                   "aic NCCL 2.29": pc.load_aic_allreduce(KERNELS / pc.AIC / system / pc.AIC_NCCL)}
        if gpu == "H100":
            sources["Vidur NCCL"] = pc.load_vidur_allreduce(KERNELS / pc.VIDUR / pc.VIDUR_ALLREDUCE_CSV)
        for name, meas in sources.items():
            frames.append(pc.compare_allreduce(models, meas).assign(source=name, gpu=gpu))
    c = pd.concat(frames, ignore_index=True)
    order = {b[0]: i for i, b in enumerate(pc.AR_BANDS)}
    t = pc.error_table(c, ["source", "gpu", "band"])
    t = t.assign(o=t["band"].map(order)).sort_values(["source", "gpu", "o"]).drop(columns="o")
    _show(f"All-reduce per call, model (ring, {m.arch.hidden_size}-wide bf16 rows) vs measured, TP 2/4/8 pooled",
          t)
    _show("... by source, all bands", pc.error_table(c, ["source", "gpu"]))
    # Point values at typical step sizes (hidden 8192), microseconds.
    vllm = pc.load_aic_allreduce(KERNELS / pc.AIC / "h100_sxm" / pc.AIC_VLLM)
    nccl = pc.load_aic_allreduce(KERNELS / pc.AIC / "h100_sxm" / pc.AIC_NCCL)
    rows = []
    for tp in (2, 4, 8):
        sm = _sm(db, "Llama-2-70B", tp=tp)
        for tokens in (1, 16, 128, 1024, 8192):
            b = tokens * m.arch.hidden_size * 2.0
            rows.append({"tp": tp, "tokens": tokens, "model_us": round(pc.allreduce_time(sm, b) * 1e6, 1),
                         "vllm_graph_us": round(pc.interp_measured(vllm, tp, b) * 1e6, 1),
                         "nccl_us": round(pc.interp_measured(nccl, tp, b) * 1e6, 1)})
    _show("H100 all-reduce of `tokens` x 8192 bf16 (us)", pd.DataFrame(rows))
    assert len(t) == 5 * len(pc.AR_BANDS)  # 3 sources on H100, 2 on H200, every band present
    for r in t.itertuples(index=False):
        limit = AR_LIMITS[r.source][order[r.band]]
        assert r.median < limit, (r.source, r.gpu, r.band, r.median, limit)
    # The latency term: one to four decode tokens (<= 64 KiB), every point, both ways.
    small = c[(c["source"] == "aic vLLM graph") & (c["bytes"] <= 64 * 2 ** 10)]
    ratio = small["model_s"] / small["measured_s"]
    assert len(small) == 18 and 0.77 < ratio.min() and ratio.max() < 1.18
