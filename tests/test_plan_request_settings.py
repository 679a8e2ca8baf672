"""The scenario's settings travel to the plan the app makes of it (issue 32, "fp8 is dropped between pages"):
weights and KV-cache dtype, engine arguments, DP/EP and the KV/embedding fabric go from the Home scenario into
the plan request, its candidates and the serve lines it writes; pools that disagree are refused."""

from __future__ import annotations

import pytest

from app.services import planning, scenarios
from app.services.scenarios import InputError
from simulator.plan import PlanRequest
from simulator.plan.candidates import build_context

FP8 = "deepseek_v3_h200_tp8_fp8.yaml"  # fp8 weights, fp8 KV cache, max_model_len 32768


def plan_request(d: dict, gpus=("H200",), **kw) -> PlanRequest:
    return planning.parse_request(planning.request_from_scenario(d, list(gpus), **kw))


def test_fp8_weights_kv_and_engine_arguments_reach_the_plan_request():
    req = plan_request(scenarios.example(FP8))
    c = req.constraints
    assert c.dtype == ("fp8",)
    assert c.kv_cache_dtype == "fp8"
    assert c.engine.max_model_len == 32768


def test_a_small_plan_of_an_fp8_scenario_serves_fp8_weights_and_kv():
    # Before the fix the request planned bf16: DeepSeek-V3's 1.3 TB of bf16 weights fit no layout at all.
    data = planning.request_from_scenario(
        scenarios.example(FP8), ["H200"], max_gpus=8, tp=(8,), families=("colocated",), verify=1, requests=50
    )
    res = planning.run(data)
    cid = planning.candidate_for_artefacts(res)
    assert cid is not None and "fp8" in cid
    pool = res.to_scenario(cid).pools[0]
    assert (pool.dtype, pool.kv_cache_dtype, pool.engine.max_model_len) == ("fp8", "fp8", 32768)
    files = planning.artefact_files(res, cid)
    vllm = files["vllm/main.sh"]
    assert "--quantization fp8" in vllm and "--kv-cache-dtype fp8" in vllm and "--max-model-len 32768" in vllm
    assert "--dtype bfloat16" not in vllm
    assert "--kv-cache-dtype fp8_e4m3" in files["sglang/main.sh"]


def test_a_bf16_scenario_keeps_the_planners_defaults():
    d = scenarios.default_scenario()
    data = planning.request_from_scenario(d, ["H100"])
    assert data.get("fabrics", {}) == {}
    c, default = planning.parse_request(data).constraints, PlanRequest.model_fields["constraints"].default
    for field in ("dtype", "kv_cache_dtype", "engine", "dp", "expert_parallel"):
        assert getattr(c, field) == getattr(default, field), field


def test_pd_pools_that_disagree_on_engine_arguments_are_refused_with_the_fix():
    d = scenarios.example("fp8_decode_crashes_pd.yaml")  # decode has max_num_seqs 64, prefill the default
    with pytest.raises(InputError) as err:
        planning.request_from_scenario(d, ["H100"])
    msg = str(err.value)
    assert "engine" in msg and "prefill: {}" in msg and "'max_num_seqs': 64" in msg
    assert "Fix:" in msg and "constraints.engine" in msg


def test_pd_pools_that_disagree_on_dtype_are_refused_naming_both():
    d = scenarios.example("fp8_decode_crashes_pd.yaml")
    d["pools"][1]["dtype"] = "bf16"
    with pytest.raises(InputError) as err:
        planning.request_from_scenario(d, ["H100"])
    msg = str(err.value)
    assert "dtype" in msg and "prefill: fp8" in msg and "decode: bf16" in msg and "constraints.dtype" in msg


def test_pd_scenario_carries_dtype_engine_connector_and_fabric():
    d = scenarios.example("fp8_decode_crashes_pd.yaml")
    for pool in d["pools"]:
        pool["engine"] = {"max_num_seqs": 64}
    req = plan_request(d, gpus=("H100",))
    assert req.constraints.dtype == ("fp8",) and req.constraints.kv_cache_dtype == "auto"
    assert req.constraints.engine.max_num_seqs == 64
    assert (req.fabrics.connector, req.fabrics.links) == ("nixl", ("roce-400",))


def test_moe_dp_and_expert_parallelism_reach_the_candidates():
    d = scenarios.example("qwen3_moe_h200_closed_loop.yaml")
    d["pools"][0].update(tp=1, dp=2, ep=2)
    d["workload"]["arrival"] = {"kind": "poisson", "rate": 10}
    req = plan_request(d, tp=(1,), families=("colocated",), max_gpus=4)
    assert req.constraints.dp == (2,) and req.constraints.expert_parallel == (True,)
    keys = {lay.key[2:] for lay in build_context(req).layouts}  # (tp, dp, ep)
    assert keys == {(1, 2, 2)}


def test_encoder_pools_are_left_out_and_embedding_fabric_travels():
    d = scenarios.example("epd_images_epd.yaml")
    d["pools"][1]["engine"] = {"max_num_seqs": 8}  # the planner sizes its own encoder pool
    req = plan_request(d, gpus=("H100",))
    assert req.constraints.dtype == ("bf16",) and req.constraints.engine.max_num_seqs is None
    assert req.fabrics.links == ("ib-ndr",)


def test_epd_with_another_embedding_fabric_than_kv_is_refused():
    d = scenarios.example("epd_images_epd.yaml")
    d["pools"] = [
        {"name": "prefill", "role": "prefill", "gpu": "H100", "tp": 4},
        {"name": "decode", "role": "decode", "gpu": "H100", "tp": 4},
        {"name": "enc", "role": "encoder", "gpu": "H100", "tp": 1, "instances": 4},
    ]
    d["kv_transfer"] = {"connector": "nixl", "fabric": "roce-400"}
    with pytest.raises(InputError, match=r"embedding_transfer:.*ib-ndr.*roce-400.*Fix:"):
        planning.request_from_scenario(d, ["H100"])
    d["embedding_transfer"] = {"connector": "nixl"}  # the KV fabric then carries embeddings too
    assert plan_request(d, gpus=("H100",)).fabrics.links == ("roce-400",)


def test_the_band_edge_option_reaches_the_plan_request_only_when_asked():
    d = scenarios.example(FP8)
    assert plan_request(d).constraints.slo_at_band_edge is False
    assert plan_request(d, at_band_edge=True).constraints.slo_at_band_edge is True
