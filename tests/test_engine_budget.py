"""vLLM's rule that the step's token budget covers every running sequence is vLLM's alone: TensorRT-LLM
takes a max_num_tokens below its max_batch_size (NVIDIA's MLPerf Llama-2-70B server configs: 1536 tokens
with batch 2048), and a run under it still ends every request."""

from __future__ import annotations

import pytest

import hwdb
from simulator.run import simulate
from simulator.scenario import EngineConfig, PoolConfig, ScenarioError, deployment_for, parse_scenario


def test_budget_rule_is_vllm_only():
    db = hwdb.load()
    m = db.model("Llama-3.1-8B")
    with pytest.raises(ScenarioError, match="vLLM requires max_num_batched_tokens >= max_num_seqs"):
        deployment_for(
            PoolConfig(
                gpu="H100", engine=EngineConfig(engine="vllm-v1", max_num_seqs=2048, max_num_batched_tokens=1536)
            ),
            m,
            db,
        )
    dep = deployment_for(
        PoolConfig(gpu="H100", engine=EngineConfig(engine="trtllm", max_num_seqs=2048, max_num_batched_tokens=1536)),
        m,
        db,
    )
    assert (dep.knobs.max_num_seqs, dep.knobs.max_num_batched_tokens) == (2048, 1536)


def test_a_small_budget_still_ends_every_request():
    scn = {
        "name": "b",
        "seed": 3,
        "model": "Llama-3.1-8B",
        "pools": [
            {
                "gpu": "H100",
                "dtype": "fp8",
                "engine": {"engine": "trtllm", "max_num_seqs": 1024, "max_num_batched_tokens": 64},
            }
        ],
        "workload": {
            "arrival": {"kind": "poisson", "rate": 40},
            "input_length": {"kind": "fixed", "value": 50},
            "output_length": {"kind": "fixed", "value": 60},
            "num_requests": 400,
        },
    }
    res = simulate(parse_scenario(scn))
    req = res.requests
    assert (req["outcome"] == "completed").sum() == 400
    steps = res.steps
    assert (steps["decode_tokens"] + steps["prefill_tokens"]).max() <= 64
