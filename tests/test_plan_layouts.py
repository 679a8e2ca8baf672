"""The planner's search over parallel layouts and weight formats: dp x ep x tp per pool, fp8 vs fp4 where the
GPU has it, and the serve flags each layout gets."""

from __future__ import annotations

import pytest

from simulator.plan import PlanError, parse_plan_request
from simulator.plan.artefacts import vllm_args
from simulator.plan.candidates import build_context, to_scenario
from simulator.plan.families import enumerate_candidates
from simulator.plan.screen import Screen
from simulator.plan.sglang import sglang_args
from simulator.run import simulate
from tests.plan_results import check_sglang
from tests.test_plan import request


def moe_request(**constraints):
    c = {
        "tp": [1, 2],
        "dp": [1, 2],
        "expert_parallel": [False, True],
        "dtype": ["fp8", "fp4"],
        "max_gpus": 8,
        "families": ["colocated"],
    }
    return parse_plan_request(
        request(
            model="Qwen3-30B-A3B",
            gpus=[{"name": "B200"}, {"name": "H100"}],
            constraints={**c, **constraints},
            workload={"arrival": {"kind": "poisson", "rate": 40.0}},
        )
    )


@pytest.fixture(scope="module")
def ctx():
    return build_context(moe_request())


def test_layouts_cover_dp_ep_and_formats_and_fp4_is_weight_only_on_hopper(ctx):
    keys = {lay.key for lay in ctx.layouts}
    b200 = {k for k in keys if k[0].startswith("B200")}
    # every (dtype, tp, dp) on B200, EP either off or over all dp x tp GPUs of the instance (vLLM's rule)
    for dtype in ("fp8", "fp4"):
        for tp in (1, 2):
            for dp in (1, 2):
                eps = {k[4] for k in b200 if k[1:4] == (dtype, tp, dp)}
                assert eps == ({1, tp * dp} if tp * dp > 1 else {1}), (dtype, tp, dp, eps)
    # H100 has no fp4 tensor cores: vLLM serves fp4 there weight-only (W4A16 MXFP4), so those layouts are
    # searched, with bf16 math and the weight-only expert kernel
    h100_fp4 = [lay for lay in ctx.layouts if lay.gpu.startswith("H100") and lay.dtype == "fp4"]
    assert h100_fp4
    for lay in h100_fp4:
        assert lay.dep.moe_format == "w4a16_mxfp4"
        assert {g.compute_dtype for g in lay.dep.linear_groups()} == {"bf16"}


def test_a_dense_model_is_searched_without_dp_or_ep():
    req = parse_plan_request(request(constraints={"tp": [1, 2], "dp": [1, 2, 4], "expert_parallel": [True]}))
    lays = build_context(req).layouts
    assert lays and {(lay.dp, lay.ep) for lay in lays} == {(1, 1)}


def test_candidates_price_every_gpu_and_simulate_the_layout_they_name(ctx):
    cands = {c.id: c for c in enumerate_candidates(ctx) if not c.rejected}
    cand = cands["colocated-B200-SXM-180GB-fp4-dp2-tp2-ep4-x1"]
    assert cand.gpus == 4 and cand.layout == "1x B200-SXM-180GB DP2xTP2 EP4 fp4"
    price = ctx.layouts[0].price
    assert cand.cost_usd_per_hour == pytest.approx(4 * price)
    scn = to_scenario(ctx.req, cand)
    pool = scn.pools[0]
    assert (pool.tp, pool.dp, pool.ep, pool.dtype) == (2, 2, 4, "fp4")
    res = simulate(scn.model_copy(update={"workload": scn.workload.model_copy(update={"num_requests": 200})}), 0)
    info = res.info["pools"][0]
    assert info["dp"] == 2 and info["ep"] == 4
    assert res.summary["completed"] == 200


def test_screen_gives_dp_ranks_their_share_of_the_load(ctx):
    """Two DP ranks with experts over both GPUs sustain more than one TP1 rank and less than twice as much:
    they share the MoE layers' step (lock-step) but each has its own batch and KV cache."""
    screen = Screen(ctx)
    cands = {c.id: c for c in enumerate_candidates(ctx) if not c.rejected}
    one = screen.goodput(cands["colocated-B200-SXM-180GB-fp8-tp1-x1"])
    dp2 = screen.goodput(cands["colocated-B200-SXM-180GB-fp8-dp2-tp1-ep2-x1"])
    assert one < dp2 < 2.0 * one, (one, dp2)


def test_serve_flags_of_a_dp_ep_layout(ctx):
    lay = next(x for x in ctx.layouts if x.key[1:] == ("fp4", 2, 2, 4) and x.gpu.startswith("B200"))
    v = vllm_args("m", lay.dep, "colocated", None)
    assert v[v.index("--tensor-parallel-size") + 1] == "2" and v[v.index("--data-parallel-size") + 1] == "2"
    assert "--enable-expert-parallel" in v and "--quantization" not in v  # the fp4 checkpoint says how
    s = sglang_args("m", lay.dep, "colocated", None)
    # SGLang counts every GPU in --tp-size; attention runs as --dp-size ranks of tp-size / dp-size GPUs
    assert s[s.index("--tp-size") + 1] == "4" and s[s.index("--dp-size") + 1] == "2"
    assert "--enable-dp-attention" in s and s[s.index("--ep-size") + 1] == "4"
    check_sglang(["python", "-m", "sglang.launch_server", *s])  # only flags SGLang documents


@pytest.mark.parametrize(
    "constraints, needle",
    [
        ({"dp": [0]}, "constraints.dp[0]"),
        ({"dtype": "fp6"}, "constraints.dtype"),
        ({"expert_parallel": []}, "expert_parallel"),
    ],
)
def test_bad_layout_constraints(constraints, needle):
    with pytest.raises(PlanError) as exc:
        moe_request(**constraints)
    assert needle in str(exc.value)
