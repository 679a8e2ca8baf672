"""Scenario block ``operations``: autoscaling, faults, retries and how instances start.

Validated, frozen pydantic models (part of :class:`simulator.scenario.Scenario`).
Everything here is off by default: a scenario without an ``operations`` block
runs exactly as before.  Units: seconds, tokens, requests.

* ``startup``: how a new or restarted instance starts: node provisioning
  delay, then the cold-start phases (:mod:`simulator.ops.coldstart`) of a pod
  behind its probes (:mod:`simulator.ops.k8s`);
* ``autoscale``: per pool name, a policy (registry in
  :mod:`simulator.ops.autoscale`) with its bounds and targets;
* ``faults``: FP8 activation-outlier crashes, node failures, link
  degradation episodes on the PD fabric (:mod:`simulator.ops.faults`);
* ``retry``: what happens to requests in flight on a crashed instance.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import model_validator

from simulator.bounds import BandwidthLeft, Duration, Fraction, Range
from simulator.ops.autoscale import POLICIES
from simulator.ops.probe_spec import Probe
from simulator.strict_model import StrictModel


class ProbeConfig(StrictModel):
    """One Kubernetes probe (``httpGet /health``), fields as in the pod spec, in seconds."""

    initial_delay_s: Annotated[
        int, Range(0, 86400, "s", whole=True, fix="set initialDelaySeconds (0 probes right after the gate)")
    ] = 0
    period_s: Annotated[
        int, Range(1, 3600, "s", whole=True, fix="set periodSeconds, e.g. 10 (the Kubernetes default)")
    ] = 10
    timeout_s: Annotated[int, Range(1, 3600, "s", whole=True, fix="set timeoutSeconds, e.g. 1 (the default) to 5")] = 1
    failure_threshold: Annotated[
        int, Range(1, 10_000, "probes", whole=True, fix="set failureThreshold, e.g. 3 (the default)")
    ] = 3

    @model_validator(mode="after")
    def _valid(self) -> ProbeConfig:
        Probe(self.initial_delay_s, self.period_s, self.timeout_s, self.failure_threshold).validate()
        return self

    def probe(self):
        return Probe(self.initial_delay_s, self.period_s, self.timeout_s, self.failure_threshold)


class StartupConfig(StrictModel):
    """How an instance added by the autoscaler or restarted after a fault becomes ready.

    ``provisioning_s``: node provisioning before the pod starts (scale-up and
    node replacement).  ``compile_cache``: ``none`` (every container compiles
    from scratch), ``pod`` (an ``emptyDir``: a restarted container of the same
    pod finds the cache its predecessor wrote), ``persistent`` (a volume that
    outlives pods holds a populated cache: every start hits it).
    ``probes``: ``recommended`` (epdsim's startup probe for a cold compile,
    with ``margin``) or ``given`` (``startup_probe``/``liveness``/``readiness``
    below; a start they kill never serves).
    """

    provisioning_s: Annotated[float, Range(0, 1e6, "s", fix="give seconds until a node is ready")] = 0.0
    image_cached: bool = False
    storage: str = "nvme"
    compile_cache: Literal["none", "pod", "persistent"] = "none"
    probes: Literal["recommended", "given"] = "recommended"
    margin: Annotated[float, Range(0, 10, fix="give the fraction added to the cold start, e.g. 0.5")] = 0.5
    startup_probe: ProbeConfig | None = None
    liveness: ProbeConfig | None = None
    readiness: ProbeConfig | None = None

    @model_validator(mode="after")
    def _probes(self) -> StartupConfig:
        given = [n for n in ("startup_probe", "liveness", "readiness") if getattr(self, n) is not None]
        if self.probes == "recommended" and given:
            raise ValueError(
                f"{', '.join(given)} given but probes='recommended' ignores them; set probes: given "
                f"to use your own probes, or remove them"
            )
        return self


class AutoscaleConfig(StrictModel):
    """A pool's autoscaler.

    ``policy``: ``queue`` (waiting requests per serving instance toward
    ``target_queue``), ``kv`` (mean KV-cache use toward ``target_kv``) or
    ``slo`` (predicts the arrival rate ``interval_s`` + start-up time ahead
    from the last two ``window_s`` windows, and sizes this pool from its
    per-instance capacity under the scenario's TPOT SLO at
    ``target_utilisation``; prefill and decode pools are sized separately).
    Every ``interval_s`` the policy proposes a count, clamped to
    [``min_instances``, ``max_instances``]; scale-up starts at once, scale-down
    takes the highest proposal of the last ``scale_down_stabilization_s``
    (Kubernetes HPA's window) and drains an instance before removing it.
    """

    policy: str = "queue"
    min_instances: Annotated[int, Range(1, 4096, "instances", whole=True)] = 1
    max_instances: Annotated[int, Range(1, 4096, "instances", whole=True)] = 8
    # Below 0.1 s the autoscaler's ticks swamp the run.
    interval_s: Annotated[float, Range(0.1, 86400, "s", fix="give seconds between decisions, e.g. 15")] = 15.0
    target_queue: Annotated[
        float, Range(0, 1e6, "requests", lo_open=True, fix="give waiting requests per instance")
    ] = 4.0
    target_kv: Fraction = 0.8
    target_utilisation: Fraction = 0.7
    window_s: Annotated[float, Range(0, 1e7, "s", lo_open=True, fix="give seconds")] = 60.0
    scale_down_stabilization_s: Annotated[float, Range(0, 1e7, "s", fix="give seconds (Kubernetes: 300)")] = 300.0

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleConfig:
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r} is unknown; choose one of {sorted(POLICIES)}")
        if self.min_instances > self.max_instances:
            raise ValueError(
                f"min_instances={self.min_instances} exceeds max_instances={self.max_instances}; "
                f"make min_instances <= max_instances"
            )
        return self


class FP8CrashConfig(StrictModel):
    """Crashes from FP8 activation outliers on pools whose weights are FP8.

    Each decoding sequence of context ``L`` adds ``rate_per_token_s x max(0, L
    - onset_tokens)`` to the instance's crash hazard (per second); ``None``
    takes the defaults in ``hwdb/data/faults/fp8-activation-outliers.yaml``
    (assumptions: see the source there).  ``pools``: names; empty = every
    pool with ``dtype: fp8``.
    """

    # Up to 1e-3: a 1k-token instance crashes each second.
    rate_per_token_s: (
        Annotated[float, Range(0, 1e-3, "per token per s", fix="give a hazard per context token")] | None
    ) = None
    onset_tokens: Annotated[int, Range(0, 10**8, "tokens", whole=True)] | None = None
    pools: tuple[str, ...] = ()


class NodeFailureConfig(StrictModel):
    """Each instance's node fails after an exponential time of mean ``mtbf_s``; its replacement
    starts ``mttr_s`` later (then provisioning and a full start).  ``pools``: empty = all."""

    # Failures more often than each second would never let a run end.
    mtbf_s: Annotated[float, Range(1, 1e12, "s", fix="give the mean time between failures in seconds")]
    mttr_s: Annotated[float, Range(0, 1e9, "s", fix="give the mean time to repair in seconds")] = 0.0
    pools: tuple[str, ...] = ()


class LinkDegradationConfig(StrictModel):
    """Episodes on the PD fabric: every instance's link side independently degrades after an
    exponential time of mean ``mtbf_s`` to ``bandwidth_factor`` of its bandwidth for an exponential
    time of mean ``duration_s`` (transfers in flight slow down).  Static degradation and latency
    jitter are ``kv_transfer.bandwidth_factor`` and ``kv_transfer.jitter_mean_s``."""

    mtbf_s: Annotated[float, Range(1e-3, 1e12, "s", fix="give the mean time between episodes in seconds")]
    duration_s: Annotated[float, Range(1e-3, 1e9, "s", fix="give an episode's mean length in seconds")]
    bandwidth_factor: BandwidthLeft


class FaultsConfig(StrictModel):
    fp8_crash: FP8CrashConfig | None = None
    node_failure: NodeFailureConfig | None = None
    link_degradation: LinkDegradationConfig | None = None

    @property
    def any(self) -> bool:
        return any(x is not None for x in (self.fp8_crash, self.node_failure, self.link_degradation))


class RetryConfig(StrictModel):
    """Requests in flight on a crashed instance: ``none`` (they fail), ``retry`` (the gateway sends
    them again from scratch, up to ``max_retries`` times; tokens already streamed are discarded),
    ``reprefill`` (they continue elsewhere: prompt plus the tokens generated so far is prefilled
    again, and generation resumes)."""

    policy: Literal["none", "retry", "reprefill"] = "none"
    max_retries: Annotated[int, Range(0, 100, "retries", whole=True)] = 2


class OperationsConfig(StrictModel):
    """``queue_timeout_s``: a request not yet scheduled (queued on an instance of the first pool, or
    held at the gateway) this long after the gateway took it (its arrival, or a re-send after a
    crash) is rejected with reason "timeout" (the client gave up); a re-prefilled continuation that
    already streamed tokens is exempt.  Checked every ``min(1, queue_timeout_s / 10)`` seconds."""

    startup: StartupConfig = StartupConfig()
    autoscale: dict[str, AutoscaleConfig] = {}
    faults: FaultsConfig = FaultsConfig()
    retry: RetryConfig = RetryConfig()
    queue_timeout_s: Duration | None = None

    @property
    def enabled(self) -> bool:
        """Whether the run needs the operations engine (else the plain one runs, unchanged)."""
        return bool(self.autoscale) or self.faults.any or self.queue_timeout_s is not None


def check_against_pools(ops: OperationsConfig, pools) -> None:
    """Cross-checks of ``operations`` against the pools (raises ValueError naming the field)."""
    names = [p.name for p in pools]
    for name, cfg in ops.autoscale.items():
        if name not in names:
            raise ValueError(f"operations.autoscale.{name}: no pool is named {name!r}; pools are {names}")
        n = next(p.instances for p in pools if p.name == name)
        if not cfg.min_instances <= n <= cfg.max_instances:
            raise ValueError(
                f"operations.autoscale.{name}: the pool starts with instances={n}, outside "
                f"[min_instances={cfg.min_instances}, max_instances={cfg.max_instances}]; "
                f"set the pool's instances within the bounds"
            )
    if ops.enabled and any(p.dp > 1 for p in pools):
        raise ValueError(
            "operations (autoscaling, faults) do not model attention data-parallel instances yet (a "
            "crash or a scale step would take all dp ranks at once); remove the operations block or "
            "set dp: 1"
        )
    encoders = [p.name for p in pools if p.role == "encoder"]
    for name, cfg in ops.autoscale.items():
        if name in encoders and cfg.policy != "queue":
            raise ValueError(
                f"operations.autoscale.{name}: an encoder pool autoscales on its image queue only "
                f"(policy: queue, target_queue in images); policy {cfg.policy!r} reads a "
                f"language model's KV cache or step times"
            )
    pd_ = any(p.role == "prefill" for p in pools)
    f = ops.faults
    for what, fault in (("fp8_crash", f.fp8_crash), ("node_failure", f.node_failure)):
        for name in fault.pools if fault is not None else ():
            if name not in names:
                raise ValueError(f"operations.faults.{what}.pools: no pool is named {name!r}; pools are {names}")
            if name in encoders:
                raise ValueError(
                    f"operations.faults.{what}.pools: {name!r} is an encoder pool, and encoder "
                    f"crashes are not modelled yet (faults strike language-model instances)"
                )
    if f.link_degradation is not None and not pd_:
        raise ValueError(
            "operations.faults.link_degradation applies to the KV-transfer fabric of a "
            "prefill-decode deployment; this scenario has one pool: remove it or add PD pools"
        )
