"""Kubernetes pod lifecycle (simulator/ops/k8s.py): the seed's crash loop and its fixes."""

from __future__ import annotations

import argparse

import pytest
import yaml
from rich.console import Console

import hwdb
from simulator.cli.ops import add_subparsers
from simulator.ops.coldstart import Breakdown, Phase, breakdown
from simulator.ops.k8s import recommend_probes, simulate_pod
from simulator.ops.probe_spec import PodSpec, Probe, ProbeError
from simulator.scenario import PoolConfig, deployment_for

HORIZON = 1800.0  # 30 minutes


@pytest.fixture(scope="module")
def dep70():
    db = hwdb.load()
    return deployment_for(PoolConfig(gpu="H100", tp=8), db.model("Llama-3.1-70B"), db)


@pytest.fixture(scope="module")
def cold(dep70):
    return breakdown(dep70, "miss", "nvme")


@pytest.fixture(scope="module")
def warm(dep70):
    return breakdown(dep70, "hit", "nvme")


def common_probes(delay: int, volume: bool = False) -> PodSpec:
    """Liveness and readiness as charts commonly set them: delay 30-60 s, period 10 s, 3 failures."""
    return PodSpec(liveness=Probe(delay, 10, 1, 3), readiness=Probe(delay, 10, 1, 3), compile_cache_volume=volume)


def elapsed_at(bd: Breakdown, phase: str) -> float:
    """Seconds from container start to the end of ``phase``."""
    t = 0.0
    for p in bd.container_phases():
        t += p.seconds
        if p.name == phase:
            return t
    raise KeyError(phase)


# ---- (a) the seed's crash loop -----------------------------------------------------------------


@pytest.mark.parametrize("delay", [30, 60])
def test_default_liveness_probe_crash_loops_70b_cold_compile(cold, warm, delay):
    res = simulate_pod(cold, common_probes(delay), warm, horizon_s=HORIZON)
    assert res.never_ready
    assert res.restarts >= 3
    assert res.backoffs_s[:5] == [10, 20, 40, 80, 160]
    assert max(res.backoffs_s) <= 300 and res.backoffs_s[-1] == 300
    killed = [a for a in res.attempts if a.outcome == "killed"]
    assert len(killed) == res.restarts
    # each attempt dies at the third failed probe: initialDelay + 2 periods after the container started
    assert all(a.ended_s - a.started_s == delay + 20 for a in killed)
    assert all(a.killed_by == "liveness" and a.phase in ("p2p_check", "weights", "dynamo", "compile") for a in killed)
    assert "liveness probe killed the container during" in res.reason
    assert "CrashLoopBackOff" in res.reason


def test_recommended_startup_probe_gets_ready_within_one_period(cold, warm):
    rec = recommend_probes(cold, margin=0.5)
    assert rec.budget_s >= 1.5 * cold.container_s
    res = simulate_pod(cold, rec.pod_spec(), warm, horizon_s=HORIZON)
    assert res.restarts == 0
    assert res.serving_s == pytest.approx(cold.total_s)
    assert 0 <= res.ready_s - cold.total_s < rec.startup.period_s


def test_recommended_probe_with_image_pull(dep70):
    bd = breakdown(dep70, "miss", "nfs", image_cached=False)
    rec = recommend_probes(bd)
    assert rec.basis_s == pytest.approx(bd.container_s)  # probes never see the pull
    res = simulate_pod(bd, rec.pod_spec(), horizon_s=HORIZON)
    assert res.restarts == 0 and 0 <= res.ready_s - bd.total_s < rec.startup.period_s


def test_recommended_yaml_is_a_probe_spec(cold):
    rec = recommend_probes(cold, margin=0.5)
    spec = yaml.safe_load(rec.yaml)
    s = spec["startupProbe"]
    assert set(spec) == {"startupProbe", "livenessProbe", "readinessProbe"}
    assert s["httpGet"] == {"path": "/health", "port": 8000} and s["successThreshold"] == 1
    assert s["timeoutSeconds"] < s["periodSeconds"]
    assert s["periodSeconds"] * (s["failureThreshold"] - 1) >= 1.5 * cold.container_s
    assert "margin 50%" in rec.yaml
    with pytest.raises(ProbeError, match="margin=-0.1"):
        recommend_probes(cold, margin=-0.1)


# ---- (b) a compile cache on a volume ------------------------------------------------------------


def test_warm_cache_shortens_start_by_breakdown_difference(cold, warm):
    rec = recommend_probes(cold)
    a = simulate_pod(cold, rec.pod_spec(), horizon_s=HORIZON)
    b = simulate_pod(warm, rec.pod_spec(), horizon_s=HORIZON)
    assert a.serving_s - b.serving_s == pytest.approx(cold.total_s - warm.total_s, abs=1e-9)
    assert cold.total_s - warm.total_s == pytest.approx(
        sum(cold.seconds(n) - warm.seconds(n) for n in ("compile", "kv_profile", "jit_kernels"))
    )


def test_volume_does_not_rescue_default_probes_for_70b(cold, warm):
    """The kill (50 s) comes before torch.compile ends (~127 s): no attempt ever writes the cache."""
    assert 30 + 20 < elapsed_at(cold, "compile")
    res = simulate_pod(cold, common_probes(30, volume=True), warm, horizon_s=HORIZON)
    assert res.never_ready and res.restarts >= 3
    assert all(a.compile_cache == "miss" for a in res.attempts)
    assert "never got a finished compile" in res.reason


def test_volume_rescues_a_probe_that_kills_after_compile(cold, warm):
    """Liveness gives up at 130 s: after the cold compile ends, before the cold start does, after a warm one.

    Without the volume every attempt recompiles and dies at 130 s; with it the
    first attempt leaves a warm cache and the second becomes ready.
    """
    probe = Probe(120, 10, 1, 2)  # decisive failure at 120 + 10 = 130 s
    kill = probe.give_up_after_s
    assert elapsed_at(cold, "compile") < kill < cold.container_s and warm.container_s <= probe.initial_delay_s
    spec = dict(liveness=probe, readiness=Probe(30, 10, 1, 3))
    without = simulate_pod(cold, PodSpec(**spec), warm, horizon_s=HORIZON)
    assert without.never_ready and without.restarts >= 3
    with_vol = simulate_pod(cold, PodSpec(**spec, compile_cache_volume=True), warm, horizon_s=HORIZON)
    assert with_vol.restarts == 1 and with_vol.backoffs_s == [10]
    second = with_vol.attempts[1]
    assert second.compile_cache == "hit" and second.started_s == kill + 10
    assert with_vol.serving_s == pytest.approx(second.started_s + warm.container_s)
    assert 0 <= with_vol.ready_s - with_vol.serving_s < 10


# ---- other semantics ----------------------------------------------------------------------------


def test_backoff_resets_after_ten_minutes_of_running():
    long = Breakdown((Phase("process_start", 10), Phase("compile", 900), Phase("api_ready", 1)), "miss", "nvme", True)
    res = simulate_pod(long, PodSpec(startup=Probe(0, 10, 5, 66)), horizon_s=3000)  # gives up at 650 s
    assert res.never_ready and res.restarts >= 3
    assert set(res.backoffs_s) == {10}


def test_without_readiness_probe_pod_is_ready_too_early(cold):
    res = simulate_pod(cold, PodSpec(), horizon_s=HORIZON)
    assert res.ready_s == 0 and res.serving_s == pytest.approx(cold.total_s)
    assert res.warnings and "readinessProbe" in res.warnings[0]


def test_ready_without_readiness_probe_is_lost_when_killed(cold):
    res = simulate_pod(cold, PodSpec(liveness=Probe(30, 10, 1, 3)), horizon_s=HORIZON)
    assert res.never_ready and res.restarts >= 3 and res.serving_s is None
    assert "readinessProbe" in res.warnings[0] and len(res.warnings) == 1


def test_startup_probe_holds_liveness_off(cold):
    spec = PodSpec(startup=Probe(0, 10, 5, 40), liveness=Probe(0, 10, 1, 1))
    res = simulate_pod(cold, spec, horizon_s=HORIZON)
    assert res.restarts == 0 and res.ready_s is not None
    too_short = simulate_pod(cold, PodSpec(startup=Probe(0, 10, 5, 6)), horizon_s=HORIZON)
    assert too_short.never_ready and too_short.attempts[0].killed_by == "startup"
    assert too_short.attempts[0].ended_s == 50


# ---- (d) bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(period_s=-10), r"probe\.periodSeconds=-10 is invalid.*>= 1.*Fix: set periodSeconds"),
        (dict(period_s=0), r"periodSeconds=0"),
        (dict(period_s=10, timeout_s=10), r"timeoutSeconds=10 must be less than periodSeconds=10.*Fix: lower"),
        (dict(period_s=5, timeout_s=8), r"timeoutSeconds=8 must be less than periodSeconds=5"),
        (dict(failure_threshold=0), r"failureThreshold=0 is invalid.*>= 1.*Fix: set failureThreshold"),
        (dict(initial_delay_s=-1), r"initialDelaySeconds=-1 is invalid"),
        (dict(timeout_s=0), r"timeoutSeconds=0 is invalid"),
        (dict(period_s=2.5), r"periodSeconds=2.5 is invalid: Kubernetes takes a whole number"),
        (dict(success_threshold=2), r"successThreshold=2"),
    ],
)
def test_bad_probe_settings_name_field_value_and_fix(kw, match):
    with pytest.raises(ProbeError, match=match):
        Probe(**kw)


def test_podspec_names_probes_by_kubernetes_field():
    spec = PodSpec(startup=Probe(), liveness=Probe(), readiness=Probe())
    assert (spec.startup.name, spec.liveness.name, spec.readiness.name) == (
        "startupProbe",
        "livenessProbe",
        "readinessProbe",
    )


def _cli(argv, capsys, width=200):
    p = argparse.ArgumentParser(prog="epdsim")
    sub = p.add_subparsers(dest="cmd", required=True)
    add_subparsers(sub)
    try:
        args = p.parse_args(argv)
    except SystemExit as exc:  # argparse refused a flag's value (range-checked options)
        return exc.code, capsys.readouterr()
    rc = args.func(args, Console(width=width))
    return rc, capsys.readouterr()


@pytest.mark.parametrize(
    "flags, field",
    [
        (["--liveness-period", "-5"], "--liveness-period: -5 is out of range"),
        (["--readiness-timeout", "10"], "readinessProbe.timeoutSeconds=10 must be less than periodSeconds=10"),
        (["--liveness-failure-threshold", "0"], "--liveness-failure-threshold: 0 is out of range"),
        (["--startup-probe", "0,10,5"], "--startup-probe='0,10,5' is not understood"),
    ],
)
def test_cli_probe_errors_are_one_paragraph(capsys, flags, field):
    rc, out = _cli(["probes", "Llama-3.1-8B", "--gpu", "H100", *flags], capsys)
    assert rc == 2 and field in out.err and "Traceback" not in out.err
    # One paragraph: the command's own message, or argparse's usage line then its one-line error.
    assert any(field in line for line in out.err.strip().splitlines()[-1:])


def test_cli_coldstart_and_probes(capsys):
    rc, out = _cli(["coldstart", "Llama-3.1-70B", "--gpu", "H100", "--tp", "8", "--storage", "nfs"], capsys)
    assert rc == 0 and "CUDA-graph capture" in out.out and "weights from nfs" in out.out
    rc, out = _cli(["probes", "Llama-3.1-70B", "--gpu", "H100", "--tp", "8"], capsys, width=60)
    assert rc == 0 and "never ready" in " ".join(out.out.split())
    snippet = yaml.safe_load(out.out[out.out.index("# Llama-3.1-70B") :])  # not wrapped on a narrow terminal
    assert set(snippet) == {"startupProbe", "livenessProbe", "readinessProbe"}
    rc, out = _cli(["probes", "Llama-3.1-70B", "--gpu", "H100", "--tp", "8", "--startup-probe"], capsys)
    assert rc == 0 and "ready at" in out.out and "never ready" not in out.out
    rc, out = _cli(["coldstart", "Llama-3.1-8B", "--gpu", "H100", "--storage", "floppy"], capsys)
    assert rc == 2 and "unknown storage 'floppy'" in out.err
