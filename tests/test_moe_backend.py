"""A routed-expert kernel the engine runs only when told to (``engine.moe_backend``; hwdb curves keyed
``<format>@<backend>``): vLLM's Marlin for MXFP4 experts on Hopper, which InferenceX's gpt-oss campaigns
forced with VLLM_MXFP4_USE_MARLIN=1.

The tables time Marlin-MXFP4 on one stand-in expert shape only, so its curve takes the stand-in's compute
side and the format's own memory side (calibration/kernels/moe_fit.py backend_curve): a long prompt's
prefill gets slower, a small decode step stays as measured on the format's shapes."""

from __future__ import annotations

import pandas as pd
import pytest

import hwdb
from calibration.e2e.rows import Row
from calibration.e2e.scenarios import engine_of, marlin_mxfp4
from calibration.kernels import moe_fit
from hwdb.moe import BACKEND_SEP, MoeKernels
from simulator.scenario import EngineConfig, PoolConfig, ScenarioError, deployment_for, parse_scenario
from simulator.step_build import build_step_model
from tests.perf_models import KERNELS, needs_shared

COMPUTE = ("max_eff", "half_rows", "half_nk")
MEMORY = ("mem_eff", "fixed_s", "act_passes", "per_expert_s")


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


@pytest.mark.parametrize("gpu", ["H100-SXM-80GB", "H200-SXM-141GB"])
def test_shipped_marlin_curve_is_the_stand_ins_compute_and_the_formats_memory(db, gpu):
    curves = db.moe_kernels[f"{gpu}_vllm"].curves
    main, marlin = curves["w4a16_mxfp4"], curves[f"w4a16_mxfp4{BACKEND_SEP}marlin"]
    assert all(getattr(marlin, n) == getattr(main, n) for n in MEMORY)
    assert marlin.half_nk == 0.0 and marlin.max_eff < 0.5 * main.max_eff  # dequantisation-bound at many rows
    assert "situ_as_silu (compute side)" in marlin.kernel and "stand-in" in marlin.source


def test_lookup_takes_the_backend_curve_or_says_it_has_none(db):
    curve, note = db.moe_curve("H200-SXM-141GB", "vllm", "w4a16_mxfp4", 1, "marlin")
    assert curve is db.moe_kernels["H200-SXM-141GB_vllm"].curves["w4a16_mxfp4@marlin"]
    assert "w4a16_mxfp4@marlin" in note
    default, _ = db.moe_curve("B200-SXM-180GB", "vllm", "nvfp4")
    curve, note = db.moe_curve("B200-SXM-180GB", "vllm", "nvfp4", 1, "marlin")
    assert curve is default and "no marlin curve of nvfp4 measured on B200-SXM-180GB" in note


def _model(db, backend, tp=1):
    pool = PoolConfig(gpu="H200", tp=tp, dtype="int4", engine=EngineConfig(moe_backend=backend))
    return build_step_model(deployment_for(pool, db.model("gpt-oss-120b"), db))


@pytest.mark.parametrize("tp", [1, 8])
def test_marlin_slows_a_long_prefill_and_leaves_a_small_decode(db, tp):
    default, marlin = _model(db, None, tp), _model(db, "marlin", tp)
    assert marlin.prefill_time(8192) > 1.3 * default.prefill_time(8192)
    assert marlin.decode_time(4, 1024) == pytest.approx(default.decode_time(4, 1024), rel=0.02)


def test_an_unknown_backend_is_refused_with_its_field():
    scn = {
        "model": "gpt-oss-120b",
        "pools": [{"gpu": "H200", "dtype": "int4", "engine": {"moe_backend": "triton"}}],
        "workload": {
            "arrival": {"kind": "poisson", "rate": 1.0},
            "input_length": {"kind": "fixed", "value": 64},
            "output_length": {"kind": "fixed", "value": 8},
            "num_requests": 10,
        },
    }
    with pytest.raises(ScenarioError, match="moe_backend"):
        parse_scenario(scn)


@pytest.mark.parametrize("key", ["nope@marlin", "w4a16_mxfp4@", "w4a16_mxfp4@../x"])
def test_a_curve_key_must_name_a_format_and_a_backend(db, key):
    k = db.moe_kernels["H200-SXM-141GB_vllm"]
    with pytest.raises(ValueError, match="curve key"):
        MoeKernels(**{**k.model_dump(), "curves": {key: k.curves["w4a16_mxfp4"]}})


def _row(**kw):
    base = dict(
        id="r", backend="vllm", version="0.18.0", model="openai/gpt-oss-120b", system="h200_sxm", quant="fp4",
        precision="fp4", isl=1024, osl=1024, concurrency=4, tp=1, pp=1, dp=1, moe_tp=1, moe_ep=1,
        ttft_s=0.1, tpot_s=0.01, disagg=False,
    )  # fmt: skip
    return Row(**{**base, **kw})


@pytest.mark.parametrize(
    "kw,expected",
    [
        ({}, True),
        ({"system": "h100_sxm", "version": "0.13.0"}, True),
        ({"version": "0.11.2"}, False),  # before InferenceX PR #327
        ({"version": "nan"}, False),  # no release stated
        ({"system": "b200_sxm"}, False),
        ({"backend": "sglang"}, False),
        ({"model": "MiniMaxAI/MiniMax-M2.5"}, False),
    ],
)
def test_the_campaigns_launch_rule(kw, expected):
    row = _row(**kw)
    assert marlin_mxfp4(row) is expected
    if row.backend == "vllm":
        assert (engine_of(row).get("moe_backend") == "marlin") is expected


@needs_shared
def test_refit_reproduces_the_shipped_compute_side(db):
    shipped = db.moe_kernels["H200-SXM-141GB_vllm"].curves["w4a16_mxfp4@marlin"]
    rows = pd.read_parquet(KERNELS / "aiconfigurator_0.12.0/data/h200_sxm/moe/vllm/0.24.0/moe_perf.parquet")
    rows = rows[rows.moe_dtype == "w4a16_mxfp4"]
    curve, _ = moe_fit.fit_format(rows, db.gpu("H200-SXM-141GB"), "w4a16_mxfp4", "0.24.0", stand_in="marlin")
    for name in ("max_eff", "half_rows"):
        assert getattr(curve, name) == pytest.approx(getattr(shipped, name), rel=1e-3), name
    assert curve.quality == shipped.quality
