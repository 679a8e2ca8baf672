"""KV capacity as each engine release sizes it (simulator/memory.py), against the engines' own start-up logs
(hwdb/data/validation/*_memory*.yaml, shipped with the repo) and their published rules."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import hwdb
from calibration.kernels.memory_fit import OTHER, _other_tokens, activation_fit, vllm_points
from simulator.cli import main
from simulator.memory import GiB, sglang_fraction, sglang_max_running
from simulator.perf import FitError, plan_memory
from simulator.run import simulate
from simulator.scenario import EngineConfig, PoolConfig, deployment_for
from tests.conftest import pool, scenario


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


@pytest.fixture(scope="module")
def points(db):
    return vllm_points(db)


def dep(db, model="Llama-3.1-8B", gpu="H100", engine="vllm-v1", version=None, tp=1, dtype="bf16", **eng):
    pool = PoolConfig(gpu=gpu, tp=tp, dtype=dtype, engine=EngineConfig(engine=engine, version=version, **eng))
    return deployment_for(pool, db.model(model), db)


def test_vllm_019_logs_are_reproduced_within_two_percent(points):
    """Every vLLM 0.19 start-up on H100 with a model hwdb knows, at the default token budget: the KV GiB it logged."""
    done = [
        p
        for p in points
        if str(p.get("vllm_version")).startswith("0.19")
        and p["pred_kv_gib"] is not None
        and (p.get("max_num_batched_tokens") or 8192) == 8192
        and p["hw"] != "Qwen3-235B-A22B"
    ]
    assert len(done) >= 20
    for p in done:
        assert p["pred_kv_gib"] == pytest.approx(p["kv_cache_gib"], rel=0.02), p["id"]


def test_older_sampler_releases_keep_more_back(points):
    """vLLM before 0.17 sorted the logits for top-k/top-p in PyTorch: its 0.11 logs show 4.8-7.4 GiB of
    activations where 0.19 shows ~2 GiB, and the plan reproduces the KV those releases logged."""
    old = [p for p in points if str(p.get("vllm_version")).startswith("0.11") and p["pred_kv_gib"] is not None]
    assert len(old) >= 4
    for p in old:
        assert p["pred_kv_gib"] == pytest.approx(p["kv_cache_gib"], rel=0.02), p["id"]


def test_activation_fit_holds_on_models_it_never_saw(db, points):
    _, rows = activation_fit(points, db)
    held = [(y, p) for _, y, p, h in rows if h]
    assert len(held) >= 5
    assert max(abs(p - y) for y, p in held) < 0.35  # GiB, on activations of 0.75-3.9 GiB


def test_release_terms_switch_where_the_engine_changed(db):
    new, old = plan_memory(dep(db, version="0.19.0")), plan_memory(dep(db, version="0.16.0"))
    assert old.activation_bytes - new.activation_bytes > 2 * GiB  # the sampler's copies
    d20 = dep(db, version="0.20.0")
    assert plan_memory(d20).usable_bytes == pytest.approx(0.92 * d20.gpu.visible_bytes)  # 0.20's default
    assert plan_memory(dep(db, version="0.19.0", gpu_memory_utilization=0.8)).usable_bytes == pytest.approx(
        0.8 * d20.gpu.visible_bytes
    )


@pytest.mark.parametrize("case", OTHER, ids=[c["engine"] + "-" + c["model"] for c in OTHER])
def test_sglang_and_trtllm_logs_within_seven_percent(db, case):
    assert _other_tokens(db, case) == pytest.approx(case["tokens"], rel=0.07)


def test_sglang_default_fraction_follows_the_release(db):
    """server_args.py: 0.5.3 on reserves 512 + 1.5 x chunk + 2 x graph batch + 1024 x ranks/8 MiB (H100 TP1,
    chunk 8192, graph batch 256 by SGLang's memory tier: 0.834); 0.4.8-0.5.2 reserves 9.5 + ranks/2 GiB on an
    80 GB GPU (0.874)."""
    d = dep(db, engine="sglang")
    mib = d.gpu.visible_bytes / 2**20
    assert (d.knobs.max_num_batched_tokens, d.knobs.max_cudagraph_capture_size) == (8192, 256)
    assert sglang_fraction(d, "0.5.9") == pytest.approx((mib - (512 + 1.5 * 8192 + 2 * 256 + 128)) / mib)
    assert sglang_fraction(d, "0.5.2") == pytest.approx(1 - 10.0 / (mib / 1024))
    assert sglang_fraction(d, "0.4.0") == 0.88
    assert sglang_fraction(dep(db, engine="sglang", tp=8), "0.4.0") == 0.81


def test_sglang_runs_half_its_tokens_at_most_its_request_pool(db):
    assert sglang_max_running(38048, 131072) == 2048
    assert sglang_max_running(665690, 65536) == 4096  # SGLang's tuning guide's logged example
    assert sglang_max_running(3000, 131072) == 1500
    d = dep(db, "gpt-oss-120b", engine="sglang", dtype="fp4")
    assert d.knobs.max_num_seqs == plan_memory(d).max_running == 2048
    assert dep(db, "gpt-oss-120b", engine="sglang", dtype="fp4", max_num_seqs=64).knobs.max_num_seqs == 64


def test_only_vllm_refuses_a_cache_shorter_than_max_model_len(db):
    """gpt-oss-120b on one H100 at 0.9: vLLM's cache holds fewer tokens than the 131k context and vLLM refuses
    to start (lower max_model_len or raise the fraction); SGLang shortens the longest request instead."""
    with pytest.raises(FitError, match="max_model_len"):
        plan_memory(dep(db, "gpt-oss-120b", dtype="fp4"))
    assert plan_memory(dep(db, "gpt-oss-120b", dtype="fp4", max_model_len=32768)).kv_tokens > 32768
    assert plan_memory(dep(db, "gpt-oss-120b", engine="sglang", dtype="fp4")).kv_tokens < 131072


def test_a_copied_gpu_with_a_new_size_must_update_its_visible_total(tmp_path):
    """A user GPU copied from the H100 file with only memory_bytes changed would keep CUDA's 79.19 GiB and
    plan the KV cache of the wrong card: refused, naming the field and the fix."""
    src = Path(__file__).resolve().parent.parent / "hwdb/data/gpus/H100-SXM-80GB.yaml"
    gpu = yaml.safe_load(src.read_text())
    gpu.update(name="Lab-GPU-96", aliases=["labgpu"], memory_bytes={"value": 96 * 2**30, "source": "lab (test)"})
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "lab.yaml").write_text(yaml.safe_dump(gpu))
    with pytest.raises(hwdb.HwdbError, match="visible_memory_bytes.*update it with memory_bytes, or remove it"):
        hwdb.load([str(tmp_path)])


def test_perf_prints_how_the_engine_sized_its_cache(capsys):
    assert main(["perf", "gpt-oss-120b", "--gpu", "H100", "--dtype", "fp4", "--engine", "sglang"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # 0.834: chunk 8192 and graphs to 256 (SGLang 0.5's H100 tier at TP1)
    assert "memory: SGLang: mem_fraction_static 0.834" in out and "up to 2,048 running requests" in out
    assert "measured kernels: routed experts: H100-SXM-80GB_sglang" in out and "MLA" not in out
    # vLLM at its default fraction refuses gpt-oss-120b's 131k context on one H100 and says what to change
    assert main(["perf", "gpt-oss-120b", "--gpu", "H100", "--dtype", "fp4"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "fewer than max_model_len=131072" in err and "raise engine.gpu_memory_utilization (now 0.9)" in err


def test_the_run_summary_says_how_each_pool_sized_its_cache():
    res = simulate(scenario(pools=pool(engine={"engine": "sglang"})))
    info = res.info["pools"][0]
    assert info["kv_cache_sizing"].startswith("SGLang: mem_fraction_static")
    assert info["max_running_requests"] == 2048 and info["kv_cache_tokens_per_instance"] > 0
