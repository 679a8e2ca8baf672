"""Every shipped example scenario loads, runs, and keeps the invariants."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.run import simulate
from simulator.scenario import load_scenario
from tests.conftest import REPO, SHARED
from tests.test_invariants import check_invariants


def _is_plan_request(path: Path) -> bool:
    """Plan requests (``epdsim plan``) list GPU offers instead of pools; tests/test_plan.py runs them."""
    data = yaml.safe_load(path.read_text())
    return "gpus" in data and "pools" not in data


EXAMPLES = sorted(p for p in (REPO / "examples").glob("*.yaml") if not _is_plan_request(p))


def test_there_are_examples():
    assert len(EXAMPLES) >= 4


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs(path: Path):
    if "shared/data" in path.read_text() and not SHARED.is_dir():
        pytest.skip("example replays a trace from ../shared, which is absent")
    scn = load_scenario(path)
    res = simulate(scn)
    s = res.summary
    assert s["completed"] + s["rejected"] == s["requests"] and s["unfinished"] == 0
    assert s["completed"] >= 0.99 * s["requests"]
    assert 0 < s["ttft_s"]["p50"] <= s["ttft_s"]["p99"]
    assert 0 < s["tpot_s"]["p50"] < 1.0
    assert 0.0 <= s["slo_attainment"] <= 1.0
    assert s["cost_usd_per_hour"] > 0 and s["output_tokens_per_s"] > 0
    check_invariants(res)
