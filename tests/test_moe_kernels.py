"""The measured fused-MoE kernel curves (hwdb/moe.py, calibration/kernels/moe_fit.py) and how the step model uses them.

Without ../shared the shipped curves are still checked (they load, each names its table and held-out
error, the step model's MoE part is the curve's own form); with it, a refit of one table gives the
shipped coefficients, and the held-out errors stated in the files are recomputed from the measurements.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest

import hwdb
from calibration.kernels import moe_fit
from hwdb.moe import BACKEND_SEP, FORMATS
from simulator.scenario import PoolConfig, deployment_for
from simulator.step_build import build_step_model
from tests.perf_models import KERNELS, needs_shared

MOE_TABLES = KERNELS / "aiconfigurator_0.12.0" / "data"
GPUS = ("H100-SXM-80GB", "H200-SXM-141GB", "B200-SXM-180GB", "B300-SXM", "GB200", "GB300")


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


def test_every_table_gpu_has_vllm_sglang_and_trtllm_curves_with_sources(db):
    for gpu in GPUS:
        for engine in ("vllm", "sglang", "trtllm"):
            hits = [k for k in db.moe_kernels.values() if k.gpu == gpu and k.engine == engine]
            assert len(hits) == 1, (gpu, engine)
            assert hits[0].curves, (gpu, engine)
            for fmt, c in (*hits[0].curves.items(), *hits[0].ep_curves.items()):
                assert fmt.partition(BACKEND_SEP)[0] in FORMATS
                assert "moe_perf.parquet" in c.source and "held out" in c.source
                assert c.quality.held_out_median_abs_rel_error is not None
                assert c.quality.held_out_median_abs_rel_error < 0.25, (gpu, engine, fmt)


def test_lookup_borrows_vllm_and_says_so(db):
    c, note = db.moe_curve("H100-SXM-80GB", "sglang", "fp8_block")
    assert c is db.moe_kernels["H100-SXM-80GB_sglang"].curves["fp8_block"] and "no " not in note
    c, note = db.moe_curve("H100-SXM-80GB", "sglang", "fp8_block", ep=8)
    assert c is db.moe_kernels["H100-SXM-80GB_sglang"].ep_curves["fp8_block"] and "EP layouts" in note
    # TensorRT-LLM's H100 tables measured no int4_wo kernel: vLLM's is taken, and the note says why.
    c, note = db.moe_curve("H100-SXM-80GB", "trtllm", "int4_wo")
    assert c is not None and "vllm" in note and "no trtllm int4_wo MoE table" in note
    assert db.moe_curve("A100-SXM-80GB", "vllm", "bfloat16") == (None, "")


@pytest.mark.parametrize(
    "model,gpu,tp,dtype,fmt",
    [
        ("Qwen3-235B-A22B", "H200", 4, "fp8", "fp8_block"),
        ("gpt-oss-120b", "H100", 2, "int4", "w4a16_mxfp4"),
        ("gpt-oss-120b", "B200", 1, "fp4", "nvfp4"),
        ("Kimi-K2.5", "H200", 8, "int4", "int4_wo"),
        ("Mixtral-8x7B", "H100", 2, "bf16", "bfloat16"),
    ],
)
def test_step_model_moe_part_is_the_curve_times_layers(db, model, gpu, tp, dtype, fmt):
    """With one attention rank and no expert exchange, the step model's routed-expert time is the measured
    curve's time per MoE layer times the MoE layers, at every token count (the same form, no drift)."""
    dep = deployment_for(PoolConfig(gpu=gpu, tp=tp, dtype=dtype), db.model(model), db)
    assert dep.moe_format == fmt and dep.moe_curve is not None
    sm = build_step_model(dep)
    a, cdt = dep.arch, FORMATS[fmt][0]
    # the bytes streamed: at most those the curve was fitted with (gpt-oss is held padded on Hopper)
    wbytes = min(FORMATS[fmt][1], next(g.weight_bytes for g in dep.linear_groups() if g.name == "experts"))
    for tokens in (1, 7, 64, 512, 8192):
        want = a.moe_layers * dep.moe_curve.time(
            tokens,
            a.hidden_size,
            a.moe_intermediate_size,
            a.num_experts,
            a.experts_per_token,
            dep.moe_tp,
            dep.ep,
            dep.gpu.flops(cdt),
            wbytes,
            dep.gpu.memory_bandwidth_Bps.value,
        )
        assert sm.moe_time(tokens) == pytest.approx(want, rel=1e-9)


def test_without_a_curve_the_roofline_stays(db):
    dep = deployment_for(PoolConfig(gpu="H200", tp=4, dtype="fp8"), db.model("Qwen3-235B-A22B"), db)
    bare = build_step_model(dataclasses.replace(dep, moe_curve=None))
    assert bare.exp_fixed_s == 0.0 and bare.exp_mem_eff == 0.0
    # the measured kernel is slower than the bare roofline at a decode-sized step (its floors)
    assert build_step_model(dep).moe_time(32) > bare.moe_time(32)


def test_kernel_format_follows_the_checkpoint(db):
    """gpt-oss's MXFP4 experts run weight-only on Hopper (its sidecar says which kernel); an int4 checkpoint
    without such a note runs W4A16 int4; kept bf16 experts run the bf16 kernel."""
    assert (
        deployment_for(PoolConfig(gpu="H100", tp=2, dtype="int4"), db.model("gpt-oss-120b"), db).moe_format
        == "w4a16_mxfp4"
    )
    dep = deployment_for(PoolConfig(gpu="H200", tp=8, dtype="int4"), db.model("Kimi-K2.5"), db)
    assert dep.moe_format == "int4_wo"
    assert dataclasses.replace(dep, bf16_modules=frozenset({"experts"})).moe_format == "bfloat16"


@needs_shared
def test_refit_reproduces_a_shipped_curve(db):
    shipped = db.moe_kernels["H200-SXM-141GB_vllm"].curves["fp8_block"]
    rows = pd.read_parquet(MOE_TABLES / "h200_sxm" / "moe" / "vllm" / "0.24.0" / "moe_perf.parquet")
    rows = rows[(rows.moe_dtype == "fp8_block") & (rows.moe_ep_size == 1)]
    curve, diag = moe_fit.fit_format(rows, db.gpu("H200-SXM-141GB"), "fp8_block", "0.24.0")
    for name in moe_fit.NAMES:
        assert getattr(curve, name) == pytest.approx(getattr(shipped, name), rel=1e-3), name
    assert curve.quality == shipped.quality


@needs_shared
def test_a_fit_on_the_power_law_rows_says_so_and_reads_them(db, tmp_path):
    """``moe_fit --routing power_law_1.01`` fits the rows of that routing (not the balanced ones) and its
    source names them; written under --out, the shipped files are left alone."""
    rows = pd.read_parquet(MOE_TABLES / "h200_sxm" / "moe" / "vllm" / "0.24.0" / "moe_perf.parquet")
    rows = rows[(rows.moe_dtype == "w4a16_mxfp4") & (rows.moe_ep_size == 1)]
    gpu = db.gpu("H200-SXM-141GB")
    bal, _ = moe_fit.fit_format(rows, gpu, "w4a16_mxfp4", "0.24.0")
    pl, _ = moe_fit.fit_format(rows, gpu, "w4a16_mxfp4", "0.24.0", routing="power_law_1.01")
    assert "power-law (alpha 1.01)-routing rows" in pl.source and "balanced" in bal.source
    assert pl.quality != bal.quality  # other rows, other residuals
    shipped = (moe_fit.OUT / "H200-SXM-141GB_vllm.yaml").read_text()
    argv = [
        "--routing",
        "power_law_1.01",
        "--system",
        "h200_sxm",
        "--engine",
        "vllm",
        "--write",
        "--out",
        str(tmp_path),
    ]
    assert moe_fit.main(argv) == 0
    assert "power-law (alpha 1.01) routing" in (tmp_path / "H200-SXM-141GB_vllm.yaml").read_text()
    assert (moe_fit.OUT / "H200-SXM-141GB_vllm.yaml").read_text() == shipped


@needs_shared
@pytest.mark.parametrize(
    "system,engine,version,fmt,ep",
    [
        ("h100_sxm", "sglang", "0.5.14", "fp8_block", False),
        ("b200_sxm", "trtllm", "1.3.0rc20", "nvfp4", True),
        ("h200_sxm", "vllm", "0.24.0", "int4_wo", False),
    ],
)
def test_stated_held_out_error_is_what_the_measurements_give(db, system, engine, version, fmt, ep):
    """The held-out median in each file, recomputed here from the measured rows the fit never saw."""
    gpu = db.gpu(moe_fit.SYSTEMS[system])
    kernels = db.moe_kernels[f"{gpu.name}_{engine}"]
    curve = (kernels.ep_curves if ep else kernels.curves)[fmt]
    rows = pd.read_parquet(MOE_TABLES / system / "moe" / engine / version / "moe_perf.parquet")
    rows = moe_fit.main_kernels(rows[(rows.moe_dtype == fmt) & ((rows.moe_ep_size > 1) == ep)], engine)
    bal = rows[rows.distribution == "balanced"].groupby(moe_fit.KEYS, as_index=False).latency.median()
    shape = pd.factorize(pd.Series(list(zip(bal.hidden_size, bal.inter_size, bal.num_experts, bal.topk, strict=True))))[
        0
    ]
    held = shape % 4 == 3 if shape.max() >= 3 else pd.factorize(bal.num_tokens, sort=True)[0] % 4 == 3
    cdt, wbytes = FORMATS[fmt]
    pred = np.array(
        [
            curve.time(
                r.num_tokens,
                r.hidden_size,
                r.inter_size,
                r.num_experts,
                r.topk,
                r.moe_tp_size,
                r.moe_ep_size,
                gpu.flops(cdt),
                wbytes,
                gpu.memory_bandwidth_Bps.value,
            )
            for r in bal[held].itertuples()
        ]
    )
    err = np.median(np.abs(pred / (bal[held].latency.to_numpy() * 1e-3) - 1.0))
    assert math.isclose(err, curve.quality.held_out_median_abs_rel_error, abs_tol=2e-3)
