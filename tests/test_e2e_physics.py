"""Measured runs whose own figures need more than the hardware has are listed and left out of scores
(calibration/e2e/physics.py)."""

from __future__ import annotations

import dataclasses

import pytest

import hwdb
from calibration.e2e.physics import PEAK_FRACTION, beyond_hardware
from calibration.e2e.rows import Row
from simulator.scenario import PoolConfig, deployment_for
from simulator.step_build import build_step_model


@pytest.fixture(scope="module")
def setup():
    db = hwdb.load()
    dep = deployment_for(PoolConfig(gpu="H200", tp=2, dtype="fp8"), db.model("Llama-3.1-8B"), db)
    return dep, build_step_model(dep)


def row(**kw) -> Row:
    base = dict(
        id="r",
        backend="vllm",
        version="0.19.0",
        model="meta-llama/Llama-3.1-8B",
        system="h200_sxm",
        quant="fp8",
        precision="fp8",
        isl=1024,
        osl=1024,
        concurrency=16,
        tp=2,
        pp=1,
        dp=1,
        moe_tp=2,
        moe_ep=1,
        ttft_s=0.05,
        tpot_s=0.006,
        disagg=False,
    )
    return Row(**{**base, **kw})


def test_an_ordinary_run_passes(setup):
    assert beyond_hardware(row(), *setup) == ""


def test_prefill_rate_beyond_the_peak_is_flagged(setup):
    """100-token outputs at C=256 with 8k prompts done in 0.3 s each: the prefills alone need far more
    than the two GPUs' fp8 peak."""
    dep, step = setup
    r = row(isl=8192, osl=100, concurrency=256, ttft_s=0.3, tpot_s=0.004)
    need = (
        r.concurrency
        * 2
        * dep.arch.linear_params_per_token
        * 0.9
        * (r.isl + r.osl)
        / (r.ttft_s + (0.9 * r.osl - 1) * r.tpot_s)
        / (dep.gpus * dep.gpu.flops("fp8"))
    )
    assert need > PEAK_FRACTION
    msg = beyond_hardware(r, dep, step)
    assert "beyond the hardware" in msg and f"{need:.0%}" in msg and "fp8 dense peak" in msg


def test_tpot_below_one_weight_read_is_flagged(setup):
    dep, step = setup
    floor = step.streamed_weight_bytes(1) / step.peak_bw
    assert "one read of the weights" in beyond_hardware(row(concurrency=1, tpot_s=0.5 * floor), dep, step)
    assert beyond_hardware(row(concurrency=1, tpot_s=1.5 * floor), dep, step) == ""


def test_disaggregated_rows_are_not_judged_here(setup):
    assert beyond_hardware(dataclasses.replace(row(ttft_s=1e-6, tpot_s=1e-6), disagg=True), *setup) == ""
