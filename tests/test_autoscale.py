"""Autoscaling (simulator/ops/autoscale.py, simulator/engine/opsengine.py, opsobserve.py): a step in load, start
delays, drains, GPU-hours."""

from __future__ import annotations

import math
import typing

import pandas as pd
import pytest

from simulator.cli import main
from simulator.engine.opsobserve import pool_context
from simulator.ops.autoscale import PoolContext, instance_capacity
from simulator.ops.opsstart import StartTimes
from simulator.ops.opsstart import start_times as _start_times
from simulator.resolved import resolve
from simulator.roles import ROLES
from simulator.run import simulate
from simulator.scenario import PoolConfig, ScenarioError, load_scenario
from tests.conftest import REPO, pool, scenario
from tests.test_invariants import util_for_kv_tokens

STEP_AT = 60.0
INTERVAL = 5.0


def step_scenario(
    provisioning_s: float = 20.0,
    policy: str = "queue",
    cache: str = "none",
    after: float = 16.0,
    duration_s: float = 260.0,
    stabilization_s: float = 600.0,
    shape=None,
    **auto,
):
    """8B on H100 capped at 8 running sequences (~10 req/s); load steps from 2 to ``after`` req/s at 60 s."""
    ops = {
        "autoscale": {
            "main": {
                "policy": policy,
                "min_instances": 1,
                "max_instances": 6,
                "interval_s": INTERVAL,
                "scale_down_stabilization_s": stabilization_s,
                **auto,
            }
        },
        "startup": {"provisioning_s": provisioning_s, "image_cached": True, "compile_cache": cache},
    }
    return scenario(
        pools=pool(engine={"max_num_seqs": 8}),
        operations=ops,
        slo={"ttft_s": 1.0},
        workload={
            "arrival": {
                "kind": "shaped",
                "shape": shape or {"kind": "step", "before": 2, "after": after, "at_s": STEP_AT},
            },
            "input_length": {"kind": "fixed", "value": 512},
            "output_length": {"kind": "fixed", "value": 128},
            "duration_s": duration_s,
        },
    )


def start_times(scn) -> StartTimes:
    pools = resolve(scn).pools
    return _start_times(pools[0].dep, scn.operations.startup)


def violation_window(res) -> float:
    first, last = res.summary["operations"]["slo_violation_arrivals_s"]
    return last - first


@pytest.fixture(scope="module")
def step_runs():
    return {p: simulate(step_scenario(p)) for p in (20.0, 80.0)}


def test_ttft_violations_last_as_long_as_provisioning_plus_cold_start(step_runs):
    for prov, res in step_runs.items():
        ops = res.summary["operations"]
        delay = start_times(step_scenario(prov)).new_delay()
        assert delay == pytest.approx(prov + start_times(step_scenario(0.0)).new.ready_s)
        first, last = ops["slo_violation_arrivals_s"]
        # Violations start right after the step and stop once the ordered capacity serves:
        # detection (at most one interval, plus the queue reaching the target) + provisioning + cold start.
        assert STEP_AT <= first < STEP_AT + INTERVAL
        assert delay <= last - first <= delay + 3 * INTERVAL
        su = ops["scale_ups"][0]
        assert STEP_AT < su["decided_s"] <= STEP_AT + 2 * INTERVAL
        assert su["serving_s"] - su["decided_s"] == pytest.approx(delay)
        assert ops["slo_violations_during_scale_up"] >= 0.9 * ops["slo_violations"]
    # The relation itself: 60 s more provisioning, 60 s more violations (within one interval).
    grow = violation_window(step_runs[80.0]) - violation_window(step_runs[20.0])
    assert grow == pytest.approx(60.0, abs=INTERVAL)


def test_persistent_compile_cache_shortens_scale_up_by_the_compile_phase(step_runs):
    """Must-show 2 in the autoscaler: new pods that find vLLM's compile cache on a persistent volume."""
    cold, warm = start_times(step_scenario(20.0)), start_times(step_scenario(20.0, cache="persistent"))
    saved = cold.new_delay() - warm.new_delay()
    bd_c, bd_w = cold.new_breakdown, warm.new_breakdown
    phases = (bd_c.seconds("compile") - bd_w.seconds("compile")) + (
        bd_c.seconds("kv_profile") - bd_w.seconds("kv_profile")
    )
    assert phases > 5.0
    period = cold.pod_spec.startup.period_s  # Ready comes at the first startup probe after the API answers
    assert abs(saved - phases) < period
    res = simulate(step_scenario(20.0, cache="persistent"))
    su = res.summary["operations"]["scale_ups"][0]
    assert su["serving_s"] - su["decided_s"] == pytest.approx(warm.new_delay())
    assert violation_window(res) < violation_window(simulate(step_scenario(20.0)))


def test_scale_down_drains_before_removal_and_loses_nothing():
    # the high load lasts past the scale-up's cold start (~80 s for 8B on H100 with capture and kernel JIT)
    scn = step_scenario(
        10.0,
        duration_s=300.0,
        stabilization_s=20.0,
        shape={"kind": "piecewise", "times_s": (0, 40, 41, 190, 191), "rates": (2, 2, 16, 16, 1)},
    )
    res = simulate(scn)
    ops = res.summary["operations"]
    removed = [i for i in ops["instances"] if i["end"] == "removed"]
    assert removed, "the load drop must remove instances"
    assert res.summary["completed"] == res.summary["requests"] and ops["failed"] == 0
    steps = res.steps
    for life in removed:
        mine = steps[steps["instance"] == life["instance"]]
        assert len(mine) > 0
        # Drained: its last step ended before it was removed, and it had nothing left.
        assert (mine["start_s"] + mine["duration_s"]).max() <= life["ended_s"] + 1e-9
        req = res.requests[res.requests["instance"] == life["instance"]]
        assert (req["finish_s"] <= life["ended_s"] + 1e-9).all()
    assert any(e["action"] == "scale-down" for e in ops["events"])


def test_gpu_hours_closed_form_without_scaling():
    """Load far below capacity: no scaling; GPU-hours = instances x GPUs x run time."""
    scn = scenario(
        pools=pool(instances=2), operations={"autoscale": {"main": {"min_instances": 2, "max_instances": 4}}}
    )
    res = simulate(scn)
    ops = res.summary["operations"]
    assert ops["scale_ups"] == [] and ops["wasted_gpu_s"] == 0
    assert ops["gpu_hours"] == pytest.approx(2 * 1 * ops["end_s"] / 3600.0)
    assert ops["cost_usd"] == pytest.approx(ops["gpu_hours"] * res.summary["cost_usd_per_hour"] / 2)


def test_gpu_hours_add_up_over_incarnations(step_runs):
    res = step_runs[20.0]
    ops = res.summary["operations"]
    total = sum(i["gpus"] * (i["ended_s"] - i["billed_s"]) for i in ops["instances"]) / 3600.0
    assert ops["gpu_hours"] == pytest.approx(total)
    # starting time is billed: provisioning is not, the cold start is
    start = start_times(step_scenario(20.0)).new.ready_s
    n_new = sum(1 for i in ops["instances"] if i["cause"] == "scale-up")
    assert ops["starting_gpu_s"] == pytest.approx(n_new * start)


def test_kv_policy_scales_a_kv_bound_pool():
    engine = {"max_num_seqs": 256, "max_model_len": 4096}
    engine["gpu_memory_utilization"] = util_for_kv_tokens(20000, engine)
    ops = {
        "autoscale": {"main": {"policy": "kv", "target_kv": 0.5, "max_instances": 4, "interval_s": 5}},
        "startup": {"image_cached": True},
    }
    scn = scenario(
        pools=pool(engine=engine),
        operations=ops,
        workload={
            "arrival": {"kind": "poisson", "rate": 6.0},
            "input_length": {"kind": "fixed", "value": 1024},
            "output_length": {"kind": "fixed", "value": 256},
            "num_requests": 600,
        },
    )
    ops_out = simulate(scn).summary["operations"]
    assert ops_out["scale_ups"] and ops_out["peak_instances"]["main"] > 1


def test_slo_policy_sizes_prefill_and_decode_separately():

    def pd(inp, out):
        auto = {"policy": "slo", "max_instances": 8, "interval_s": 10, "window_s": 20}
        pools = [
            {"name": "prefill", "role": "prefill", "gpu": "H100", "instances": 1},
            {"name": "decode", "role": "decode", "gpu": "H100", "instances": 1},
        ]
        return scenario(
            pools=pools,
            kv_transfer={"fabric": "ib-ndr"},
            slo={"tpot_s": 0.02},
            operations={"autoscale": {"prefill": auto, "decode": auto}, "startup": {"image_cached": True}},
            workload={
                "arrival": {"kind": "poisson", "rate": 8.0},
                "num_requests": 1200,
                "input_length": {"kind": "fixed", "value": inp},
                "output_length": {"kind": "fixed", "value": out},
            },
        )

    long_prompts = pd(8000, 16)
    short_prompts = pd(128, 1024)
    # the capacity model itself: prefill-heavy work loads prefill instances, decode-heavy work decode ones
    pools = resolve(long_prompts).pools
    ctx = {r.name: pool_context(r.pool, r.dep, r.memory, r.step, 0.02) for r in pools}
    assert instance_capacity(ctx["prefill"], 8000, 16) < instance_capacity(ctx["decode"], 8000, 16)
    assert instance_capacity(ctx["prefill"], 128, 1024) > instance_capacity(ctx["decode"], 128, 1024)
    a = simulate(long_prompts).summary["operations"]["peak_instances"]
    b = simulate(short_prompts).summary["operations"]["peak_instances"]
    assert a["prefill"] > a["decode"]
    assert b["decode"] > b["prefill"]


# ---- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ops, match",
    [
        ({"autoscale": {"main": {"min_instances": 5, "max_instances": 2}}}, "min_instances=5 exceeds max_instances=2"),
        ({"autoscale": {"main": {"policy": "magic"}}}, "policy='magic' is unknown"),
        ({"autoscale": {"nope": {}}}, "no pool is named 'nope'"),
        ({"autoscale": {"main": {"min_instances": 2}}}, r"instances=1, outside \[min_instances=2"),
        ({"autoscale": {"main": {"interval_s": -5}}}, "interval_s"),
        (
            {"startup": {"probes": "given", "liveness": {"initial_delay_s": -30}}},
            r"liveness.initial_delay_s: .*from 0 to 86400 s; set initialDelaySeconds .*\(got -30\)",
        ),
        (
            {"startup": {"probes": "given", "startup_probe": {"period_s": 5, "timeout_s": 10}}},
            "timeoutSeconds=10 must be less than periodSeconds=5",
        ),
        (
            {"startup": {"probes": "given", "readiness": {"failure_threshold": 0}}},
            r"readiness.failure_threshold: .*from 1 to 10000 probes; set failureThreshold",
        ),
        ({"startup": {"liveness": {"period_s": 10}}}, "probes='recommended' ignores them"),
        ({"faults": {"link_degradation": {"mtbf_s": 10, "duration_s": 1, "bandwidth_factor": 0.5}}}, "one pool"),
        ({"faults": {"node_failure": {"mtbf_s": 0}}}, "mtbf_s"),
        ({"retry": {"policy": "pray"}}, "policy"),
    ],
)
def test_bad_operations_are_clear_errors(ops, match):
    with pytest.raises(ScenarioError, match=match) as exc:
        scenario(operations=ops)
    assert "operations" in str(exc.value)
    assert "Traceback" not in str(exc.value)


def test_cli_bad_operations_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "model: Llama-3.1-8B\npools: [{gpu: H100}]\n"
        "workload: {arrival: {kind: poisson, rate: 1}, input_length: {kind: fixed, value: 8},"
        " output_length: {kind: fixed, value: 8}, num_requests: 5}\n"
        "operations: {autoscale: {main: {min_instances: 3, max_instances: 2}}}\n"
    )
    assert main(["simulate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "min_instances=3 exceeds max_instances=2" in err and "Traceback" not in err


def test_unstartable_pods_never_serve_and_are_reported():
    """Probes that kill the cold start: ordered capacity never arrives but is billed."""
    scn = step_scenario(0.0, duration_s=150.0)
    startup = {
        "probes": "given",
        "liveness": {"initial_delay_s": 10, "period_s": 5, "failure_threshold": 1},
        "image_cached": True,
    }
    scn = scenario(
        pools=pool(engine={"max_num_seqs": 8}),
        slo={"ttft_s": 1.0},
        operations={"autoscale": scn.operations.model_dump()["autoscale"], "startup": startup},
        workload=scn.workload.model_dump(mode="json"),
        simulation={"max_time_s": 400},
    )
    res = simulate(scn)
    ops = res.summary["operations"]
    started = [i for i in ops["instances"] if i["cause"] == "scale-up"]
    assert started and all(i["ready_s"] is None for i in started)
    assert all(i["end"].startswith("never ready: liveness probe killed") for i in started)
    assert ops["peak_instances"]["main"] == 1
    assert ops["starting_gpu_s"] > 0 and math.isclose(ops["wasted_gpu_s"], ops["starting_gpu_s"])


def test_cli_prints_the_operations_table(tmp_path, capsys):
    scn = tmp_path / "ops.yaml"
    scn.write_text(
        "model: Llama-3.1-8B\npools: [{gpu: H100, engine: {max_num_seqs: 8}}]\n"
        "workload: {arrival: {kind: shaped, shape: {kind: step, before: 2, after: 16, at_s: 20}},"
        " input_length: {kind: fixed, value: 512}, output_length: {kind: fixed, value: 64},"
        " duration_s: 120}\nslo: {ttft_s: 1.0}\n"
        "operations: {startup: {image_cached: true}, autoscale: {main: {interval_s: 5}}}\n"
    )
    assert main(["simulate", str(scn), "--out", str(tmp_path / "out"), "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert "operations" in out and "scale-ups" in out and "GPU-hours" in out
    req = pd.read_csv(tmp_path / "out" / "requests.csv")
    assert {"retries", "discarded_tokens", "outcome", "reason"} <= set(req.columns)


def test_roles_are_one_registry_that_the_scenario_and_the_capacity_read():
    """Every role a scenario may name is a registered :class:`simulator.roles.Role`; an instance's
    capacity counts the work of its role: prefill and decode capacities combine harmonically into the
    colocated one (a request costs its prefill plus its decode)."""
    assert set(typing.get_args(PoolConfig.model_fields["role"].annotation)) == set(ROLES)
    rs = resolve(load_scenario(REPO / "examples" / "llama8b_h100_chat.yaml"))
    pool = rs.pools[0]
    k = pool.dep.knobs
    cap = {
        r: instance_capacity(
            PoolContext(r, pool.step, k.max_num_seqs, k.max_num_batched_tokens, pool.memory.kv_tokens, None), 1000, 200
        )
        for r in ("colocated", "prefill", "decode")
    }
    assert cap["prefill"] > cap["colocated"] and cap["decode"] > cap["colocated"]
    assert 1 / cap["colocated"] == pytest.approx(1 / cap["prefill"] + 1 / cap["decode"], rel=1e-12)
