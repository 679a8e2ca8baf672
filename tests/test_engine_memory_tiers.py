"""Defaults that follow the GPU's memory (``memory_tiers`` of an engine profile): SGLang picks its chunked-prefill
size and CUDA-graph batch limit from the memory the GPU shows (server_args ``_handle_gpu_memory_settings``), and
a pool's own setting wins over the tier; the validation passes the flags InferenceX launched its SGLang runs with
(calibration/e2e/scenarios.py ``sglang_launch_knobs``)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import hwdb
from calibration.e2e.rows import DEFAULT_TABLE, load_rows
from calibration.e2e.scenarios import sglang_launch_knobs, to_scenario, why_not
from simulator.resolved import resolve
from simulator.scenario import EngineConfig, PoolConfig, ScenarioError, deployment_for, parse_scenario

needs_shared = pytest.mark.skipif(not DEFAULT_TABLE.is_file(), reason="../shared/data/e2e is absent (CI has it)")


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


@pytest.mark.parametrize(
    "gpu,tp,tokens,graphs",
    [
        ("H100", 1, 8192, 256),  # < 90 GiB
        ("H100", 4, 8192, 512),  # ... from TP4 the larger graph limit
        ("H200", 2, 8192, 256),  # < 160 GiB
        ("B200", 4, 16384, 512),  # 180 GB
        ("A100-40GB", 1, 4096, 32),  # < 60 GiB
    ],
)
def test_sglang_defaults_follow_the_gpu_memory(db, gpu, tp, tokens, graphs):
    pool = PoolConfig(gpu=gpu, tp=tp, engine=EngineConfig(engine="sglang"))
    knobs = deployment_for(pool, db.model("Llama-3.1-8B"), db).knobs
    assert (knobs.max_num_batched_tokens, knobs.max_cudagraph_capture_size) == (tokens, graphs)


def test_the_pool_setting_wins_and_vllm_has_no_tiers(db):
    pool = PoolConfig(
        gpu="B200", engine=EngineConfig(engine="sglang", max_num_batched_tokens=4096, max_cudagraph_capture_size=64)
    )
    knobs = deployment_for(pool, db.model("Llama-3.1-8B"), db).knobs
    assert (knobs.max_num_batched_tokens, knobs.max_cudagraph_capture_size) == (4096, 64)
    vllm = deployment_for(PoolConfig(gpu="B200"), db.model("Llama-3.1-8B"), db).knobs
    h100 = deployment_for(PoolConfig(gpu="H100"), db.model("Llama-3.1-8B"), db).knobs
    assert vllm.max_num_batched_tokens == h100.max_num_batched_tokens  # vLLM's own rule, not a memory tier


@needs_shared
def test_inferencex_launch_flags_make_deepseek_fp8_fit_four_b200s(db):
    """Under SGLang's B200 defaults (16k-token chunk, 512-sequence graphs) DeepSeek-R1 in fp8 does not fit TP4;
    the InferenceX script ran it with --mem-fraction-static 0.95 and an 8k chunk, which the validation passes."""
    rows = [
        r
        for r in load_rows()
        if r.backend == "sglang"
        and r.system == "b200_sxm"
        and r.tp == 4
        and r.quant == "fp8"
        and not r.disagg
        and r.model.split("/")[-1].startswith("DeepSeek")
    ]
    assert rows, "the table has DeepSeek fp8 TP4 SGLang rows on B200"
    row = rows[0]
    assert sglang_launch_knobs(row) == {
        "max_num_batched_tokens": 8192,
        "gpu_memory_utilization": 0.95,
        "max_cudagraph_capture_size": 32,
        "max_num_seqs": 32,
    }
    assert why_not(row, db) == ""
    scn = to_scenario(row, db, 2, {})
    dep = deployment_for(parse_scenario(scn).pools[0], db.model(row.model), db)
    assert dep.knobs.max_num_batched_tokens == 8192
    defaults = {k: v for k, v in scn["pools"][0]["engine"].items() if k not in sglang_launch_knobs(row)}
    with pytest.raises(ScenarioError, match="does not fit|needs"):
        resolve(parse_scenario({**scn, "pools": [{**scn["pools"][0], "engine": defaults}]}), db)


@pytest.mark.parametrize("bounds", [(160, 90), (None, 90), (90, 90)])
def test_tiers_out_of_order_are_refused_naming_the_fix(db, bounds):
    """The first tier above the GPU's memory applies: a user engine file with unordered tiers is refused, not read
    with the wrong tier."""
    tiers = [
        {"below_gib": b, "max_num_batched_tokens": 8192, "max_capture_size": 256, "source": "test"} for b in bounds
    ]
    data = db.engine("sglang").model_dump() | {"memory_tiers": tiers}
    with pytest.raises(ValidationError, match="below_gib must increase.*sort the tiers"):
        type(db.engine("sglang")).model_validate(data)


@needs_shared
def test_h200_rows_take_their_scripts_flags(db):
    """The 2026-03-25 H200 SGLang campaign ran InferenceX's dsr1/qwen3.5/glm5 H200 scripts: their flags reach the
    pool (DeepSeek's depend on the shape, as the script's 1k/1k test does), and a family without a script keeps
    SGLang's per-GPU defaults."""
    rows = [r for r in load_rows() if r.backend == "sglang" and r.system == "h200_sxm" and not r.disagg]
    by = {}
    for r in rows:
        by.setdefault((r.model.split("/")[-1][:8], r.isl, r.osl), r)
    deepseek_short = next(r for (m, i, o), r in by.items() if m.startswith("DeepSeek") and (i, o) == (1024, 1024))
    deepseek_long = next(r for (m, i, o), r in by.items() if m.startswith("DeepSeek") and (i, o) != (1024, 1024))
    assert sglang_launch_knobs(deepseek_short)["max_num_seqs"] == 512
    assert sglang_launch_knobs(deepseek_long)["max_cudagraph_capture_size"] == 256
    qwen = next(r for (m, _, _), r in by.items() if m.startswith("Qwen3.5"))
    assert sglang_launch_knobs(qwen) == {
        "max_num_batched_tokens": 16384,
        "gpu_memory_utilization": 0.8,
        "max_num_seqs": 128,
        "max_cudagraph_capture_size": qwen.concurrency,
    }
    glm = next(r for (m, _, _), r in by.items() if m.startswith("GLM-5"))
    assert sglang_launch_knobs(glm) == {"gpu_memory_utilization": 0.85}
    other = next(r for (m, _, _), r in by.items() if m.startswith("Qwen3-23"))
    assert sglang_launch_knobs(other) == {}
    scn = to_scenario(deepseek_short, db, 2, {})
    dep = deployment_for(parse_scenario(scn).pools[0], db.model(deepseek_short.model), db)
    assert (dep.knobs.max_num_batched_tokens, dep.knobs.max_num_seqs) == (32768, 512)
