"""Set up and run the engine (static or with operations) for a resolved scenario (called by
:func:`simulator.run.simulate`)."""

from __future__ import annotations

from simulator.engine.opsengine import OpsRun
from simulator.engine.opsobserve import pool_context
from simulator.engine.records import Recorder


def run_operations(
    scn, reqs, front, back, plan, closed, rngs, spec_of, epd=None, step_log=True, watch=None, *, shortcuts=True
):
    """Returns ``(ops, PoolRun, recorder)``.  ``front``/``back``: :class:`simulator.resolved.ResolvedPool`
    (``back`` None without PD), each with its start times; ``spec_of`` turns one into the engine's PoolSpec;
    ``rngs``: the run's :func:`simulator.resolved.rng_streams`; ``epd``: the :class:`simulator.epd.epd.EPDSetup`
    of a multimodal run, or None; ``step_log`` False: the instances keep no step log (no step table will be
    built; kept all the same with operations); ``watch``: called with the recorder, returns its ``watch``
    callback or None (:class:`simulator.goodput.VerdictWatch`); ``shortcuts`` False: one SimPy event per step
    (:mod:`simulator.engine.stepping`).

    Fault draws come from the ``faults`` stream, the fabric's jitter from ``transfer`` (as without
    operations), closed-loop delays from ``clients``.
    """
    rec = Recorder(reqs.input_tokens, reqs.output_tokens, reqs.arrival_s, reqs.hash_ids, reqs.hash_block_tokens)
    if watch is not None:
        rec.watch = watch(rec)
    resolved = [r for r in (front, back) if r is not None]
    starts = {r.name: r.starts for r in resolved}
    contexts = {r.name: pool_context(r.pool, r.dep, r.memory, r.step, scn.slo.tpot_s) for r in resolved}
    ops = OpsRun(scn, rec, rngs["faults"], starts, step_log, shortcuts)
    ops.coord_rng = rngs["transfer"]
    ops.client_rng = rngs["clients"]
    run = ops.run(
        spec_of(front),
        front.dep.gpus,
        closed,
        scn.simulation.max_time_s,
        spec_of(back) if back else None,
        back.dep.gpus if back else 0,
        plan,
        contexts,
        epd,
    )
    return ops, run, rec
