"""vLLM's async scheduling (``engine.async_scheduling``; the engine profile's ``async_scheduling`` rule): the
engine schedules batch K+1 when it launches batch K, so a prompt sent while K runs joins K+2, one whole step
later than the step after its arrival (simulator/engine/instance.py, ``InstanceState.admit_sent``).

Checked: which deployments schedule ahead (release, GPU vendor, pipeline parallelism, the pool's setting);
that a prompt never joins the step that was running when it arrived nor the one after it, and that nothing
else of the run changes; the same seed gives the same bytes."""

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
    "engine,pp,field", [("sglang", 1, "not modelled for sglang"), ("vllm-v1", 2, "pipeline parallelism")]
)
def test_refused_where_it_does_not_apply(db, engine, pp, field):
    pool = PoolConfig(gpu="H100", pp=pp, engine=EngineConfig(engine=engine, async_scheduling=True))
    with pytest.raises(ScenarioError, match=f"async_scheduling=true.*{field}"):
        deployment_for(pool, db.model("Llama-3.1-8B"), db)


def _run(ahead: bool, seed: int = 3):
    scn = {
        "name": "lag",
        "seed": seed,
        "model": "Llama-3.1-8B",
        "pools": [{"gpu": "H100", "dtype": "fp8", "engine": {"async_scheduling": ahead}}],
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


def test_never_scheduled_in_the_step_it_arrived_during_or_the_next():
    res = _run(True)
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


def test_same_seed_same_bytes():
    a, b = _run(True, seed=7), _run(True, seed=7)
    assert a.requests.to_csv().encode() == b.requests.to_csv().encode()
