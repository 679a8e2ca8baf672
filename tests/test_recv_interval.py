"""SGLang's ``--scheduler-recv-interval``: a busy scheduler reads new requests once every N decode steps.

SGLang's scheduler (``SchedulerRecvSkipper``) counts 1 per decode step and the whole interval per step with a
prefill, and reads its socket when the count reaches the interval; an idle scheduler reads at once.  So new
requests are admitted only at read points: right after a prefill step, or after a multiple of N decode-only
steps since the last prefill.
"""

from __future__ import annotations

import numpy as np
import pytest

from calibration.e2e.rows import Row
from calibration.e2e.scenarios import sglang_recv_interval
from simulator.run import simulate
from simulator.scenario import ScenarioError, parse_scenario


def _scenario(interval: int | None, engine: str = "sglang", dp: int = 1, seed: int = 3):
    eng = {"engine": engine} | ({"scheduler_recv_interval": interval} if interval else {})
    return parse_scenario(
        {
            "name": "recv",
            "seed": seed,
            "model": "Llama-3.1-8B",
            "pools": [{"gpu": "H100", "dp": dp, "engine": eng}],
            "workload": {
                "arrival": {"kind": "closed", "concurrency": 8},
                "input_length": {"kind": "fixed", "value": 64},
                "output_length": {"kind": "uniform", "low": 50, "high": 150},
                "num_requests": 80,
            },
        }
    )


def _decode_runs_before_admissions(steps) -> list[int]:
    """For each step that admits a prompt after a decode-only step, the decode-only steps since the last
    step with a prompt (the instance busy throughout)."""
    pre = steps["prefill_tokens"].to_numpy() > 0
    runs, last = [], None
    for i, p in enumerate(pre):
        if p:
            if last is not None and i - last > 1:
                runs.append(i - last - 1)
            last = i
    return runs


@pytest.mark.parametrize("interval", [10, 30])
def test_prompts_are_admitted_only_at_read_points(interval):
    res = simulate(_scenario(interval))
    runs = _decode_runs_before_admissions(res.steps)
    assert runs, "the closed loop never waited for a read"
    assert all(r % interval == 0 for r in runs), sorted(set(runs))
    # every request ends exactly once, all completed
    req = res.requests
    assert req["request_id"].is_unique and (req["outcome"] == "completed").all() and len(req) == 80


def test_without_the_flag_prompts_are_admitted_at_the_next_step():
    runs = _decode_runs_before_admissions(simulate(_scenario(None)).steps)
    assert any(r % 10 for r in runs)  # admissions fall between read points: nothing gates them


def test_the_wait_grows_ttft_by_about_half_an_interval_of_decode_steps():
    base, gated = simulate(_scenario(None)).requests, simulate(_scenario(30)).requests

    def steady(r):  # the first wave enters an idle server
        return r[r["request_id"] >= 8]

    extra = steady(gated)["ttft_s"].mean() - steady(base)["ttft_s"].mean()
    tpot = steady(base)["tpot_s"].mean()
    # a request sent at a uniform point of the 30-step cycle waits ~15 decode steps
    assert 5 * tpot < extra < 30 * tpot


def test_same_seed_same_bytes():
    a, b = simulate(_scenario(30)).requests, simulate(_scenario(30)).requests
    assert np.array_equal(a["ttft_s"].to_numpy(), b["ttft_s"].to_numpy())


@pytest.mark.parametrize("engine, dp, why", [("vllm-v1", 1, "SGLang's flag"), ("sglang", 2, "data parallelism")])
def test_refused_where_it_does_not_apply(engine, dp, why):
    with pytest.raises(ScenarioError) as exc:
        simulate(_scenario(30, engine=engine, dp=dp))
    msg = str(exc.value)
    assert "scheduler_recv_interval=30" in msg and why in msg and "set 1" in msg


def _row(**kw) -> Row:
    base = dict(
        id="r",
        backend="sglang",
        version="0.5.9",
        model="deepseek-ai/DeepSeek-R1",
        system="b200_sxm",
        quant="fp8",
        precision="fp8",
        isl=1024,
        osl=1024,
        concurrency=64,
        tp=8,
        pp=1,
        dp=1,
        moe_tp=8,
        moe_ep=1,
        ttft_s=1.0,
        tpot_s=0.02,
        disagg=False,
    )
    return Row(**(base | kw))


@pytest.mark.parametrize(
    "kw, expected",
    [
        ({}, 30),
        ({"concurrency": 8}, 10),
        ({"tp": 4, "isl": 8192}, 10),
        ({"quant": "nvfp4", "tp": 4}, 30),
        ({"system": "h200_sxm"}, 1),
        ({"backend": "vllm"}, 1),
        ({"disagg": True}, 1),
        ({"dp": 8}, 1),
        ({"model": "zhipuai/GLM-5"}, 1),
        ({"model": "zhipuai/GLM-5", "quant": "nvfp4"}, 10),
        ({"model": "Qwen/Qwen3.5-397B-A17B", "system": "b300_sxm", "tp": 4}, 10),
        ({"model": "Qwen/Qwen3.5-397B-A17B", "tp": 4}, 30),
    ],
)
def test_the_campaigns_launch_rule(kw, expected):
    assert sglang_recv_interval(_row(**kw)) == expected
