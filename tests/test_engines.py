"""Engine generations as what-ifs: legacy vLLM (V0), vLLM V1 and SGLang, and the CPU side of a step."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import yaml

from simulator.resolved import resolve
from simulator.run import simulate
from simulator.scenario import ScenarioError, parse_scenario
from tests.conftest import REPO


def _example():
    spec = importlib.util.spec_from_file_location("engine_generations", REPO / "examples/engine_generations.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _gap(ex, workload, slow="vllm-v0", hwdb=()):
    v1 = ex.run("vllm-v1", workload)["output_tokens_per_s"]
    v0 = ex.run(slow, workload, hwdb)["output_tokens_per_s"]
    return (v1 - v0) / v1


def test_cpu_overhead_matters_for_short_requests_not_long_ones(tmp_path):
    ex = _example()
    short, long_ = ex.WORKLOADS.values()
    gap_short, gap_long = _gap(ex, short), _gap(ex, long_)
    assert gap_short > 0.10  # legacy falls clearly behind at high concurrency
    assert 0 <= gap_long < 0.4 * gap_short  # and nearly catches up with a few long requests
    # The gap scales with the (calibrated) CPU overhead: double V0's per-sequence cost.
    v0 = yaml.safe_load((REPO / "hwdb/data/engines/vllm-v0.yaml").read_text())
    v0.update(name="vllm-v0-slow", aliases=[])
    v0["cpu"]["per_running_seq_s"]["value"] *= 2
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "slow.yaml").write_text(yaml.safe_dump(v0))
    assert _gap(ex, short, "vllm-v0-slow", (str(tmp_path),)) > gap_short + 0.05


def _step_model(engine: str, **engine_args):
    scn = parse_scenario(
        {
            "name": "e",
            "model": "Llama-3.1-8B",
            "pools": [{"gpu": "H100", "engine": {"engine": engine, **engine_args}}],
            "workload": {
                "arrival": {"kind": "poisson", "rate": 1},
                "input_length": {"kind": "fixed", "value": 8},
                "output_length": {"kind": "fixed", "value": 8},
                "num_requests": 1,
            },
        }
    )
    return resolve(scn).pools[0].step


def test_batches_above_the_largest_cuda_graph_pay_eager_launches():
    sm = _step_model("vllm-v1", max_num_seqs=256)  # captures up to min(2 x 256, 512) = 512 tokens
    assert sm.max_graph_tokens == 512
    sm = dataclasses.replace(sm, cpu_step=0.0, cpu_run=0.0, cpu_wait=0.0, cpu_tok=0.0, cpu_sample=0.0)
    ctx = 1000.0
    inside = sm.step_time(512, 512, 0.0, 512 * ctx)
    beyond = sm.step_time(513, 513, 0.0, 513 * ctx)
    assert beyond - inside == pytest.approx(sm.eager_launch - sm.graph_launch, rel=0.05)
    assert sm.eager_launch > 5 * sm.graph_launch
    # Legacy V0 captures decode-only batches up to 256 and runs every prefill eagerly.
    v0 = _step_model("vllm-v0")
    assert v0.max_graph_tokens == 256
    assert v0.step_time(64, 1, 64 * 65 / 2, 0.0) - v0.step_time(64, 64, 0.0, 64.0) > 0.5 * v0.eager_launch
    # enforce_eager turns graphs off entirely.
    assert _step_model("vllm-v1", enforce_eager=True).max_graph_tokens == 0


def test_profiles_state_their_defaults():
    v0, v1, sg = (_step_model(e) for e in ("vllm-v0", "vllm-v1", "sglang"))
    assert not v0.overlapped and v1.overlapped and sg.overlapped
    res = simulate(
        parse_scenario(
            {
                "name": "d",
                "model": "Llama-3.1-8B",
                "pools": [{"gpu": "H100", "engine": {"engine": "vllm-v0"}}],
                "workload": {
                    "arrival": {"kind": "poisson", "rate": 1},
                    "input_length": {"kind": "fixed", "value": 8},
                    "output_length": {"kind": "fixed", "value": 8},
                    "num_requests": 2,
                },
            }
        )
    )
    # V0 without chunked prefill: the token budget defaults to max(max_model_len, 2048).
    assert res.info["max_num_seqs"] == 256 and res.info["max_num_batched_tokens"] == 131072


def test_unknown_engine_lists_the_known_ones():
    with pytest.raises(ScenarioError) as exc:
        _step_model("vllm-v3")
    msg = str(exc.value)
    assert "vllm-v3" in msg and all(name in msg for name in ("vllm-v0", "vllm-v1", "sglang"))
