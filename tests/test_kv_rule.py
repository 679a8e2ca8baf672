"""``kv_cache_dtype: auto`` as each engine release resolves it for the checkpoint at hand (simulator/kv_rule.py)."""

from __future__ import annotations

import pytest

import hwdb
from simulator.kv_rule import release_key, resolve_kv_dtype
from simulator.perf import plan_memory
from simulator.scenario import EngineConfig, PoolConfig, ScenarioError, deployment_for


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


def dep(db, model, dtype, engine="vllm-v1", version=None, kv="auto", gpu="B200", tp=8):
    return deployment_for(
        PoolConfig(gpu=gpu, tp=tp, dtype=dtype, kv_cache_dtype=kv, engine=EngineConfig(engine=engine, version=version)),
        db.model(model),
        db,
    )


def test_release_order():
    assert release_key("0.14") > release_key("0.12.0") and release_key("0.19.0") > release_key("0.14")
    assert release_key("1.3.0rc20") > release_key("1.3.0rc5") and release_key("0.5.10.post1") > release_key("0.5.9")


@pytest.mark.parametrize("version,kv", [("0.12.0", "bf16"), ("0.13.9", "bf16"), ("0.14", "fp8"), ("0.19.0", "fp8")])
def test_vllm_follows_a_modelopt_directive_from_0_14(db, version, kv):
    """nvidia/Llama-3.1-70B-Instruct-FP8 declares kv_cache_quant_algo FP8: vLLM's auto takes it from 0.14 on."""
    d = dep(db, "Llama-3.1-70B", "fp8", version=version)
    assert d.kv_dtype == kv
    assert ("directive" in d.kv_note) and (version in d.kv_note or kv == "fp8")


@pytest.mark.parametrize(
    "model,dtype",
    [("Qwen3-235B-A22B", "fp8"), ("DeepSeek-R1", "fp8"), ("gpt-oss-120b", "fp4"), ("MiniMax-M2.5", "fp8")],
)
def test_checkpoints_without_a_directive_keep_bf16(db, model, dtype):
    for engine in ("vllm-v1", "sglang", "trtllm"):
        d = dep(db, model, dtype, engine=engine, version=None)
        assert d.kv_dtype == "bf16" and "declares no KV format" in d.kv_note


def test_the_same_model_differs_by_checkpoint_format(db):
    """MiniMax-M2.5's block-fp8 release has no KV directive; NVIDIA's NVFP4 release declares fp8."""
    assert dep(db, "MiniMax-M2.5", "fp8", version="0.19.0").kv_dtype == "bf16"
    assert dep(db, "MiniMax-M2.5", "fp4", version="0.19.0").kv_dtype == "fp8"
    assert dep(db, "MiniMax-M2.5", "fp4", engine="sglang").kv_dtype == "fp8"


def test_an_explicit_setting_wins_and_capacity_follows(db):
    auto = dep(db, "Qwen3-235B-A22B", "fp8", version="0.19.0", tp=4)
    fp8 = dep(db, "Qwen3-235B-A22B", "fp8", version="0.19.0", kv="fp8", tp=4)
    assert (auto.kv_dtype, fp8.kv_dtype) == ("bf16", "fp8") and fp8.kv_note == "set in the scenario"
    assert plan_memory(fp8).kv_tokens > 1.9 * plan_memory(auto).kv_tokens


def test_vllm_v0_never_follows(db):
    assert dep(db, "Llama-3.1-70B", "fp8", engine="vllm-v0").kv_dtype == "bf16"


def test_rule_function_directly(db):
    eng, side = db.engine("vllm-v1"), db.model("Llama-3.1-70B").sidecar
    assert resolve_kv_dtype("fp16", "fp8", eng, None, side) == ("fp16", "set in the scenario")
    assert resolve_kv_dtype("auto", "fp16", eng, "0.19", side)[0] == "fp16"  # no fp16 directive: activations


@pytest.mark.parametrize("bad", ["", "v0.19", "0.19 ; rm", "x" * 50])
def test_a_malformed_release_is_refused(bad):
    with pytest.raises(ValueError):
        EngineConfig(version=bad)


def test_unknown_engine_still_named(db):
    with pytest.raises(ScenarioError, match="engine.engine"):
        dep(db, "Llama-3.1-70B", "fp8", engine="nope")
