"""A linear-attention model's recurrent state in SGLang's memory plan (simulator/memory.py): the state pool it
carves from the KV budget, the running requests its slots allow, the multimodal fraction, and the overlap
scheduler it switches off with the radix cache on.  Figures by hand from SGLang 0.5.9's rules
(model_runner_kv_cache_mixin.handle_max_mamba_cache, server_args.adjust_mem_fraction_for_vlm)."""

from __future__ import annotations

import dataclasses

import pytest

import hwdb
from hwdb.hf_config import ConfigError, arch_from_config
from simulator.engine_rules import engine_running_cap
from simulator.memory import linear_state_bytes_per_seq, sglang_fraction, vision_factor
from simulator.perf import FitError, plan_memory
from simulator.scenario import EngineConfig, PoolConfig, deployment_for
from simulator.step_build import build_step_model

QWEN35 = "Qwen3.5-397B-A17B"


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


def dep(db, model=QWEN35, gpu="B200", engine="sglang", tp=4, dtype="fp8", **eng):
    pool = PoolConfig(gpu=gpu, tp=tp, dtype=dtype, engine=EngineConfig(engine=engine, **eng))
    return deployment_for(pool, db.model(model), db)


def test_state_per_sequence_is_sglangs_mamba_cache_per_req(db):
    """45 Gated-DeltaNet layers at TP4: conv tail (64x128 + 2x16x128)/4 x 3 in bf16 and the delta-rule state
    64/4 x 128 x 128 in float32 (the checkpoint's mamba_ssm_dtype): 48,015,360 bytes per sequence per GPU."""
    d = dep(db)
    assert d.arch.linear_ssm_dtype == "fp32"
    assert linear_state_bytes_per_seq(d) == 45 * (3072 * 3 * 2 + 16 * 128 * 128 * 4) == 48_015_360
    # Half the GPUs per instance: each holds twice the heads, so twice the state.
    assert linear_state_bytes_per_seq(dep(db, tp=2)) == pytest.approx(2 * 48_015_360, rel=0.01)


def test_state_pool_takes_its_ratio_and_caps_running_requests(db):
    """mamba_full_memory_ratio 0.9: the state gets 0.9/1.9 of what the weights leave, in whole slots; with the radix
    cache on a request needs three slots, with it off one."""
    on, off = dep(db), dep(db, enable_prefix_caching=False)
    m_on, m_off = plan_memory(on), plan_memory(off)
    per_seq = linear_state_bytes_per_seq(on)
    rest = m_on.kv_bytes + m_on.state_bytes
    assert m_on.state_slots == int(rest * 0.9 / 1.9 // per_seq)
    assert m_on.state_bytes == m_on.state_slots * per_seq
    assert m_on.max_running == m_on.state_slots // 3
    assert m_off.max_running == m_off.state_slots
    # The KV pool keeps the rest; a dense model's plan on the same GPUs has no state pool.
    assert m_on.kv_blocks * m_on.block_size * m_on.kv_bytes_per_token <= m_on.kv_bytes
    dense = plan_memory(dep(db, model="Qwen3-235B-A22B"))
    assert dense.state_slots == 0 and dense.state_bytes == 0.0


def test_the_running_cap_reaches_the_engine_knobs(db):
    """SGLang without max_running_requests runs at most what the state slots allow: the pool's max_num_seqs."""
    d = dep(db)
    cap = plan_memory(d).max_running
    assert engine_running_cap(d, given=False).knobs.max_num_seqs == cap
    assert engine_running_cap(d, given=True).knobs.max_num_seqs == d.knobs.max_num_seqs


def test_vllm_keeps_no_state_pool(db):
    """vLLM's hybrid allocator keeps the state in KV blocks (not modelled): no pool, no cap."""
    m = plan_memory(dep(db, engine="vllm-v1"))
    assert m.state_slots == 0 and m.max_running == 0


def test_too_little_memory_for_one_request_is_refused_with_the_fix(db):
    """0.2 GiB left after the weights: two state slots, fewer than the three one request needs with the radix cache."""
    d = dep(db)
    m = plan_memory(d)
    before = m.usable_bytes / sglang_fraction(d, d.release)
    fraction = (m.weight_bytes + 0.2 * 2**30) / before
    tight = dataclasses.replace(d, knobs=dataclasses.replace(d.knobs, gpu_memory_utilization=fraction))
    with pytest.raises(FitError, match=r"linear-attention state, 2 slot\(s\).*use more GPUs per instance"):
        plan_memory(tight)
    # Without the radix cache one slot is enough for a request.
    loose = dataclasses.replace(tight, knobs=dataclasses.replace(tight.knobs, prefix_caching=False))
    assert plan_memory(loose).max_running == 2


def test_multimodal_fraction_as_sglang_sizes_it(db):
    """A vision tower of 24 layers (SGLang's default where the config says 'depth') and width 1152: 0.95 x (1 - 0.1 x
    (1152^2 / 1024^2 - 1)); a text-only model keeps the whole fraction."""
    d = dep(db)
    assert vision_factor(d) == pytest.approx(0.95 * (1 - 0.1 * (1152**2 / 1024**2 - 1)))
    text_only = dataclasses.replace(d, arch=dataclasses.replace(d.arch, vision_layers=0, vision_hidden=0))
    assert vision_factor(text_only) == 1.0
    assert sglang_fraction(d, d.release) == pytest.approx(sglang_fraction(text_only, d.release) * vision_factor(d))
    # A huge tower is clamped at 0.8 of the base factor.
    huge = dataclasses.replace(d, arch=dataclasses.replace(d.arch, vision_layers=96, vision_hidden=4096))
    assert vision_factor(huge) == pytest.approx(0.95 * 0.8)


def test_radix_cache_switches_sglangs_overlap_scheduler_off(db):
    """SGLang's default mamba no_buffer strategy cannot overlap: with the radix cache on the step pays GPU + host."""
    assert not build_step_model(dep(db)).overlapped
    assert build_step_model(dep(db, enable_prefix_caching=False)).overlapped
    assert build_step_model(dep(db, model="Qwen3-235B-A22B")).overlapped
    assert build_step_model(dep(db, engine="vllm-v1")).overlapped


def test_config_vision_and_ssm_dtype_fields():
    base = {
        "architectures": ["X"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    a = arch_from_config({**base, "vision_config": {"depth": 27, "hidden_size": 1152}}, "x")
    assert (a.vision_layers, a.vision_hidden) == (24, 1152)
    assert arch_from_config(base, "x").vision_layers == 0
    with pytest.raises(ConfigError, match="vision_config must be a JSON object"):
        arch_from_config({**base, "vision_config": [1, 2]}, "x")
