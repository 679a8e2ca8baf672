"""Per-rank GEMM shapes and the shape-aware compute curve (simulator/gemm_shapes.py)."""

from __future__ import annotations

import pytest

import hwdb
from hwdb.schema import GemmShapeCurve
from simulator.gemm_shapes import rank_gemms, shape_curves
from simulator.scenario import PoolConfig, deployment_for
from simulator.step_build import build_step_model

CURVE = GemmShapeCurve(max_eff=0.6, half_m=200.0, half_nk=1e7, source="test curve")


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


def test_one_shape_is_the_curve_and_shares_combine_harmonically():
    assert CURVE.for_shapes([(1e7, 1.0)]) == pytest.approx(0.3)
    # Two GEMMs of equal FLOPs at 0.3 and 0.5 of the peak: time adds, so 2 / (1/0.3 + 1/0.5).
    both = CURVE.for_shapes([(1e7, 1.0), (5e7, 1.0)])
    assert both == pytest.approx(2 / (1 / 0.3 + 1 / 0.5))
    assert CURVE.for_shapes([(1e6, 1.0)]) < CURVE.for_shapes([(1e8, 1.0)]) < CURVE.max_eff


@pytest.mark.parametrize("model", ["Llama-3.1-70B", "Qwen3-30B-A3B", "gpt-oss-120b", "DeepSeek-V3"])
@pytest.mark.parametrize("tp", [1, 8])
def test_rank_gemms_cover_the_linear_flops_of_a_token(db, model, tp):
    a = db.model(model).arch
    g = rank_gemms(a, tp)
    total = sum(w for _, w in g.dense + g.experts)
    router = a.moe_layers * a.hidden_size * a.num_experts if a.is_moe else 0
    # KV heads fewer than ranks are replicated, so a rank may hold a little more than 1/tp.
    assert total == pytest.approx((a.linear_params_per_token - router) / tp, rel=0.08)
    assert bool(g.experts) == a.is_moe


def test_tp_slices_lose_efficiency_and_tp8_prefill_is_not_eight_times_faster(db):
    def step(tp):
        return build_step_model(
            deployment_for(PoolConfig(gpu="B200", tp=tp, dtype="fp8"), db.model("Llama-3.1-70B"), db)
        )

    s1, s8 = step(1), step(8)
    # Seconds per token of the MLP GEMMs at full ramp: TP8 slices reach a lower fraction of the peak, so
    # a rank's share takes more than an eighth of TP1's time.
    mlp = {tp: next(c for name, _, c, _ in s.compute_groups if name == "dense_mlp") for tp, s in ((1, s1), (8, s8))}
    assert mlp[8] > 1.25 * mlp[1] / 8
    speedup = s1.prefill_time(8192) / s8.prefill_time(8192)
    assert 3.0 < speedup < 8.0


def test_experts_get_their_own_small_shape_efficiency(db):
    a = db.model("Qwen3-30B-A3B").arch
    dense, expert_eff, expert_half = shape_curves(CURVE, a, 1)
    assert expert_eff < dense.max_eff and expert_half == CURVE.half_m
