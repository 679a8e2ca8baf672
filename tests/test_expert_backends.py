"""A release that ran its routed experts through a kernel no measured table holds says so
(``expert_backends`` of the engine profile, simulator/engine_rules.py): the deployment's expert kernel line
and the confidence line name the kernel and what is known of it; other releases, GPUs and formats do not."""

from __future__ import annotations

import hwdb
from simulator.confidence import assess, describe
from simulator.scenario import EngineConfig, PoolConfig, deployment_for


def _dep(gpu: str, version: str | None, dtype: str = "fp8", model: str = "Qwen3-235B-A22B", tp: int = 2):
    db = hwdb.load()
    pool = PoolConfig(gpu=gpu, tp=tp, dtype=dtype, engine=EngineConfig(engine="vllm-v1", version=version))
    return deployment_for(pool, db.model(model), db)


def test_vllm_before_017_on_hopper_names_deepgemm():
    dep = _dep("H200", "0.12.0")
    assert dep.moe_format == "fp8_block"
    assert dep.moe_source.startswith("H200-SXM-141GB_vllm fp8_block")  # the measured curve is still used
    assert "vllm-v1 0.12.0" not in dep.moe_source and "vllm 0.12.0 ran fp8_block experts" in dep.moe_source
    assert "DeepGEMM" in dep.moe_source and "recipes PR #112" in dep.moe_source
    status = assess(dep)
    assert "DeepGEMM" in status["unmeasured_experts"] and "DeepGEMM" in describe(status)


def test_later_releases_other_gpus_and_formats_say_nothing():
    for dep in (
        _dep("H200", "0.19.0"),  # Triton by default since PR #34260
        _dep("H200", None),  # the profile's own release (0.19)
        _dep("B200", "0.12.0"),  # not a Hopper GPU of the rule
        _dep("H100", "0.12.0", dtype="bf16", model="Qwen3-30B-A3B", tp=1),  # bf16 experts
    ):
        assert "DeepGEMM" not in dep.moe_source
        assert assess(dep)["unmeasured_experts"] == ""
    # the same rule on the other Hopper GPU it lists
    assert "DeepGEMM" in _dep("H100", "0.16.1", tp=4).moe_source
