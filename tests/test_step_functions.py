"""The engine's step-time closures (step_closures.step_functions) give the same bits as StepModel.step_time.

The engine calls the closures; the step tables must not move by an ulp, so every term has to be
computed in the method's order.  Checked over random steps on models that take each branch: one
GPU, tensor parallel with a measured all-reduce curve and with the link's line, pipeline stages,
an engine that does not overlap host and GPU, one that runs mixed steps eagerly, and a model with routed experts (the methods).
"""
from __future__ import annotations

import dataclasses
import math
import random

import pytest

from simulator.scenario import resolve
from simulator.step_closures import step_functions
from tests.conftest import pool, scenario

MODELS = {
    "8b h100 tp1": dict(model="Llama-3.1-8B", pools=pool(gpu="H100", tp=1)),
    "8b h200 tp2": dict(model="Llama-3.1-8B", pools=pool(gpu="H200", tp=2)),
    "70b a100 tp2 pp2": dict(model="Llama-2-70B", pools=pool(gpu="A100-80GB", tp=2, pp=2)),
    "70b l40s tp4": dict(model="Llama-3.1-70B", pools=pool(gpu="L40S", tp=4, engine={"max_model_len": 8192})),
    "moe": dict(model="Qwen3-30B-A3B", pools=pool(gpu="H200", tp=2)),
}


def _models():
    for name, over in MODELS.items():
        step = resolve(scenario(**over)).pools[0].step
        yield name, step
        if name == "8b h100 tp1":
            yield name + " eager mixed steps", dataclasses.replace(step, graphs_mixed=False)
        if name == "8b h200 tp2":
            # the link's alpha-beta line instead of a measured curve, and host time added to the GPU's
            yield name + " ring, serial host", dataclasses.replace(step, ar_sizes=(), ar_graph=(), ar_eager=(),
                                                                    overlapped=not step.overlapped)


@pytest.mark.parametrize("name,step", list(_models()), ids=lambda x: x if isinstance(x, str) else "")
def test_closures_equal_the_method_bit_for_bit(name, step):
    fn, dec = step_functions(step)
    rnd = random.Random(7)
    for _ in range(3000):
        n = rnd.choice([1, 2, 7, 64, 255, 256, 257, 511, 512, 513, 1024, 4096])
        ctx = n * rnd.randint(1, 20000)
        # a fifth of the draws with fewer sequences than a pipeline's stages (the idle-stage branch)
        running, waiting = (rnd.randint(0, 600) if rnd.random() < 0.8 else rnd.randint(0, 3)), rnd.randint(0, 50)
        assert dec(n, ctx, running).hex() == (step.step_time(n, n, 0.0, ctx, 0.0, running, 0) + 0.0).hex()
        c = rnd.randint(1, 8192)
        done = rnd.choice([0, rnd.randint(1, 30000)])
        tokens = n + c
        args = (tokens, n + rnd.randint(0, 1), c * done + c * (c + 1) * 0.5, float(ctx), float(done), running, waiting)
        assert fn(*args).hex() == step.step_time(*args).hex()
        args = (n, n, 0.0, ctx, 0.0, running, waiting)
        assert fn(*args).hex() == step.step_time(*args).hex()
    assert fn(0, 0, 0.0, 0.0) == step.step_time(0, 0, 0.0, 0.0) == 0.0
    assert dec(0, 0, 0) == 0.0
    assert not math.isnan(dec(1, 1, 1))
