"""Async scheduling (``engine.async_scheduling``; the engine profile's ``async_scheduling`` rule: vLLM's async
scheduling, SGLang's overlap scheduler): the engine schedules batch K+1 when it launches batch K, so a prompt
sent while K runs joins K+2, one whole step later than the step after its arrival
(simulator/engine/instance.py, ``InstanceState.admit_sent``).

Checked: which deployments schedule ahead (engine, release, GPU vendor, pipeline parallelism, SGLang's
linear-attention exception, the pool's setting); that a prompt never joins the step that was running when it
arrived nor the one after it, also when SGLang reads its socket only every few steps, and that nothing else of
the run changes; the same seed gives the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

import hwdb
from simulator.run import simulate
from simulator.scenario import EngineConfig, PoolConfig, ScenarioError, deployment_for, parse_scenario


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


@pytest.mark.parametrize(
    "gpu,version,pp,setting,expected",
    [
        ("H100", None, 1, None, True),  # the profile's release, 0.19
        ("H100", "0.14.0", 1, None, True),
        ("H100", "0.13.0", 1, None, False),  # before vLLM 0.14 made it the default
        ("MI300X", None, 1, None, True),
        ("CPU-host", None, 1, None, False),  # vLLM's CPU backend turns it off
        ("H100", None, 2, None, False),  # not with pipeline parallelism
        ("H100", None, 1, False, False),  # --no-async-scheduling
        ("H100", "0.12.0", 1, True, True),  # --async-scheduling on an older release
    ],
)
def test_which_deployments_schedule_ahead(db, gpu, version, pp, setting, expected):
    pool = PoolConfig(gpu=gpu, pp=pp, engine=EngineConfig(version=version, async_scheduling=setting))
    assert deployment_for(pool, db.model("Llama-3.1-8B"), db).knobs.async_scheduling is expected


@pytest.mark.parametrize(
    "version,setting,expected",
    [(None, None, True), ("0.3.6", None, False), ("0.3.6", True, True), (None, False, False)],
)
def test_sglang_overlap_scheduler_from_0_4(db, version, setting, expected):
    """SGLang's overlap scheduler is on by default since v0.4 (--disable-overlap-schedule turns it off)."""
    pool = PoolConfig(gpu="H100", engine=EngineConfig(engine="sglang", version=version, async_scheduling=setting))
    assert deployment_for(pool, db.model("Llama-3.1-8B"), db).knobs.async_scheduling is expected


@pytest.mark.parametrize("prefix,expected", [(None, False), (False, True)])
def test_sglang_linear_attention_with_prefix_cache_runs_serially(db, prefix, expected):
    """SGLang's mamba no_buffer strategy turns the overlap off for Qwen3.5 while the radix cache is on."""
    pool = PoolConfig(gpu="B200", tp=8, dtype="fp8", engine=EngineConfig(engine="sglang", enable_prefix_caching=prefix))
    assert deployment_for(pool, db.model("Qwen3.5-397B-A17B"), db).knobs.async_scheduling is expected


@pytest.mark.parametrize(
    "engine,model,pp,field",
    [
        ("trtllm", "Llama-3.1-8B", 1, "not modelled for trtllm"),
        ("vllm-v1", "Llama-3.1-8B", 2, "pipeline parallelism"),
        ("sglang", "Qwen3.5-397B-A17B", 1, "linear-attention model with the prefix cache on"),
    ],
)
def test_refused_where_it_does_not_apply(db, engine, model, pp, field):
    tp = 8 if model.startswith("Qwen3.5") else 1
    pool = PoolConfig(gpu="B200", tp=tp, pp=pp, dtype="fp8", engine=EngineConfig(engine=engine, async_scheduling=True))
    with pytest.raises(ScenarioError, match=f"async_scheduling=true.*{field}"):
        deployment_for(pool, db.model(model), db)


def _run(ahead: bool, seed: int = 3, engine: dict | None = None):
    scn = {
        "name": "lag",
        "seed": seed,
        "model": "Llama-3.1-8B",
        "pools": [{"gpu": "H100", "dtype": "fp8", "engine": {"async_scheduling": ahead, **(engine or {})}}],
        "workload": {
            "arrival": {"kind": "closed", "concurrency": 6},
            "input_length": {"kind": "uniform", "low": 600, "high": 1024},
            "output_length": {"kind": "uniform", "low": 100, "high": 200},
            "num_requests": 120,
        },
    }
    return simulate(parse_scenario(scn))


def test_a_prompt_joins_the_step_after_next():
    sync, ahead = _run(False), _run(True)
    # a prompt sent while a step runs waits that step and the next: its TTFT grows by about a decode step
    step = float(sync.requests.tpot_s.mean())
    gain = float(ahead.requests.ttft_s.mean() - sync.requests.ttft_s.mean())
    assert 0.3 * step < gain < 2.0 * step
    # the decode side is the engine's own: the mean TPOT barely moves (admissions shift by a step)
    assert ahead.requests.tpot_s.mean() == pytest.approx(sync.requests.tpot_s.mean(), rel=0.05)
    assert len(ahead.requests) == len(sync.requests) == 120


@pytest.mark.parametrize(
    "engine", [None, {"engine": "sglang"}, {"engine": "sglang", "scheduler_recv_interval": 3}], ids=str
)
def test_never_scheduled_in_the_step_it_arrived_during_or_the_next(engine):
    res = _run(True, engine=engine)
    steps = res.steps.sort_values("start_s")
    start = steps.start_s.to_numpy()
    end = start + steps.duration_s.to_numpy()
    req = res.requests
    lagged = 0
    for seen, sched in zip(req.arrival_s + req.frontend_s, req.scheduled_s, strict=True):
        during = np.flatnonzero((start < seen - 1e-12) & (seen < end))  # (a step starting then took it)
        if len(during) == 0 or during[0] + 1 >= len(end):  # sent to an idle engine: the next step takes it
            continue
        assert sched >= end[during[0] + 1] - 1e-12  # not in the running step, nor in the one scheduled with it
        lagged += 1
    assert lagged > 50  # most prompts of a busy closed loop arrive while a step runs


def test_sglang_reads_its_socket_every_few_steps_with_the_lag_on_top():
    """With ``scheduler_recv_interval`` a prompt waits for a read, and then for the step after next: each of the
    two delays adds to the other's TTFT, neither replaces it."""
    ttft = {
        (recv, ahead): float(
            _run(ahead, engine={"engine": "sglang", "scheduler_recv_interval": recv}).requests.ttft_s.mean()
        )
        for recv in (1, 8)
        for ahead in (False, True)
    }
    step = float(_run(False, engine={"engine": "sglang"}).requests.tpot_s.mean())
    assert ttft[8, False] > ttft[1, False] + step  # a read every 8 steps: several steps' wait
    assert ttft[8, True] > ttft[8, False] + 0.3 * step  # and the step-ahead lag on top
    assert ttft[1, True] > ttft[1, False] + 0.3 * step


def test_same_seed_same_bytes():
    a, b = _run(True, seed=7), _run(True, seed=7)
    assert a.requests.to_csv().encode() == b.requests.to_csv().encode()
