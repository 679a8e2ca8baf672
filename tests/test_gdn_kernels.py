"""Gated-DeltaNet (linear attention) kernels: the fit, the shipped curves and their place in the step model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import hwdb
from calibration.kernels import cli as kernel_cli
from calibration.kernels import gdn_fit
from calibration.kernels.moe_fit import KERNELS
from hwdb.gdn import GdnCurve, GdnPhase
from hwdb.profiles import FitQuality
from simulator.scenario import EngineConfig, PoolConfig, deployment_for
from simulator.step_build import build_step_model
from simulator.step_closures import step_functions

SYSTEMS = ("H100-SXM-80GB", "H200-SXM-141GB", "B200-SXM-180GB", "B300-SXM", "GB200", "GB300")


def _qwen35(tp: int = 4, engine: str = "sglang", gpu: str = "B200"):
    db = hwdb.load()
    dep = deployment_for(
        PoolConfig(gpu=gpu, tp=tp, dtype="fp8", engine=EngineConfig(engine=engine)), db.model("Qwen3.5-397B-A17B"), db
    )
    return dep, build_step_model(dep)


def test_every_gpu_and_engine_has_curves_within_15_percent_on_held_out_models():
    db = hwdb.load()
    for gpu in SYSTEMS:
        for engine in ("vllm", "sglang", "trtllm"):
            curve, note = db.gdn_curve(gpu, engine)
            assert curve is not None and curve.engine == engine, (gpu, engine, note)
            for phase in (curve.context, curve.generation):
                assert phase.quality.held_out_median_abs_rel_error <= 0.15, (gpu, engine, phase)
    assert db.gdn_curve("A100-SXM-80GB", "sglang") == (None, "")


def _synthetic(truth: dict[str, dict[str, float]]) -> pd.DataFrame:
    """A gdn_perf-like table made from known coefficients: two kernels per phase that share the time."""
    curve = GdnCurve(
        name="x",
        gpu="g",
        engine="e",
        engine_version="1",
        kernels="k",
        source="synthetic",
        **{
            p: GdnPhase(**c, quality=FitQuality(n_points=0, median_abs_rel_error=0, p90_abs_rel_error=0))
            for p, c in truth.items()
        },
    )
    rows = []
    for model, (hk, hv) in {"m1": (2, 2), "m2": (4, 8), "m3": (1, 4), "m4": (16, 32)}.items():
        for b in (1, 2, 8, 32, 64):
            for s in (1, 16, 256, 1024, 8192):
                t = float(curve.context_time(b, s, hv, hk)) * 1e3
                for k, share in (("conv", 0.1), ("chunk", 0.9)):
                    rows.append(
                        dict(
                            phase="context",
                            kernel_source=k,
                            model_name=model,
                            num_k_heads=hk,
                            num_v_heads=hv,
                            head_k_dim=128,
                            head_v_dim=128,
                            batch_size=b,
                            seq_len=s,
                            latency=t * share,
                        )
                    )
            t = float(curve.generation_time(b, hv, hk)) * 1e3
            for k, share in (("conv_update", 0.2), ("recurrent", 0.8)):
                rows.append(
                    dict(
                        phase="generation",
                        kernel_source=k,
                        model_name=model,
                        num_k_heads=hk,
                        num_v_heads=hv,
                        head_k_dim=128,
                        head_v_dim=128,
                        batch_size=b,
                        seq_len=1,
                        latency=t * share,
                    )
                )
    return pd.DataFrame(rows)


def test_fit_recovers_known_coefficients_and_sums_the_kernels_of_a_phase():
    truth = {
        "context": dict(fixed_s=25e-6, seq_s=3e-8, seq_head_s=7e-8, tok_head_s=1.5e-9, tok_key_head_s=6e-10),
        "generation": dict(fixed_s=6e-6, seq_head_s=2e-8, seq_key_head_s=1e-9),
    }
    df = _synthetic(truth)
    for phase, coef in truth.items():
        pts = gdn_fit.phase_points(df, phase)
        assert len(pts) == len(df[df.phase == phase]) // 2  # two kernels summed into one point
        values, q, _ = gdn_fit.fit_phase(pts, phase)
        for name, want in coef.items():
            assert values[name] == pytest.approx(want, rel=1e-3), (phase, name)
        assert q.held_out_median_abs_rel_error < 1e-3


@pytest.mark.skipif(not KERNELS.is_dir(), reason="needs ../shared/data/kernels/aiconfigurator_0.12.0")
def test_shipped_curve_is_what_the_fit_gives_on_the_measured_table():
    fitted = gdn_fit.fit_system(KERNELS, "b200_sxm", "sglang")
    shipped, _ = hwdb.load().gdn_curve("B200-SXM-180GB", "sglang")
    assert fitted.model_dump() == shipped.model_dump()


def test_step_model_adds_the_measured_kernels_of_every_linear_attention_layer():
    dep, sm = _qwen35(tp=4)
    a, c = dep.arch, dep.gdn_curve
    hv, hk = a.linear_num_value_heads / 4, a.linear_num_key_heads / 4
    n = a.num_linear_layers
    assert n == 45 and c is not None and c.engine == "sglang"
    # one fresh prompt of 8192 tokens: its own length is the longest chunk
    assert sm.linear_attention_time(8192, 0, 8192 * 8193 / 2) == pytest.approx(
        n * c.context_time(1, 8192, hv, hk), rel=1e-3
    )
    # eight fresh prompts of 1024 tokens in one step
    assert sm.linear_attention_time(8192, 0, 8 * 1024 * 1025 / 2) == pytest.approx(
        n * c.context_time(8, 1024, hv, hk), rel=2e-3
    )
    assert sm.linear_attention_time(64, 64, 0.0) == pytest.approx(n * c.generation_time(64, hv, hk), rel=1e-9)
    bare = build_step_model(dataclasses.replace(dep, gdn_curve=None))
    for b, ctx in ((1, 100), (64, 2000), (256, 1000)):
        assert sm.decode_time(b, ctx) - bare.decode_time(b, ctx) == pytest.approx(
            n * c.generation_time(b, hv, hk), rel=1e-6
        )
    assert sm.prefill_time(8192) > bare.prefill_time(8192) + 0.9 * n * c.context_time(1, 8192, hv, hk)
    # the engine's step loop prices such a model with the same cost as the model's methods
    step, decode = step_functions(sm)
    assert decode(32, 32 * 1500.0, 32) == sm.decode_time(32, 1500)


def test_models_without_linear_attention_have_no_such_term():
    db = hwdb.load()
    dep = deployment_for(
        PoolConfig(gpu="B200", tp=2, dtype="fp8", engine=EngineConfig(engine="sglang")), db.model("Llama-3.1-70B"), db
    )
    sm = build_step_model(dep)
    assert dep.gdn_curve is None and sm.linear_attention_time(4096, 8, 4096.0**2 / 2) == 0.0


def test_kernel_time_grows_with_heads_per_gpu():
    _, tp4 = _qwen35(tp=4)
    _, tp8 = _qwen35(tp=8)
    for args in ((256, 256, 0.0), (8192, 0, 8192 * 8193 / 2)):
        assert tp4.linear_attention_time(*args) > tp8.linear_attention_time(*args) > 0.0
    assert np.isfinite(tp8.decode_time(1, 1))


def test_markdown_table_counts_every_phase_curve(tmp_path: Path):
    text = gdn_fit.markdown(hwdb.load())
    assert text.count("| context |") == 18 and text.count("| generation |") == 18
    assert "36 of 36 phase curves within 15 %" in text


def test_command_line_refuses_missing_tables_and_writes_what_it_reads_back(tmp_path: Path, capsys):
    assert gdn_fit.main(["--kernels", str(tmp_path / "absent")]) == 2
    assert "give --kernels DIR" in capsys.readouterr().out
    assert gdn_fit.main(["--markdown", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "t.md").read_text() == gdn_fit.markdown(hwdb.load())
    curve, _ = hwdb.load().gdn_curve("H200-SXM-141GB", "vllm")
    path = kernel_cli.write_generated(curve, tmp_path / "gdn_kernels", "calibration.kernels.gdn_fit")
    assert path.read_text().startswith("# Generated by `python -m calibration.kernels.gdn_fit --write`")
    assert hwdb.db.parse_file(path, GdnCurve) == curve
