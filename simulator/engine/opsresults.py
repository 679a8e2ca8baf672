"""Results of an operations run: request outcomes with failures, and the operations summary.

``summary["operations"]`` (definitions; times in seconds, GPU time in GPU-seconds/hours):

* ``failed``: requests ended by a crash (retry policy ``none``) or with their retries exhausted;
  ``availability`` = completed / (completed + rejected + failed);
* ``retried_requests``: requests that were sent again at least once; ``retries``: all re-sends;
  ``discarded_tokens``: tokens streamed by attempts the client threw away (policy ``retry``);
* ``gpu_hours``: sum over instance incarnations (encoder instances too) of GPUs x (end - billing start) / 3600, billing
  starting when the node is provisioned (the initial instances at 0) and ending at removal, crash
  (the restart is a new incarnation billed from the crash) or the end of the run;
  ``cost_usd`` = GPU-hours x each pool's GPU price;
* ``wasted_gpu_s``: billed GPU time that served nothing (``starting_gpu_s``: starts and restarts
  until serving, and starts that never served) plus ``lost_work_gpu_s``: the KV tokens a crash
  destroyed, priced at the crashed instance's mean GPU-seconds per token processed;
* ``scale_ups``: each scale-up decision with the time its capacity served; ``slo_violations_during_scale_up``:
  requests arriving while a scale-up was pending that missed the TTFT SLO (or did not complete).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from simulator.summary_types import InstanceLife, OperationsSummary, OpsEvent, ScaleUp


def _per_token_gpu_s(inst) -> float:
    steps = inst.steps
    if not steps:
        return 0.0
    busy = sum(steps.column(1))
    tokens = sum(steps.column(2)) + sum(steps.column(3))
    return inst.life.gpus * busy / max(1, tokens)


def ops_summary(ops, req: pd.DataFrame, ttft_slo: float | None, price_per_gpu_h: dict[str, float]) -> OperationsSummary:
    pools = [p for p in (ops.front, ops.back) if p is not None]
    insts = [i for p in pools for i in p.all]
    end = ops.end
    n = len(req)
    out = req["outcome"].astype(str)
    completed, rejected, failed = (
        int((out == "completed").sum()),
        int((out == "rejected").sum()),
        int((out == "failed").sum()),
    )
    gpu_s = starting = lost_work = cost = 0.0
    lives: list[InstanceLife] = []
    # Language-model instances, then the encoder tier's (which never crash: no lost work).
    for inst, life in [(i, i.life) for i in insts] + [(None, life) for life in ops.encoder_lives]:
        t1 = min(life.ended_s if life.ended_s is not None else end, end)
        t0 = min(life.billed_s, t1)
        billed = life.gpus * (t1 - t0)
        gpu_s += billed
        cost += billed / 3600.0 * price_per_gpu_h[life.pool]
        up = life.ready_s if life.ready_s is not None else t1
        starting += life.gpus * max(0.0, min(up, t1) - t0)
        if inst is not None:
            lost_work += life.lost_tokens * _per_token_gpu_s(inst)
        lives.append(
            {
                "pool": life.pool,
                "instance": life.index,
                "cause": life.cause,
                "billed_s": life.billed_s,
                "ready_s": life.ready_s,
                "ended_s": life.ended_s,
                "end": life.end,
                "gpus": life.gpus,
            }
        )
    arrival = req["arrival_s"].to_numpy()
    bad = out.to_numpy() != "completed"
    if ttft_slo is not None:
        bad |= ~(req["ttft_s"].to_numpy() <= ttft_slo)
    in_scaleup = np.zeros(n, dtype=bool)
    scale_ups: list[ScaleUp] = []
    scaled = [*pools, ops.encoder_pool] if ops.encoder_pool is not None else pools
    for pool in scaled:
        for su in pool.scaleups:
            life, cancelled = su.start.life, su.start.cancelled
            ready = life.ready_s
            stop = ready if ready is not None else life.ended_s if cancelled else end
            in_scaleup |= (arrival >= su.decided_s) & (arrival < stop)
            scale_ups.append(
                {
                    "pool": pool.name,
                    "decided_s": su.decided_s,
                    "serving_s": ready,
                    "cancelled_s": life.ended_s if cancelled else None,
                }
            )
    viol = arrival[bad]
    kinds: dict[str, int] = {}
    for c in ops.crashes:
        kinds[c["kind"]] = kinds.get(c["kind"], 0) + 1
    return {
        "failed": failed,
        "availability": completed / max(1, completed + rejected + failed),
        "retried_requests": int((req["retries"] > 0).sum()),
        "retries": int(req["retries"].sum()),
        "discarded_tokens": int(req["discarded_tokens"].sum()),
        "crashes": len(ops.crashes),
        "crashes_by_kind": kinds,
        "gpu_hours": gpu_s / 3600.0,
        "cost_usd": cost,
        "wasted_gpu_s": starting + lost_work,
        "starting_gpu_s": starting,
        "lost_work_gpu_s": lost_work,
        "scale_ups": scale_ups,
        "slo_violations_during_scale_up": int((bad & in_scaleup).sum()),
        "slo_violations": int(bad.sum()),
        "slo_violation_arrivals_s": [float(viol.min()), float(viol.max())] if len(viol) else None,
        "events": [OpsEvent(time_s=t, pool=p, action=a, count=c, why=w) for t, p, a, c, w in ops.events],
        "crash_log": ops.crashes,
        "link_degradations": len(ops.link_log) // 2 + len(ops.link_log) % 2,
        "instances": lives,
        "peak_instances": {p.spec.name: _peak([i.life for i in p.all]) for p in pools}
        | ({ops.encoder_lives[0].pool: _peak(ops.encoder_lives)} if ops.encoder_lives else {}),
        "end_s": end,
    }


def _peak(lives) -> int:
    """Most of the incarnations ``lives`` (one pool's) serving at once."""
    ev = []
    for life in lives:
        if life.ready_s is not None:
            ev.append((life.ready_s, 1))
            ev.append((life.ended_s if life.ended_s is not None else math.inf, -1))
    ev.sort(key=lambda e: (e[0], e[1]))
    best = cur = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best
