"""The DeepSeek-sparse-attention lightning indexer: its fit from the measured module tables, the shipped terms
and their place in a decode step (GLM-5)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import hwdb
from calibration.kernels import dsa_fit
from calibration.kernels.moe_fit import KERNELS
from simulator.scenario import EngineConfig, PoolConfig, deployment_for
from simulator.step_build import build_step_model

SYSTEMS = ("H100-SXM-80GB", "H200-SXM-141GB", "B200-SXM-180GB", "B300-SXM", "GB200", "GB300")


def _glm5(gpu: str = "B200", engine: str = "sglang", pp: int = 1):
    db = hwdb.load()
    dep = deployment_for(
        PoolConfig(gpu=gpu, tp=8, pp=pp, dtype="fp8", kv_cache_dtype="fp8", engine=EngineConfig(engine=engine)),
        db.model("GLM-5"),
        db,
    )
    return dep, build_step_model(dep)


def _module_table(fixed_us: float, seq_ns: float, ctx_ps: float, full: str, skip: str) -> pd.DataFrame:
    """A DSA generation table whose full module costs the skip variant plus the given indexer."""
    rows = []
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        for step in (1, 128, 1024, 4096):
            for tp in (1, 8):
                base = 0.05 + 0.0001 * b  # ms: the rest of the module, the same both ways
                idx = fixed_us * 1e-3 + seq_ns * 1e-6 * b + ctx_ps * 1e-9 * b * (step + 1)
                common = {
                    "kv_cache_dtype": "fp8",
                    "gemm_type": "fp8_block",
                    "tp_size": tp,
                    "batch_size": b,
                    "step": step,
                }
                rows.append({**common, "model": full, "op_name": "dsa_generation_module", "latency": base + idx})
                rows.append({**common, "model": skip, "op_name": dsa_fit.SKIP_OP, "latency": base})
    return pd.DataFrame(rows)


def test_the_fit_recovers_a_known_indexer_from_the_module_pair():
    rows, pair = dsa_fit.indexer_rows(_module_table(30.0, 50.0, 150.0, "zai-org/GLM-5-FP8", "zai-org/GLM-5.2-FP8"))
    assert "GLM-5-FP8 minus zai-org/GLM-5.2-FP8" in pair
    assert rows.batch_size.max() == dsa_fit.MAX_BATCH  # the batch-1024 cliff is left out
    got = dsa_fit.fit_indexer(rows[rows.kv_cache_dtype == "fp8"])
    assert got.fixed_s == pytest.approx(30e-6, rel=1e-3)
    assert got.seq_s == pytest.approx(50e-9, rel=1e-3)
    assert got.ctx_s == pytest.approx(150e-12, rel=1e-3)
    assert got.quality.held_out_median_abs_rel_error < 1e-3


def test_the_same_checkpoint_both_ways_is_preferred_and_no_pair_gives_nothing():
    table = pd.concat(
        [
            _module_table(30.0, 50.0, 150.0, "zai-org/GLM-5-FP8", "zai-org/GLM-5.2-FP8"),
            _module_table(20.0, 40.0, 100.0, "nvidia/GLM-5.2-NVFP4", "nvidia/GLM-5.2-NVFP4"),
        ]
    )
    rows, pair = dsa_fit.indexer_rows(table)
    assert pair.startswith("nvidia/GLM-5.2-NVFP4 minus nvidia/GLM-5.2-NVFP4")
    assert dsa_fit.fit_indexer(rows).fixed_s == pytest.approx(20e-6, rel=1e-3)
    full_only = table[table.op_name != dsa_fit.SKIP_OP]
    assert dsa_fit.indexer_rows(full_only)[1] == "" and dsa_fit.indexer_rows(full_only)[0].empty


def test_shipped_indexers_on_every_sglang_gpu_within_15_percent_on_held_out_batches():
    db = hwdb.load()
    for gpu in SYSTEMS:
        c, _ = db.mla_curve(gpu, "sglang")
        assert set(c.indexer) == {"bfloat16", "fp8"}, gpu
        assert "calibration/kernels/dsa_fit.py" in c.indexer_source and "skip_indexer" in c.indexer_source
        for x in c.indexer.values():
            assert x.quality.held_out_median_abs_rel_error <= 0.15, gpu
            assert 10e-6 < x.fixed_s < 60e-6, gpu  # tens of microseconds a layer, as measured
        trt, _ = db.mla_curve(gpu, "trtllm")
        assert trt.indexer == {}  # TensorRT-LLM's tables have no skip-indexer variant


@pytest.mark.skipif(not KERNELS.is_dir(), reason="needs ../shared/data/kernels/aiconfigurator_0.12.0")
def test_shipped_indexer_is_what_the_fit_gives_on_the_measured_tables():
    for system, gpu in (("b200_sxm", "B200-SXM-180GB"), ("gb300", "GB300")):
        fitted, source = dsa_fit.fit_system(KERNELS, system, "sglang")
        shipped, _ = hwdb.load().mla_curve(gpu, "sglang")
        assert {k: v.model_dump() for k, v in fitted.items()} == {k: v.model_dump() for k, v in shipped.indexer.items()}
        assert source == shipped.indexer_source


@pytest.mark.parametrize("gpu", ["B200", "H200"])
def test_a_glm5_decode_step_pays_the_indexer_in_every_layer(gpu):
    """On H200 SGLang serves an fp8 cache without a measured MLA kernel; the indexer still applies."""
    dep, sm = _glm5(gpu)
    x, layers = dep.mla_curve.indexer["fp8"], dep.arch.full_attn_layers
    assert layers == 78 and sm.kernels_apart
    for b, n in ((1, 100), (64, 4096)):
        with_idx = sm.attention_time(b, 0.0, float(b * n), b)
        idx = layers * x.time(b, b * n)
        assert sm.dsa_fixed_s + sm.dsa_seq_s * b + sm.dsa_ctx_s * b * n == pytest.approx(idx, rel=1e-12)
        base = (
            sm.mla_attention_time(b, 0.0, float(b * n), b)
            if sm.mla_fixed_s
            else sm.curve_attention_time(b, 0.0, float(b * n))
        )
        assert with_idx - base == pytest.approx(idx, rel=1e-9)
    # a prompt-only step has no decodes and pays nothing for the indexer at decode
    s = 2048.0
    base = (
        sm.mla_attention_time(s, s * (s + 1) / 2, 0.0, 0)
        if sm.mla_fixed_s
        else sm.curve_attention_time(s, s * (s + 1) / 2, 0.0)
    )
    assert sm.attention_time(s, s * (s + 1) / 2, 0.0, 0) == base


def test_models_without_an_indexer_and_engines_without_a_measurement_pay_nothing():
    db = hwdb.load()
    dep = deployment_for(
        PoolConfig(gpu="B200", tp=8, dtype="fp8", kv_cache_dtype="fp8", engine=EngineConfig(engine="sglang")),
        db.model("DeepSeek-V3"),
        db,
    )
    assert dep.mla_curve.indexer and build_step_model(dep).dsa_fixed_s == 0.0  # DeepSeek-V3 has no indexer
    for engine in ("trtllm", "vllm-v1"):
        _, sm = _glm5(engine=engine)
        assert sm.dsa_fixed_s == sm.dsa_seq_s == sm.dsa_ctx_s == 0.0, engine


def test_pipeline_stages_split_the_per_token_cost_not_the_fixed_one():
    _, one = _glm5()
    _, two = _glm5(pp=2)
    assert two.dsa_fixed_s == one.dsa_fixed_s and two.dsa_seq_s == one.dsa_seq_s
    assert two.dsa_ctx_s == pytest.approx(one.dsa_ctx_s / 2)
    assert np.isfinite(two.decode_time(8, 8 * 1024))
