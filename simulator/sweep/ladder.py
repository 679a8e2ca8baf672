"""``--rates auto``: a geometric ladder of offered rates from a low load to past the knee.

The ladder is centred on the scenario's own throughput ceiling, :func:`capacity_rps`: each LLM pool's
:func:`simulator.ops.autoscale.instance_capacity` (the most requests per second one instance serves at
the workload's mean lengths: its largest batch that fits ``max_num_seqs`` and the KV cache, each
request costing its prefill alone plus its output tokens at that batch's per-token decode time),
times the pool's instances and data-parallel ranks; a prefill/decode scenario is limited by the
slower of its two pools.  The ceiling ignores queueing (TTFT), so the latency knee lies below it; the
ladder runs from :data:`LOW` to :data:`HIGH` times it, and :func:`extension` adds rungs above the top
when the runs show the deployment still keeping up there.
"""

from __future__ import annotations

import math

import numpy as np

import hwdb
from simulator.errors import WorkloadError
from simulator.ops.autoscale import PoolContext, instance_capacity
from simulator.resolved import resolve
from simulator.roles import ROLES
from simulator.scenario import Scenario, ScenarioError
from simulator.traces import TraceError
from simulator.workload import generate

LOW, HIGH = 1 / 8, 1.5  # the ladder's ends, as fractions of the estimated ceiling
POINTS = 10
EXTEND = (1.5, 2.25)  # rungs added above the top (as multiples of it) while the top still keeps up
MAX_EXTENSIONS = 2


def capacity_rps(scn: Scenario, db: hwdb.HardwareDB | None = None) -> float:
    """Estimated ceiling of completed requests per second (see the module docstring); > 0."""
    rs = resolve(scn, db)
    streams = rs.streams(0)
    try:
        reqs = generate(scn.workload, streams["arrivals"], streams["lengths"])
    except (WorkloadError, TraceError) as exc:
        raise ScenarioError(f"workload: {exc}") from None
    mean_in = float(np.mean(reqs.input_tokens)) if len(reqs.input_tokens) else 1.0
    mean_out = float(np.mean(reqs.output_tokens)) if len(reqs.output_tokens) else 1.0
    by_stage: dict[str, float] = {}
    for r in rs.pools:
        k = r.dep.knobs
        ctx = PoolContext(r.role, r.step, k.max_num_seqs, k.max_num_batched_tokens, r.memory.kv_tokens, None)
        cap = r.pool.instances * r.dep.dp * instance_capacity(ctx, mean_in, mean_out)
        role = ROLES[r.role]
        for stage, does in (("prefill", role.prefills), ("decode", role.decodes)):
            if does:
                by_stage[stage] = by_stage.get(stage, 0.0) + cap
    cap = min(by_stage.values()) if by_stage else math.nan
    if not (math.isfinite(cap) and cap > 0):
        raise ScenarioError(
            f"--rates auto: could not estimate {scn.name}'s capacity (got {cap}); give the rates, "
            f"e.g. --rates 1,2,4,8,16"
        )
    return cap


def ladder(capacity: float, points: int = POINTS, low: float = LOW, high: float = HIGH) -> list[float]:
    """``points`` rates (req/s), geometric from ``low`` to ``high`` times ``capacity``, rounded to 3
    significant figures so that tables and file names read cleanly."""
    n = max(2, int(points))
    ratio = (high / low) ** (1.0 / (n - 1))
    out: list[float] = []
    for i in range(n):
        r = float(f"{capacity * low * ratio**i:.3g}")
        if not out or r > out[-1]:
            out.append(r)
    return out


def extension(top: float) -> list[float]:
    """Rungs above ``top`` (req/s) for a ladder whose top still keeps up."""
    return [float(f"{top * f:.3g}") for f in EXTEND]
