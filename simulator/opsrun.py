"""Set up and run the operations engine for a resolved scenario (called by :func:`simulator.run.simulate`)."""
from __future__ import annotations

import numpy as np

from simulator.opsengine import OpsRun, pool_context
from simulator.opsrecord import OpsRecorder
from simulator.opsstart import StartTimes


def run_operations(scn, replication: int, reqs, front, back, plan, closed, rng_faults, spec_of, rng_clients=None):
    """Returns ``(ops, PoolRun, recorder)``.  ``front``/``back`` are resolved ``(pool, dep, memory, step)``.

    Fault draws use their own generator, spawned from the seed and replication, so the KV
    fabric's jitter stream (``rng_faults``) draws exactly as it does without operations.
    """
    cfg = scn.operations
    rec = OpsRecorder(reqs.input_tokens, reqs.output_tokens, reqs.arrival_s, reqs.hash_ids, reqs.hash_block_tokens)
    resolved = [x for x in (front, back) if x is not None]
    starts = {p.name: StartTimes(d, cfg.startup, scn.hwdb) for p, d, _, _ in resolved}
    contexts = {p.name: pool_context(p, d, m, s, scn.slo.tpot_s) for p, d, m, s in resolved}
    rng = np.random.default_rng(np.random.SeedSequence([scn.seed, replication, 0x0FA17]))
    ops = OpsRun(scn, rec, rng, starts)
    ops.coord_rng = rng_faults
    ops.client_rng = rng_clients
    run = ops.run(spec_of(*front), front[1].gpus, closed, scn.simulation.max_time_s,
                  spec_of(*back) if back else None, back[1].gpus if back else 0, plan, contexts)
    return ops, run, rec
