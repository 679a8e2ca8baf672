"""fp8 and fp4 checkpoints on GPUs without those tensor cores: served weight-only where the engine has such a
kernel (vLLM's Marlin W8A16 on Ampere, W4A16 MXFP4 on Hopper), refused with the engine named where not."""

from __future__ import annotations

import pytest

import hwdb
from simulator.perf import plan_memory
from simulator.scenario import EngineConfig, PoolConfig, ScenarioError, deployment_for


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


def dep(db, model, dtype, gpu, engine="vllm-v1", tp=1):
    pool = PoolConfig(gpu=gpu, tp=tp, dtype=dtype, engine=EngineConfig(engine=engine))
    return deployment_for(pool, db.model(model), db)


def test_fp8_on_ampere_streams_one_byte_weights_and_computes_in_bf16(db):
    w8 = dep(db, "Qwen3-32B", "fp8", "A100-SXM-80GB", tp=2)
    bf = dep(db, "Qwen3-32B", "bf16", "A100-SXM-80GB", tp=2)
    assert {g.compute_dtype for g in w8.linear_groups()} == {"bf16"}
    # half the bytes of the bf16 checkpoint, apart from the bf16 LM head and the embedding
    assert 0.5 < w8.weight_bytes_per_gpu() / bf.weight_bytes_per_gpu() < 0.6
    assert plan_memory(w8).kv_tokens > plan_memory(bf).kv_tokens


def test_fp4_moe_on_hopper_takes_the_weight_only_expert_kernel(db):
    d = dep(db, "gpt-oss-120b", "fp4", "H100")
    assert d.moe_format == "w4a16_mxfp4" and "w4a16_mxfp4" in d.moe_source
    assert {g.compute_dtype for g in d.linear_groups()} == {"bf16"}


@pytest.mark.parametrize(
    "model,dtype,gpu,engine,why",
    [
        ("Qwen3-32B", "fp8", "A100-SXM-80GB", "trtllm", "trtllm has no weight-only fp8 kernel"),
        ("gpt-oss-120b", "fp4", "A100-SXM-80GB", "sglang", "needs fp8 tensor cores"),
        ("gpt-oss-120b", "fp4", "A100-SXM-80GB", "trtllm", "needs fp8 tensor cores"),
    ],
)
def test_an_engine_without_the_kernel_is_refused_by_name(db, model, dtype, gpu, engine, why):
    with pytest.raises(ScenarioError) as exc:
        dep(db, model, dtype, gpu, engine=engine, tp=2)
    msg = str(exc.value)
    assert f"dtype={dtype}" in msg and why in msg and "another engine" in msg


def test_every_weight_only_entry_is_sourced(db):
    for name in ("vllm-v1", "vllm-v0", "sglang", "trtllm"):
        for fmt, wo in db.engine(name).weight_only.items():
            assert fmt in ("fp8", "fp4") and len(wo.source) > 20, (name, fmt)


def test_gpt_oss_20b_is_known_with_the_model_card_sizes(db):
    """OpenAI's model card: 20.9B parameters, 3.6B active without the 0.58B input embedding; 12 of 24 layers
    hold KV for the whole context."""
    a = db.model("openai/gpt-oss-20b").arch
    assert a.total_params == pytest.approx(20.9e9, rel=0.01)
    assert a.active_params - a.embedding_params == pytest.approx(3.61e9, rel=0.01)
    assert a.num_layers == 24 and a.num_experts == 32 and a.experts_per_token == 4
    big = db.model("gpt-oss-120b").arch
    assert a.kv_elems_per_token == pytest.approx(big.kv_elems_per_token * 24 / 36)
    d = dep(db, "gpt-oss-20b", "fp4", "H100")
    assert d.moe_format == "w4a16_mxfp4" and plan_memory(d).weight_bytes < 16e9
