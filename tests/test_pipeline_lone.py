"""Pipeline stages never make one sequence faster: a lone prompt passes the stages in series."""

from __future__ import annotations

import pytest

import hwdb
from simulator.scenario import PoolConfig, deployment_for
from simulator.step_build import build_step_model


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


def sm(db, model, gpu, pp, dtype="bf16", tp=1):
    return build_step_model(deployment_for(PoolConfig(gpu=gpu, tp=tp, pp=pp, dtype=dtype), db.model(model), db))


@pytest.mark.parametrize(
    "model,gpu,dtype,tp",
    [("Llama-3.1-8B", "H200", "fp8", 1), ("Llama-3.1-70B", "H100", "bf16", 4), ("Qwen2.5-7B", "A100-80GB", "bf16", 1)],
)
@pytest.mark.parametrize("prompt", [128, 2048, 8192])
def test_lone_prompt_not_faster_with_stages(db, model, gpu, dtype, tp, prompt):
    one = sm(db, model, gpu, 1, dtype, tp).prefill_time(prompt)
    for pp in (2, 4, 8):
        assert sm(db, model, gpu, pp, dtype, tp).prefill_time(prompt) >= one


def test_a_full_pipeline_still_raises_throughput(db):
    """With at least pp sequences in a step the micro-batches fill the stages: the step's compute splits."""
    one, four = sm(db, "Llama-3.1-70B", "H100", 1, tp=4), sm(db, "Llama-3.1-70B", "H100", 4, tp=4)
    tokens, pairs = 8192, 8 * (1024 * 1025 / 2)
    full = four.step_time(tokens, 8, pairs, 0.0, 0.0, 8, 0)
    lone = four.step_time(tokens, 8, pairs, 0.0, 0.0, 1, 0)
    assert full < one.step_time(tokens, 8, pairs, 0.0, 0.0, 8, 0) < lone * 1.05
    assert lone > 2.0 * full  # the compute splits 4 ways; all-reduces and per-layer floors do not


def test_decode_of_one_sequence_pays_every_stage(db):
    one, four = sm(db, "Llama-3.1-8B", "H100", 1), sm(db, "Llama-3.1-8B", "H100", 4)
    assert four.decode_time(1, 4096) >= one.decode_time(1, 4096)
