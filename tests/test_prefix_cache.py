"""Prefix caching (vLLM automatic prefix caching) driven by trace block hashes, and prefix-aware routing."""

from __future__ import annotations

import json

import pytest

from simulator.run import simulate
from simulator.scenario import parse_scenario
from tests.conftest import SHARED
from tests.test_invariants import check_invariants


def _trace(tmp_path, rows) -> str:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return str(path)


def _scn(path, router="least_outstanding", instances=1, caching=True):
    return parse_scenario(
        {
            "name": "pc",
            "seed": 1,
            "model": "Llama-3.1-8B",
            "pools": [
                {"gpu": "H100", "instances": instances, "router": router, "engine": {"enable_prefix_caching": caching}}
            ],
            "workload": {"arrival": {"kind": "trace", "path": path, "format": "plain"}},
        }
    )


def test_repeated_prompt_hits_and_prefills_faster(tmp_path):
    # Two identical 4,096-token prompts (8 blocks of 512), far apart in time.
    rows = [{"arrival_s": t, "input_tokens": 4096, "output_tokens": 4, "hash_ids": list(range(8))} for t in (0, 5)]
    res = simulate(_scn(_trace(tmp_path, rows)))
    req = res.requests
    assert req["cached_tokens"].tolist() == [0, 4096 - 16]  # all but the last block of 16 tokens
    assert req["prefill_s"].iloc[1] < 0.2 * req["prefill_s"].iloc[0]  # one 16-token step, weight-bound
    off = simulate(_scn(_trace(tmp_path, rows), caching=False)).requests
    assert off["cached_tokens"].sum() == 0
    assert off["prefill_s"].iloc[1] == pytest.approx(off["prefill_s"].iloc[0], rel=1e-9)
    check_invariants(res)


def test_prefix_aware_routing_raises_hit_rate(tmp_path):
    # 7 conversations, each re-sending its growing history: a shared prefix per conversation.
    rows, t = [], 0.0
    for turn in range(1, 9):
        for conv in range(7):  # 7 conversations on 4 instances: round robin moves each one every turn
            t += 0.05
            hashes = [conv * 1000 + b for b in range(2 * turn)]
            rows.append({"arrival_s": t, "input_tokens": 512 * len(hashes), "output_tokens": 16, "hash_ids": hashes})
    path = _trace(tmp_path, rows)
    aware = simulate(_scn(path, "prefix_aware", instances=4))
    rr = simulate(_scn(path, "round_robin", instances=4))
    assert aware.summary["prefix_cache_hit_rate"] > rr.summary["prefix_cache_hit_rate"] + 0.2
    assert aware.summary["ttft_s"]["mean"] < rr.summary["ttft_s"]["mean"]
    check_invariants(aware)
    check_invariants(rr)


def test_mooncake_trace_reports_hit_rate():
    if not SHARED.is_dir():
        pytest.skip("../shared is absent (CI has it): this test replays the Mooncake trace")
    path = str(SHARED / "data/traces/mooncake/conversation_trace.jsonl")
    scn = parse_scenario(
        {
            "name": "mc",
            "seed": 1,
            "model": "Llama-3.1-8B",
            "pools": [{"gpu": "H200", "instances": 4, "router": "prefix_aware"}],
            "workload": {"arrival": {"kind": "trace", "path": path, "limit": 1000}},
        }
    )
    res = simulate(scn)
    assert 0.0 < res.summary["prefix_cache_hit_rate"] < 1.0
    check_invariants(res)
