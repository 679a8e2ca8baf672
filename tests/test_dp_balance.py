"""Attention DP as the engines run it (simulator/engine/dp_group.py): vLLM pads every rank to the busiest
rank's tokens, an all-to-all dispatch (SGLang's DeepEP, TensorRT-LLM) routes only the tokens the ranks
have; TensorRT-LLM's ADP balance holds prompts back until every rank has one (or a rank has nothing
running, or 60 steps pass), so the ranks prefill together instead of each stalling the others' decodes."""

from __future__ import annotations

import dataclasses
import types

import hwdb
from simulator.engine.dp_group import DPGroup
from simulator.run import simulate
from simulator.scenario import parse_scenario


class _Env:
    """Just enough of simpy.Environment for one DPGroup step (its clock and events are not exercised)."""

    now = 0.0

    def event(self):
        return types.SimpleNamespace(succeed=lambda value: None)

    def timeout(self, dt):
        return types.SimpleNamespace(callbacks=[])


class _Model:
    """Records the tokens the group routes through the MoE layers."""

    def __init__(self, pads: bool) -> None:
        self.moe_pads_dp, self.routed = pads, []

    def moe_time(self, routed, own):
        self.routed.append((routed, own))
        return 0.0

    def combine(self, gpu, cpu):
        return gpu + cpu


def _routed(pads: bool) -> tuple[int, int]:
    model = _Model(pads)
    group = DPGroup(_Env(), model, 4)
    for rank, tokens in enumerate((8192, 8, 8, 8)):  # one rank prefills, three decode
        group.pending[rank] = (tokens, 0.01, 0.0)
    group._maybe_start()
    return model.routed[0]


def test_vllm_pads_to_the_busiest_rank_and_all_to_all_routes_what_the_ranks_have():
    assert _routed(True) == (4 * 8192, 8192)
    assert _routed(False) == (8192 + 3 * 8, 8192)
    db = hwdb.load()
    assert db.engine("vllm-v1").moe_dispatch == "allgather" and db.engine("trtllm").moe_dispatch == "all_to_all"


def test_context_wait_holds_prompts_until_every_rank_has_one():
    members = [types.SimpleNamespace(waiting=[], n_running=4) for _ in range(4)]
    group = DPGroup(_Env(), _Model(False), 4, wait_steps=3)
    group.members = members
    members[0].waiting = [1]
    assert not group.may_prefill(0, 4)  # the others have no prompt: hold
    assert not group.may_prefill(0, 4)  # decided once per group step: still held
    group.steps += 1
    for m in members:
        m.waiting = [1]
    assert group.may_prefill(0, 4) and group.may_prefill(3, 4)  # all have one: every rank admits
    for m in members[1:]:
        m.waiting = []
    held = []
    for _ in range(4):  # released by the timeout on the third step
        group.steps += 1
        held.append(group.may_prefill(0, 4))
    assert held == [False, False, True, False]
    group.steps += 1
    members[2].n_running = 0  # a rank with nothing running: nothing to protect
    assert group.may_prefill(0, 4)
    assert group.may_prefill(1, 0)  # nor is a rank with nothing running ever held
    assert DPGroup(_Env(), _Model(False), 4).may_prefill(0, 4)  # no context wait: never held


def _dp(engine: str, isl: int):
    return parse_scenario(
        {
            "name": "dp",
            "model": "DeepSeek-V3",
            "seed": 3,
            "pools": [
                {
                    "name": "main",
                    "gpu": "H200",
                    "tp": 1,
                    "dp": 8,
                    "ep": 8,
                    "dtype": "fp8",
                    "kv_cache_dtype": "fp8",
                    "engine": {"engine": engine, "max_model_len": isl + 1200},
                }
            ],
            "workload": {
                "arrival": {"kind": "closed", "concurrency": 64},
                "input_length": {"kind": "uniform", "low": int(0.8 * isl), "high": isl},
                "output_length": {"kind": "uniform", "low": 800, "high": 1000},
                "num_requests": 256,
            },
        }
    )


def test_balanced_prefills_trade_ttft_for_tpot_and_finish_every_request():
    """TensorRT-LLM with 8k prompts over 8 DP ranks: the balance lowers TPOT (fewer decode steps stalled by
    one rank's prefill) and raises TTFT (prompts wait for the others) against the same engine without it."""
    on = simulate(_dp("trtllm", 8192))
    db = hwdb.load()
    eng = db.engine("trtllm")
    assert eng.dp_context_wait_steps == 60
    off_db = dataclasses.replace(
        db, engines={**db.engines, "trtllm": eng.model_copy(update={"dp_context_wait_steps": None})}
    )
    off = simulate(_dp("trtllm", 8192), 0, off_db)
    for res in (on, off):
        assert (res.requests["outcome"] == "completed").all() and len(res.requests) == 256
    assert on.summary["tpot_s"]["mean"] < off.summary["tpot_s"]["mean"]
    assert on.summary["ttft_s"]["mean"] > off.summary["ttft_s"]["mean"]
