"""The end-to-end fit's per-GPU scale (calibration/e2e/fit.py ``gpu_scale``): kept only where the GPU's own rows
determine it (relative standard error at most ``MAX_SCALE_SIGMA``, off the bounds); otherwise the GPU takes the
reference GPU's terms, and the engine file says so in the terms' source.

Synthetic rows with a known answer: the simulated TPOT without per-layer cost, the per-layer cost at scale 1,
and a measured TPOT made from a true scale plus multiplicative noise of a stated size."""

from __future__ import annotations

import math

import numpy as np
import pytest

from calibration.e2e.fit import MAX_SCALE_SIGMA, SCALE_BOUNDS, gpu_scale


def _rows(true_scale: float, noise: float, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    sim = rng.uniform(5e-3, 20e-3, n)  # TPOT without the per-layer term (s)
    per_layer = rng.uniform(1e-3, 3e-3, n)  # the per-layer term at scale 1 (s)
    measured = (sim + true_scale * per_layer) * (1.0 + rng.normal(0.0, noise, n))
    return sim, per_layer, measured


def test_rows_that_agree_determine_the_scale():
    sc, rel = gpu_scale(*_rows(1.3, 0.03, 40))
    assert sc == pytest.approx(1.3, rel=0.1)
    assert rel < 0.1 <= MAX_SCALE_SIGMA


def test_few_scattered_rows_do_not():
    """Ten rows scattered by 35 %, about what the SGLang B300 fitting rows showed: the scale's sigma passes the
    limit, so the fit leaves that GPU at the reference's terms."""
    sc, rel = gpu_scale(*_rows(1.0, 0.35, 10, seed=3))
    assert rel > MAX_SCALE_SIGMA, (sc, rel)


def test_a_scale_at_its_bound_is_not_determined():
    sim, per_layer, _ = _rows(1.0, 0.0, 20)
    measured = sim * 0.6  # faster than the simulation without any per-layer cost: the scale runs to its floor
    sc, rel = gpu_scale(sim, per_layer, measured)
    assert sc == pytest.approx(SCALE_BOUNDS[0], rel=0.01)
    assert math.isinf(rel)
