"""Validate ``simulator/perf.py`` against kernel measurements that no fit used (docs/validation/perf.md):
Vidur's H100 Llama-2-70B operator timings and all-reduce table, and aiconfigurator's GEMM, NCCL and vLLM
all-reduce tables (H100, H200), read from ``../shared/data/kernels``; they skip when ``../shared`` is
absent.  The roofline checks that need no data are in test_perf_validation.py, whose docstring says how
the thresholds were set.

Run ``.venv/bin/python -m pytest tests/test_perf_vs_measured.py -s`` to see the error tables.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import hwdb
from calibration.validation import perf_check as pc
from tests.perf_models import KERNELS, deployment, needs_shared, show, step_model


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


# =========================================================================== measured data


@pytest.fixture(scope="module")
def linear_cmp(db):
    if not KERNELS.is_dir():
        pytest.skip(f"{KERNELS} is absent")
    m = db.model("Llama-2-70B")
    models = {tp: step_model(db, "Llama-2-70B", tp=tp) for tp in (1, 2, 4, 8)}
    meas = pc.load_vidur_linear(KERNELS / pc.VIDUR / pc.VIDUR_LINEAR_CSV, m.arch.num_layers)
    return pc.compare_linear(models, m.arch, meas)


def _by(df: pd.DataFrame, col: str, err: str = "err") -> dict:
    return {k: pc.summarize(g[err]) for k, g in df.groupby(col)}


@needs_shared
def test_linear_layers_vs_vidur_h100_llama2_70b(linear_cmp):
    c = linear_cmp
    assert set(c["tp"]) == {1, 2, 4, 8} and len(c) > 1000
    show(
        "Linear layers, Llama-2-70B on H100, model (step_time form) vs Vidur: all points",
        pc.error_table(c.assign(points="all"), ["points"]),
    )
    show("... by regime (memory: tokens <= 64, compute: >= 512, ridge: between)", pc.error_table(c, ["regime"]))
    show("... by regime and TP", pc.error_table(c, ["regime", "tp"]).sort_values(["regime", "tp"]))
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
            rows.append(
                {
                    "tp": f"{a}->{b}",
                    "tokens": name,
                    "measured": round(float((p_meas[a] / p_meas[b])[sel].median()), 2),
                    "model": round(float((p_mod[a] / p_mod[b])[sel].median()), 2),
                }
            )
    t = pd.DataFrame(rows)
    show("Speed-up from more TP (time ratio), median over token counts", t)
    big, small = t[t["tokens"] == "tokens >= 2048"], t[t["tokens"] == "tokens <= 64"]
    assert np.allclose(big["model"], big["measured"], rtol=0.10)
    assert np.allclose(small["model"], small["measured"], rtol=0.08)


@needs_shared
def test_vidur_vs_aiconfigurator_gemm_source_gap(db):
    """On cells both sources measured, Vidur is slower than aiconfigurator; the model sits near the latter."""
    arch = db.model("Llama-2-70B").arch
    models = {tp: deployment(db, "Llama-2-70B", tp=tp) for tp in (1, 2, 4, 8)}
    x = pc.vidur_vs_aic_gemm(
        KERNELS / pc.VIDUR / pc.VIDUR_LINEAR_CSV, KERNELS / pc.AIC / "h100_sxm" / pc.AIC_GEMM, arch, models
    )
    x["regime"] = pc.regime_of(x["m"])
    show("Same GEMM cells (m, n, k): Vidur / aiconfigurator - 1", pc.error_table(x, ["regime"], "vidur_vs_aic"))
    show("Same cells: per-GEMM model / aiconfigurator - 1", pc.error_table(x, ["regime"], "model_vs_aic"))
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
    sm8, sm16 = deployment(db, "Llama-3.1-70B", tp=4, dtype="fp8"), deployment(db, "Llama-3.1-70B", tp=4)
    path = KERNELS / pc.AIC / "h100_sxm" / pc.AIC_GEMM
    f8, bf = pc.load_aic_gemm(path, "fp8"), pc.load_aic_gemm(path, "bf16")
    g = pc.dense_layer_gemms(db.model("Llama-3.1-70B").arch, 4)
    n_up, k_up = g.pop("mlp_up_proj")  # the table has the gate and up halves, not the fused width
    layer = list(g.values()) + [(n_up // 2, k_up)] * 2
    x = f8[[(n, k) in set(layer) for _, n, k in f8.index]].rename("measured_s").reset_index()
    x["err"] = [pc.gemm_time(sm8, m, n, k, "fp8") / t - 1.0 for m, n, k, t in x.itertuples(index=False)]
    x["regime"] = pc.regime_of(x["m"])
    show(
        "fp8 GEMMs of Llama-3.1-70B TP4 on H100 (aiconfigurator Cutlass fp8): model / measured - 1",
        pc.error_table(x, ["regime"]),
    )
    # Whole layer (sum of its GEMMs) at prefill sizes, and the fp8 speed-up over bf16.
    ms = sorted(set(x["m"]) & {m for m, _, _ in bf.index})
    rows = []
    for m in ms:
        if m < pc.COMPUTE_BOUND_MIN_TOKENS or any(
            (m, n, k) not in bf.index or (m, n, k) not in f8.index for n, k in layer
        ):
            continue
        meas8, meas16 = sum(f8[(m, n, k)] for n, k in layer), sum(bf[(m, n, k)] for n, k in layer)
        mod8 = sum(pc.gemm_time(sm8, m, n, k, "fp8") for n, k in layer)
        mod16 = sum(pc.gemm_time(sm16, m, n, k, "bf16") for n, k in layer)
        rows.append(
            {"m": m, "err": mod8 / meas8 - 1.0, "measured_speedup": meas16 / meas8, "model_speedup": mod16 / mod8}
        )
    lay = pd.DataFrame(rows)
    show("fp8 layer (sum of 5 GEMMs), m >= 512: model / measured - 1", pc.error_table(lay.assign(m=">= 512"), ["m"]))
    show(
        "... bf16 / fp8 time (fp8 speed-up), median over m",
        pd.DataFrame(
            [
                {
                    "n": len(lay),
                    "measured": round(float(lay["measured_speedup"].median()), 2),
                    "model": round(float(lay["model_speedup"].median()), 2),
                }
            ]
        ),
    )
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
        models = {tp: step_model(db, "Llama-2-70B", gpu=gpu, tp=tp) for tp in (2, 4, 8)}
        sources = {
            "aic vLLM graph": pc.load_aic_allreduce(KERNELS / pc.AIC / system / pc.AIC_VLLM),
            "aic NCCL 2.29": pc.load_aic_allreduce(KERNELS / pc.AIC / system / pc.AIC_NCCL),
        }
        if gpu == "H100":
            sources["Vidur NCCL"] = pc.load_vidur_allreduce(KERNELS / pc.VIDUR / pc.VIDUR_ALLREDUCE_CSV)
        for name, meas in sources.items():
            frames.append(pc.compare_allreduce(models, meas).assign(source=name, gpu=gpu))
    c = pd.concat(frames, ignore_index=True)
    order = {b[0]: i for i, b in enumerate(pc.AR_BANDS)}
    t = pc.error_table(c, ["source", "gpu", "band"])
    t = t.assign(o=t["band"].map(order)).sort_values(["source", "gpu", "o"]).drop(columns="o")
    show(f"All-reduce per call, model (ring, {m.arch.hidden_size}-wide bf16 rows) vs measured, TP 2/4/8 pooled", t)
    show("... by source, all bands", pc.error_table(c, ["source", "gpu"]))
    # Point values at typical step sizes (hidden 8192), microseconds.
    vllm = pc.load_aic_allreduce(KERNELS / pc.AIC / "h100_sxm" / pc.AIC_VLLM)
    nccl = pc.load_aic_allreduce(KERNELS / pc.AIC / "h100_sxm" / pc.AIC_NCCL)
    rows = []
    for tp in (2, 4, 8):
        sm = step_model(db, "Llama-2-70B", tp=tp)
        for tokens in (1, 16, 128, 1024, 8192):
            b = tokens * m.arch.hidden_size * 2.0
            rows.append(
                {
                    "tp": tp,
                    "tokens": tokens,
                    "model_us": round(pc.allreduce_time(sm, b) * 1e6, 1),
                    "vllm_graph_us": round(pc.interp_measured(vllm, tp, b) * 1e6, 1),
                    "nccl_us": round(pc.interp_measured(nccl, tp, b) * 1e6, 1),
                }
            )
    show("H100 all-reduce of `tokens` x 8192 bf16 (us)", pd.DataFrame(rows))
    assert len(t) == 5 * len(pc.AR_BANDS)  # 3 sources on H100, 2 on H200, every band present
    for r in t.itertuples(index=False):
        limit = AR_LIMITS[r.source][order[r.band]]
        assert r.median < limit, (r.source, r.gpu, r.band, r.median, limit)
    # The latency term: one to four decode tokens (<= 64 KiB), every point, both ways.
    small = c[(c["source"] == "aic vLLM graph") & (c["bytes"] <= 64 * 2**10)]
    ratio = small["model_s"] / small["measured_s"]
    assert len(small) == 18 and 0.77 < ratio.min() and ratio.max() < 1.18
