"""Set up and run the operations engine for a resolved scenario (called by :func:`simulator.run.simulate`)."""
from __future__ import annotations

from simulator.opsengine import OpsRun, pool_context
from simulator.opsrecord import OpsRecorder
from simulator.opsstart import StartTimes


def run_operations(scn, reqs, front, back, plan, closed, rngs, spec_of):
    """Returns ``(ops, PoolRun, recorder)``.  ``front``/``back`` are resolved ``(pool, dep, memory, step)``;
    ``rngs``: the run's :func:`simulator.scenario.rng_streams`.

    Fault draws come from the ``faults`` stream, the fabric's jitter from ``transfer`` (as without
    operations), closed-loop delays from ``clients``.
    """
    cfg = scn.operations
    rec = OpsRecorder(reqs.input_tokens, reqs.output_tokens, reqs.arrival_s, reqs.hash_ids, reqs.hash_block_tokens)
    resolved = [x for x in (front, back) if x is not None]
    starts = {p.name: StartTimes(d, cfg.startup, scn.hwdb) for p, d, _, _ in resolved}
    contexts = {p.name: pool_context(p, d, m, s, scn.slo.tpot_s) for p, d, m, s in resolved}
    ops = OpsRun(scn, rec, rngs["faults"], starts)
    ops.coord_rng = rngs["transfer"]
    ops.client_rng = rngs["clients"]
    run = ops.run(spec_of(*front), front[1].gpus, closed, scn.simulation.max_time_s,
                  spec_of(*back) if back else None, back[1].gpus if back else 0, plan, contexts)
    return ops, run, rec
