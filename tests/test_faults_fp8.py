"""FP8 activation-outlier crashes (simulator/ops/faults.py, opscrash.py): the hazard's defaults and where they
load from, crashes only on FP8 pools, long-context shares raising failures, retries turning failures into
latency (must-show 4), and a crashed instance's restart through the cold-start model."""

from __future__ import annotations

import numpy as np
import pytest

import hwdb
from simulator.ops.faults import FP8_NAME, fp8_defaults
from simulator.ops.opsstart import start_times
from simulator.resolved import resolve
from simulator.run import simulate
from tests.conftest import pool, scenario
from tests.fault_runs import run_objects


def fp8_scenario(long_share: float, policy: str = "none", seed: int = 1, rate_per_token_s: float = 5e-7):
    """4 FP8 instances of 8B on H100 at 15 req/s (busy, not overloaded: at 20 req/s the queues grow with
    the per-layer step overhead and every crash takes the whole queue); a share of prompts is 6,000
    tokens, the rest 512."""
    ten = int(round(10 * long_share))
    return scenario(
        seed=seed,
        pools=pool(instances=4, dtype="fp8", engine={"max_num_seqs": 32}),
        operations={
            "faults": {"fp8_crash": {"rate_per_token_s": rate_per_token_s, "onset_tokens": 2048}},
            "retry": {"policy": policy, "max_retries": 3},
            "startup": {"image_cached": True, "compile_cache": "pod"},
        },
        workload={
            "arrival": {"kind": "poisson", "rate": 15.0},
            "input_length": {"kind": "empirical", "values": [512] * (10 - ten) + [6000] * ten},
            "output_length": {"kind": "fixed", "value": 400},
            "num_requests": 1500,
        },
    )


# ---- the hazard: off when not configured, its defaults, only FP8 pools --------------------------


def test_no_faults_configured_no_request_fails():
    res = simulate(scenario(**{**fp8_scenario(0.5).model_dump(mode="json"), "operations": {}}))
    assert "operations" not in res.summary  # a static run: no lifecycle
    assert set(res.requests["outcome"].astype(str)) == {"completed"}
    zero = simulate(fp8_scenario(0.5, rate_per_token_s=0.0)).summary["operations"]
    assert zero["failed"] == 0 and zero["crashes"] == 0


def test_fp8_hazard_defaults_carry_a_source():
    hz = fp8_defaults()
    assert hz.rate_per_token_s > 0 and hz.onset_tokens > 0
    assert "assumption" in hz.source and hz.source.startswith(f"{FP8_NAME}.yaml: ")


def test_fp8_hazard_defaults_load_by_the_hwdb_rules(tmp_path):
    """A user folder's faults/ entry of the same name replaces the shipped one, as any hwdb entry does; a
    malformed one and a missing folder are refused with hwdb's messages."""
    (tmp_path / "faults").mkdir()
    mine = tmp_path / "faults" / "mine.yaml"
    mine.write_text(
        f"name: {FP8_NAME}\nrate_per_token_s: {{value: 1.0e-7, source: my fleet's crash logs}}\n"
        "onset_tokens: {value: 4096, source: my fleet}\n"
    )
    hz = fp8_defaults([tmp_path])
    assert (hz.rate_per_token_s, hz.onset_tokens) == (1e-7, 4096) and hz.source == "mine.yaml: my fleet's crash logs"
    assert fp8_defaults().rate_per_token_s != 1e-7
    mine.write_text(f"name: {FP8_NAME}\nrate_per_token_s: {{value: 1.0e-7, source: logs}}\n")
    with pytest.raises(hwdb.HwdbError, match=r"mine\.yaml: invalid hardware file:\n  field 'onset_tokens'"):
        fp8_defaults([tmp_path])
    with pytest.raises(hwdb.HwdbError, match="does not exist"):
        fp8_defaults([tmp_path / "nowhere"])


def test_fp8_crash_hits_only_fp8_pools():
    scn = fp8_scenario(0.5, rate_per_token_s=1e-5)
    bf16 = scenario(
        **{
            **{k: v for k, v in scn.model_dump().items() if k != "pools"},
            "pools": pool(instances=4, engine={"max_num_seqs": 32}),
        }
    )
    assert simulate(bf16).summary["operations"]["crashes"] == 0


# ---- must-show 4: long context raises failures; retries turn failures into latency -----------

# One realisation per setting: at a 10% long share a run expects about one crash, so some seeds have
# none (seed 1 and 4 of the faults stream do); seed 3 shows crashes at both shares.
RUNS_SEED = 3


@pytest.fixture(scope="module")
def fp8_runs():
    return {
        (share, pol): simulate(fp8_scenario(share, pol, RUNS_SEED)) for share in (0.1, 0.5) for pol in ("none", "retry")
    } | {(0.5, "reprefill"): simulate(fp8_scenario(0.5, "reprefill", RUNS_SEED))}


def test_long_context_share_raises_fp8_failures():
    """Crashes are rare at a 10 % long-prompt share (0-2 a run, ~0.75 on average), so the two shares are
    compared over eight seeds: one seed can see none, eight all see none with probability ~0.3 %."""
    totals = {}
    for share in (0.1, 0.5):
        ops = [simulate(fp8_scenario(share, "none", seed)).summary["operations"] for seed in range(1, 9)]
        totals[share] = (
            sum(o["failed"] for o in ops),
            sum(o["crashes"] for o in ops),
            float(np.mean([o["availability"] for o in ops])),
        )
    (lo_failed, lo_crashes, lo_avail), (hi_failed, hi_crashes, hi_avail) = totals[0.1], totals[0.5]
    assert hi_failed > lo_failed > 0
    assert hi_crashes >= lo_crashes >= 1
    assert hi_avail < lo_avail < 1.0


def test_retries_convert_failures_into_latency(fp8_runs):
    none, retry, repre = (fp8_runs[(0.5, p)] for p in ("none", "retry", "reprefill"))
    n, r, rp = (x.summary["operations"] for x in (none, retry, repre))
    assert r["failed"] < n["failed"] and rp["failed"] < n["failed"]
    assert r["retried_requests"] > 0 and rp["retried_requests"] > 0
    for res in (retry, repre):
        # Not compared with the no-retry run's mean E2E: with multi-minute restarts the survivors of that
        # run queue behind the lost capacity, so its mean can be the larger; the latency a retry adds shows
        # on the retried requests themselves.
        retried = res.requests[(res.requests["retries"] > 0) & (res.requests["outcome"] == "completed")]
        others = res.requests[(res.requests["retries"] == 0) & (res.requests["outcome"] == "completed")]
        assert retried["e2e_s"].mean() > others["e2e_s"].mean()
    # retry throws away what was streamed; re-prefill keeps it
    assert r["discarded_tokens"] > 0 and rp["discarded_tokens"] == 0


def test_failed_requests_name_their_crash(fp8_runs):
    req = fp8_runs[(0.5, "none")].requests
    failed = req[req["outcome"] == "failed"]
    assert len(failed) and failed["reason"].str.contains("FP8 activation-outlier crash").all()
    ex = fp8_runs[(0.5, "retry")].requests
    gave_up = ex[ex["outcome"] == "failed"]
    assert gave_up["reason"].str.startswith("retries exhausted (3)").all()


# ---- restarts through the cold-start and probe model --------------------------------------------


def test_crashed_instance_restarts_after_backoff_plus_its_start():
    scn = fp8_scenario(0.5, rate_per_token_s=2e-6)
    ops, run, _ = run_objects(scn)
    st = resolve(scn).pools[0].starts
    assert st.describe() == start_times(resolve(scn).pools[0].dep, scn.operations.startup).describe()
    assert st.restart_breakdown.compile_cache == "hit"  # compile_cache: pod
    crashed = {(c["instance"], c["time_s"]) for c in ops.crashes}
    assert crashed
    restarts = [i for i in ops.front.all if i.life.cause == "restart" and i.life.ready_s is not None]
    assert restarts
    for inst in restarts:
        assert any(abs(t - inst.life.billed_s) < 1e-9 for _, t in crashed)
        assert inst.life.ready_s - inst.life.billed_s >= 10.0 + st.restart_delay() - 1e-9
        start = inst.life.ready_s - inst.life.billed_s - st.restart_delay()
        assert (
            start in (10.0, 20.0, 40.0, 80.0, 160.0, 300.0)
            or np.isclose([start], [10.0, 20.0, 40.0, 80.0, 160.0, 300.0]).any()
        )
