"""Kubernetes pod lifecycle of one serving instance: probes, restarts, CrashLoopBackOff.

A SimPy simulation of one pod with ``restartPolicy: Always``.  The image is
pulled once (before the first container start; probes do not see it), then
each container attempt runs the cold-start phases of a
:class:`simulator.ops.coldstart.Breakdown` in order.  The probes' HTTP endpoint
answers only once the API server is up (before that the port is closed and a
probe fails at once, so ``timeoutSeconds`` never elapses here; it matters for
a hung server, which this model does not produce).

Probe semantics (Kubernetes documentation, "Configure Liveness, Readiness and
Startup Probes" and "Pod Lifecycle"):

* a probe first runs ``initialDelaySeconds`` after its gate, then every
  ``periodSeconds``; ``successThreshold`` is 1;
* the gate is the container start for the startup probe, and for liveness and
  readiness too when there is no startup probe; with a startup probe they are
  held off until it succeeds (their delays count from that moment);
* ``failureThreshold`` consecutive failures of the startup or liveness probe
  kill the container; the kubelet restarts it after a back-off of 10 s, 20 s,
  40 s ... capped at 300 s (CrashLoopBackOff), reset once a container ran 10
  minutes;
* readiness gates traffic: the pod is Ready at the first readiness success;
  without a readiness probe it is Ready as soon as the container has started
  (and the startup probe, if any, succeeded), even if the server does not
  answer yet (reported as a warning);
* a restarted container starts from the image again: vLLM's torch.compile cache
  (``~/.cache/vllm/torch_compile_cache``) is lost unless it is on a volume
  (``compile_cache_volume``; a pod-lifetime ``emptyDir`` is enough for
  restarts).  vLLM writes it when a compile completes, so the cache is warm
  for later attempts only after one attempt finished the compile phase.

Ties: a probe at the very instant the server comes up succeeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import simpy
import yaml

from simulator.ops.coldstart import PHASE_LABELS, Breakdown
from simulator.ops.probe_spec import PodSpec, Probe, ProbeError


@dataclass
class Attempt:
    """One container run."""

    index: int
    started_s: float
    compile_cache: str
    needs_s: float  # container start -> API answers
    ended_s: float | None = None
    outcome: str = "running"  # running | serving | killed
    killed_by: str | None = None
    phase: str = ""
    phase_started_s: float = 0.0
    api_up_s: float | None = None
    alive: bool = True

    @property
    def planned_up_s(self) -> float:
        return self.started_s + self.needs_s


@dataclass
class PodResult:
    """What happened to the pod within the horizon (times in seconds from pod creation)."""

    horizon_s: float
    ready_s: float | None = None  # Ready condition: traffic starts
    serving_s: float | None = None  # the API answers (attempt that got ready)
    restarts: int = 0
    backoffs_s: list[float] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    events: list[tuple[float, str]] = field(default_factory=list)
    reason: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def never_ready(self) -> bool:
        return self.ready_s is None

    def summary(self) -> str:
        if self.ready_s is not None:
            s = f"ready at {self.ready_s:.0f} s after {self.restarts} restart{'s' * (self.restarts != 1)}"
            if self.serving_s is not None and self.serving_s != self.ready_s:
                s += f" (API answering from {self.serving_s:.0f} s)"
            return s
        return f"never ready within {self.horizon_s:.0f} s: {self.reason}"


def _kill_reason(att: Attempt, by: str, now: float) -> str:
    phase = att.phase or "start"
    label = PHASE_LABELS.get(phase, phase)
    return (
        f"{by} probe killed the container during {label}: phase '{phase}' at "
        f"{now - att.started_s:.0f} s of the {att.needs_s:.0f} s start"
    )


def simulate_pod(
    first: Breakdown, spec: PodSpec, warm: Breakdown | None = None, horizon_s: float = 1800.0
) -> PodResult:
    """Run one pod until it is Ready or ``horizon_s`` passes.

    ``first`` is the start-up of the first container (its ``image_pull`` phase,
    if any, happens once before it).  ``warm`` is the start-up with a warm
    compile cache, used for later attempts once a compile completed and
    ``spec.compile_cache_volume`` keeps it; without it every attempt repeats
    ``first``.
    """
    if not horizon_s > 0:
        raise ProbeError(f"horizon_s={horizon_s} must be > 0 seconds")
    env = simpy.Environment()
    res = PodResult(horizon_s=horizon_s)
    state: dict[str, bool | int | None] = {"cache_warm": first.compile_cache == "hit", "ready_attempt": None}

    def log(msg: str) -> None:
        res.events.append((env.now, msg))

    def container(att: Attempt, bd: Breakdown):
        try:
            for ph in bd.container_phases():
                att.phase, att.phase_started_s = ph.name, env.now
                yield env.timeout(ph.seconds)
                if ph.name == "compile" and bd.compile_cache == "miss" and spec.compile_cache_volume:
                    if not state["cache_warm"]:
                        log("torch.compile finished: compile cache written to the volume")
                    state["cache_warm"] = True
            att.phase, att.api_up_s, att.outcome = "serving", env.now, "serving"
            log(f"attempt {att.index}: API server answering")
            yield env.event()  # serve until the horizon
        except simpy.Interrupt:
            return

    def up(att: Attempt) -> bool:
        return att.alive and env.now >= att.planned_up_s

    def kill(att: Attempt, ctr, by: str, exit_ev) -> None:
        if not att.alive:
            return
        att.alive, att.outcome, att.killed_by, att.ended_s = False, "killed", by, env.now
        log(f"attempt {att.index}: {_kill_reason(att, by, env.now)}")
        res.reason = _kill_reason(att, by, env.now)
        if state["ready_attempt"] == att.index:  # Ready without a readinessProbe, now dead: not Ready
            res.ready_s = res.serving_s = state["ready_attempt"] = None
            log(f"attempt {att.index}: pod no longer Ready")
        ctr.interrupt()
        exit_ev.succeed()

    def mark_ready(att: Attempt) -> None:
        if res.ready_s is None:
            res.ready_s, res.serving_s, state["ready_attempt"] = env.now, att.planned_up_s, att.index
            log(f"attempt {att.index}: pod Ready")
            if env.now < att.planned_up_s and not res.warnings:
                res.warnings.append(
                    f"the pod is Ready at {env.now:.0f} s but the API answers only at {att.planned_up_s:.0f} s: "
                    f"without a readinessProbe traffic arrives {att.planned_up_s - env.now:.0f} s early and fails"
                )

    def probe_loop(att: Attempt, ctr, probe: Probe, kind: str, exit_ev, on_success=None):
        yield env.timeout(probe.initial_delay_s)
        fails = 0
        while att.alive:
            if up(att):
                fails = 0
                if on_success is not None:
                    on_success()
                    return
            else:
                fails += 1
                if fails >= probe.failure_threshold and kind != "readiness":
                    kill(att, ctr, kind, exit_ev)
                    return
            yield env.timeout(probe.period_s)

    def after_gate(att: Attempt, ctr, exit_ev):
        """Liveness and readiness, started at the gate (container start or startup success)."""
        if spec.liveness is not None:
            env.process(probe_loop(att, ctr, spec.liveness, "liveness", exit_ev))
        if spec.readiness is not None:
            env.process(probe_loop(att, ctr, spec.readiness, "readiness", exit_ev, lambda: mark_ready(att)))
        else:
            mark_ready(att)

    def pod():
        pull = first.seconds("image_pull")
        if pull > 0:
            log(f"pulling image ({pull:.0f} s)")
            yield env.timeout(pull)
        backoff = spec.backoff_initial_s
        while True:
            bd = warm if (state["cache_warm"] and warm is not None) else first
            att = Attempt(len(res.attempts) + 1, env.now, bd.compile_cache, bd.container_s)
            res.attempts.append(att)
            log(f"attempt {att.index}: container started (compile cache {bd.compile_cache}, needs {att.needs_s:.0f} s)")
            ctr = env.process(container(att, bd))
            exit_ev = env.event()
            if spec.startup is not None:

                def started(a: Attempt = att, c=ctr, e=exit_ev) -> None:
                    log(f"attempt {a.index}: startup probe succeeded")
                    after_gate(a, c, e)

                env.process(probe_loop(att, ctr, spec.startup, "startup", exit_ev, started))
            else:
                after_gate(att, ctr, exit_ev)
            yield exit_ev
            assert att.ended_s is not None, "only a kill, which sets ended_s, succeeds exit_ev"
            if att.ended_s - att.started_s >= spec.backoff_reset_s:
                backoff = spec.backoff_initial_s
            res.restarts += 1
            res.backoffs_s.append(backoff)
            log(f"back-off {backoff:.0f} s before restart {res.restarts} (CrashLoopBackOff)")
            yield env.timeout(spec.termination_s + backoff)
            backoff = min(2 * backoff, spec.backoff_cap_s)

    env.process(pod())
    env.run(until=horizon_s)
    if res.ready_s is None:
        last = res.attempts[-1] if res.attempts else None
        if res.reason is not None:
            res.reason += (
                f"; {res.restarts} restart{'s' * (res.restarts != 1)}, back-offs "
                f"{', '.join(f'{b:.0f}' for b in res.backoffs_s)} s (CrashLoopBackOff)"
            )
            if spec.compile_cache_volume and not state["cache_warm"]:
                res.reason += "; the compile cache volume never got a finished compile to keep"
        elif last is None:
            res.reason = f"the image pull ({first.seconds('image_pull'):.0f} s) outlasts the horizon"
        else:
            res.reason = (
                f"the start needs {last.needs_s:.0f} s; attempt {last.index} began at "
                f"{last.started_s:.0f} s and the horizon ended first"
            )
    return res


# ---- recommendation -----------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeRecommendation:
    """Probe settings that let a start of ``basis_s`` (+ margin) finish, as a YAML snippet."""

    startup: Probe
    liveness: Probe
    readiness: Probe
    basis_s: float
    margin: float
    budget_s: float
    yaml: str

    def pod_spec(self, compile_cache_volume: bool = False) -> PodSpec:
        return PodSpec(self.startup, self.liveness, self.readiness, compile_cache_volume=compile_cache_volume)


def recommend_probes(
    bd: Breakdown, margin: float = 0.5, period_s: int = 10, path: str = "/health", port: int = 8000
) -> ProbeRecommendation:
    """A startupProbe that tolerates ``(1 + margin) x`` the container start of ``bd``.

    The startup probe runs from container start (image pull excluded) with no
    initial delay; it gives up ``periodSeconds x (failureThreshold - 1)`` after
    the container starts, so ``failureThreshold = ceil(budget / period) + 1``.
    Liveness (period 10 s, timeout 5 s, 3 failures) and readiness (period 5 s,
    timeout 3 s, 3 failures) then start when it succeeds, with no delay.  Size
    it on a cold compile cache and on the high end of the sourced range
    (``breakdown(..., level="high")``, or
    :func:`simulator.ops.coldstart_scale.recommend_high`): a vLLM, torch or config
    change invalidates a warm cache, and hosts differ several-fold.
    """
    if not (isinstance(margin, (int, float)) and margin >= 0 and margin == margin):
        raise ProbeError(f"margin={margin!r} must be >= 0 (0.5 = 50% more than the modelled start)")
    if isinstance(period_s, bool) or not isinstance(period_s, int) or period_s < 2:
        raise ProbeError(f"period_s={period_s!r} must be a whole number >= 2 (timeoutSeconds must stay below it)")
    basis = bd.container_s
    budget = basis * (1.0 + margin)
    threshold = math.ceil(budget / period_s) + 1
    startup = Probe(0, period_s, min(5, period_s - 1), threshold, 1, "startupProbe", path, port)
    liveness = Probe(0, 10, 5, 3, 1, "livenessProbe", path, port)
    readiness = Probe(0, 5, 3, 3, 1, "readinessProbe", path, port)
    body = yaml.safe_dump(
        {"startupProbe": startup.to_k8s(), "livenessProbe": liveness.to_k8s(), "readinessProbe": readiness.to_k8s()},
        sort_keys=False,
        default_flow_style=False,
    )
    head = (
        f"# {bd.description}\n"
        f"# modelled start, container start -> API answers: {basis:.0f} s (image pull excluded: probes "
        f"do not see it)\n"
        f"# safety margin {margin:.0%}: budget {budget:.0f} s; this startupProbe restarts the container only "
        f"after\n# periodSeconds x (failureThreshold - 1) = {period_s} x {threshold - 1} = "
        f"{period_s * (threshold - 1)} s without an answer; liveness/readiness start once it succeeds\n"
    )
    return ProbeRecommendation(
        startup, liveness, readiness, basis, float(margin), float(period_s * (threshold - 1)), head + body
    )
