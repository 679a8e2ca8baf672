"""Autoscaling policies (a registry of small strategy classes) and the autoscaler process.

Every ``interval_s`` the autoscaler of a pool observes it (:class:`Observation`),
asks its policy for a number of instances, clamps it to the pool's bounds and
acts: scale-up starts new instances at once (they serve only after node
provisioning plus a cold start behind probes, see
:meth:`simulator.engine.opspool.OpsPool.scale_up`); scale-down applies the highest
proposal of the last ``scale_down_stabilization_s`` seconds (as Kubernetes'
HPA does) and drains the newest serving instances before removing them.
Instances still starting count as present, so a policy does not order the
same capacity twice while it boots.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from simulator.registry import Registry
from simulator.roles import ROLES
from simulator.stepmodel import StepModel


@dataclass(frozen=True)
class Observation:
    """What a policy sees of one pool at time ``now`` (seconds; rates in requests/s)."""

    now: float
    serving: int  # instances taking traffic
    present: int  # serving + starting (what the policy controls)
    waiting: int  # requests queued on serving instances and at the gateway
    kv_util: float  # mean KV-cache occupancy of serving instances (0..1)
    rate_now: float  # arrivals per second over the last window
    rate_prev: float  # arrivals per second over the window before it
    window_s: float
    lead_s: float  # time until capacity ordered now would serve
    mean_input: float  # mean prompt tokens of the arrivals so far
    mean_output: float  # mean output tokens of the arrivals so far


class Policy:
    """Base class: ``desired(obs)`` is the number of instances the pool should have (before clamping)."""

    name = "base"

    def __init__(self, cfg, ctx) -> None:
        self.cfg = cfg
        self.ctx = ctx

    def desired(self, obs: Observation) -> int:  # pragma: no cover - interface
        raise NotImplementedError


# Policy classes by their ``name``; an ``autoscale`` block's ``policy`` names one.
POLICIES: Registry[type[Policy]] = Registry("autoscaling policy", plural="autoscaling policies")
# Decorator adding a policy class under its ``name``; a duplicate name is an error.
register = POLICIES.register


@register
class QueueLength(Policy):
    """Waiting requests per serving instance toward ``target_queue`` (KEDA/HPA on
    ``vllm:num_requests_waiting``): ``ceil(waiting / target_queue)``, never below the
    instances already serving while anything waits."""

    name = "queue"

    def desired(self, obs: Observation) -> int:
        want = math.ceil(obs.waiting / self.cfg.target_queue)
        return max(want, obs.serving if obs.waiting else 0)


@register
class KVUtilisation(Policy):
    """Mean KV-cache use toward ``target_kv`` (HPA's formula: ``ceil(serving x use / target)``)."""

    name = "kv"

    def desired(self, obs: Observation) -> int:
        if obs.serving == 0:
            return obs.present
        return math.ceil(obs.serving * obs.kv_util / self.cfg.target_kv - 1e-9)


@dataclass(frozen=True)
class PoolContext:
    """What the SLO policy needs to know about one pool's instances."""

    role: str  # colocated | prefill | decode
    step_model: StepModel
    max_num_seqs: int
    chunk: int  # max_num_batched_tokens
    kv_tokens: int  # KV-cache tokens per instance
    tpot_slo_s: float | None


def instance_capacity(ctx: PoolContext, mean_input: float, mean_output: float) -> float:
    """Requests per second one instance sustains for the given mean lengths (0 < result).

    Decode runs at the largest batch ``b`` whose decode step meets the TPOT SLO
    (and fits ``max_num_seqs`` and the KV cache at context ``in + out/2``);
    a request costs its prefill alone plus ``out`` tokens at ``step(b) / b``.
    Prefill pools count only the prefill, decode pools only the decode.

    A throughput ceiling, not the planner's estimate: the planner's screen
    (:func:`simulator.plan.screen.steady_state`) solves the steady state *at a given rate* (mixed
    prefill/decode steps, TTFT with queueing) to find where the SLO breaks; this answers "how many
    requests per second at most" from lengths observed during the run, cheaply enough to ask every
    autoscaling interval, and ignores TTFT (the policy's ``target_utilisation`` is the headroom).
    """
    m = ctx.step_model
    n_in = max(1, int(round(mean_input)))
    n_out = max(1.0, mean_output)
    ctx_len = max(1, int(round(n_in + n_out / 2)))
    b_max = max(1, min(ctx.max_num_seqs, ctx.kv_tokens // max(1, int(n_in + n_out))))
    b = b_max
    if ctx.tpot_slo_s is not None and m.decode_time(b, ctx_len) > ctx.tpot_slo_s:
        lo, hi = 1, b_max  # largest b with decode_time(b) <= SLO (1 if even that misses)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if m.decode_time(mid, ctx_len) <= ctx.tpot_slo_s:
                lo = mid
            else:
                hi = mid - 1
        b = lo
    per_token = m.decode_time(b, ctx_len) / b
    prefill = m.prefill_time(n_in, ctx.chunk)
    role = ROLES[ctx.role]
    return 1.0 / ((prefill if role.prefills else 0.0) + (n_out * per_token if role.decodes else 0.0))


@register
class SLOPredictive(Policy):
    """Predict the arrival rate ``lead_s + interval_s`` ahead (linear trend over the last two
    windows) and size the pool as ``ceil(rate / (capacity x target_utilisation))`` with the
    per-instance capacity of :func:`instance_capacity` for this pool's role."""

    name = "slo"

    def desired(self, obs: Observation) -> int:
        slope = (obs.rate_now - obs.rate_prev) / obs.window_s
        rate = max(0.0, obs.rate_now + slope * (obs.lead_s + self.cfg.interval_s))
        cap = instance_capacity(self.ctx, obs.mean_input, obs.mean_output)
        return math.ceil(rate / (cap * self.cfg.target_utilisation) - 1e-9)


def autoscaler(env, pool, cfg, policy: Policy, observe):
    """SimPy process: evaluate ``policy`` on ``pool`` every ``cfg.interval_s`` and act on it.

    ``observe()`` returns an :class:`Observation`; ``pool`` offers ``present``,
    ``scale_up(n, why)`` and ``scale_down(n, why)``.  Decisions are logged in
    ``pool.decisions`` as ``(time_s, present, proposed, target)``.
    """
    recent: deque[tuple[float, int]] = deque()
    while True:
        yield env.timeout(cfg.interval_s)
        obs = observe()
        want = min(cfg.max_instances, max(cfg.min_instances, policy.desired(obs)))
        now = env.now
        recent.append((now, want))
        while recent and recent[0][0] < now - cfg.scale_down_stabilization_s:
            recent.popleft()
        present = pool.present
        target = present
        if want > present:
            target = want
            pool.scale_up(want - present, f"{policy.name} policy: {present} -> {want}")
        else:
            keep = max(w for _, w in recent)
            if keep < present:
                target = keep
                pool.scale_down(present - keep, f"{policy.name} policy: {present} -> {keep}")
        pool.decisions.append((now, present, want, target))
