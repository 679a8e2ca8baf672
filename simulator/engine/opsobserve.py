"""What the autoscaler of an operations run sees of a pool (:mod:`simulator.ops.autoscale`).

:func:`observe` is a pool's :class:`~simulator.ops.autoscale.Observation` now: its serving and present
instances, the requests queued on the serving ones and at the gateway, their mean KV-cache occupancy
(0..1), the arrival rate (requests/s) over the last window and the window before it, the lead time
(seconds) of capacity ordered now, and the mean prompt and output tokens of the arrivals so far.
:func:`pool_context` is what the SLO policy knows of a pool's instances from the start.
"""

from __future__ import annotations

from bisect import bisect_left

from simulator.engine.opspool import OpsPool
from simulator.ops.autoscale import Observation, PoolContext


def observe(ops, pool: OpsPool, cfg) -> Observation:
    """``pool`` of the run ``ops`` (an :class:`~simulator.engine.opsengine.OpsRun`) as its autoscaler
    (``cfg``: its ``autoscale`` block) sees it at the run's current time."""
    now, w = ops.env.now, cfg.window_s
    a = ops.arrived
    i_now, i_prev = bisect_left(a, now - w), bisect_left(a, now - 2 * w)
    act = pool.active
    waiting = sum(i.n_queued() for i in act)
    waiting += len(ops.limbo) if pool is ops.front else len(ops.coord.limbo) if ops.coord else 0
    n = max(1, len(a))
    return Observation(
        now=now,
        serving=len(act),
        present=pool.present,
        waiting=waiting,
        kv_util=sum(i.kv_used / i.kv_total for i in act) / len(act) if act else 0.0,
        rate_now=(len(a) - i_now) / min(w, max(now, 1e-9)),
        rate_prev=(i_now - i_prev) / w,
        window_s=w,
        lead_s=pool.starts.new_delay() or 0.0,
        mean_input=ops.sum_in / n,
        mean_output=ops.sum_out / n,
    )


def pool_context(pool_cfg, dep, mem, step, tpot_slo) -> PoolContext:
    k = dep.knobs
    return PoolContext(pool_cfg.role, step, k.max_num_seqs, k.max_num_batched_tokens, mem.kv_tokens, tpot_slo)
