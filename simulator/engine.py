"""Drive a pool of instances with a workload in SimPy and collect records.

:func:`run_pool` is the single place where the environment is created; the
workload (open-loop arrivals or closed-loop clients) and every instance are
processes that receive it.  Results are plain Python lists held by a
:class:`Recorder`, turned into DataFrames at the end (``simulator.results``).
"""
from __future__ import annotations

import gc
import math
from dataclasses import dataclass

import simpy

from simulator.arrivals import start_workload
from simulator.dp_group import DPGroup
from simulator.instance import Instance
from simulator.outcome import Outcome
from simulator.pd_proxy import PDCoordinator
from simulator.routing import make_router

PENDING = Outcome.PENDING
# Colocated open-loop instances step ahead of SimPy up to the next dispatch (see run_pool); results
# are the same, and tests/test_run_ahead.py turns this off to compare.
RUN_AHEAD = True


class Recorder:
    """Per-request records, indexed by request id (0..n-1).  Times in seconds."""

    def __init__(self, input_tokens, output_tokens, arrival_s, hash_ids=None, hash_block_tokens=None) -> None:
        n = len(input_tokens)
        nan = math.nan
        self.input_tokens = [int(x) for x in input_tokens]
        self.output_tokens = [int(x) for x in output_tokens]
        self.arrival = [float(x) for x in arrival_s]
        self.t_sched = [nan] * n
        self.t_seen = [nan] * n            # the engine sees the request (after the front end)
        self.t_first = [nan] * n
        self.t_finish = [nan] * n
        self.t_prefilled = [nan] * n       # PD: prefill instance finished the prompt
        self.t_kv_start = [nan] * n        # PD: decode instance allocated blocks, pull starts
        self.t_kv_done = [nan] * n         # PD: KV arrived on the decode instance
        self.prefill_instance = [-1] * n   # PD: which prefill instance ran the prompt
        self.instance = [-1] * n
        self.preemptions = [0] * n
        self.hash_ids = hash_ids               # per request: tuple of prompt block hashes, or None
        self.hash_block_tokens = hash_block_tokens
        self.cached_tokens = [0] * n           # prompt tokens served from the prefix cache
        self.generated = [0] * n
        self.outcome: list[Outcome] = [PENDING] * n
        self.attempt = [0] * n                 # bumped at every crash: stale transfer completions ignore it
        self.reason = [""] * n
        self.resume_gaps: list[float] = []
        self.waiters: dict[int, object] | None = None

    def finish(self, rid: int, now: float, instance: int, generated: int) -> None:
        if self.outcome[rid] != PENDING:
            raise RuntimeError(f"request {rid} ended twice")
        self.outcome[rid] = Outcome.COMPLETED
        self.t_finish[rid] = now
        self.generated[rid] = generated
        if self.waiters is not None:
            self.waiters.pop(rid).succeed()

    def close(self, end: float, max_time_s: float | None) -> None:
        """The end-of-run sweep, at simulated time ``end``: requests still pending become unfinished.

        Without a time limit the schedule empties only when every request has ended, unless a
        process sleeps on an event nothing will trigger: a simulator bug, never an answer, so a
        pending request then raises."""
        outcome = self.outcome
        if PENDING not in outcome:
            return
        if max_time_s is None:
            stuck = [rid for rid, o in enumerate(outcome) if o == PENDING]
            raise RuntimeError(f"simulation stalled at t={end:.6g} s: {len(stuck)} requests never ended "
                               f"(first: request {stuck[0]}); no process was left to serve them")
        for rid, o in enumerate(outcome):
            if o == PENDING:
                outcome[rid] = Outcome.UNFINISHED
                self.reason[rid] = f"still in flight at the time limit {max_time_s} s"

    def reject(self, rid: int, now: float, reason: str) -> None:
        if self.outcome[rid] != PENDING:
            raise RuntimeError(f"request {rid} ended twice")
        self.outcome[rid] = Outcome.REJECTED
        self.reason[rid] = reason
        self.t_finish[rid] = now


@dataclass(frozen=True)
class PoolSpec:
    """What :func:`run_pool` needs to build a pool's instances."""

    name: str
    instances: int
    step_model: object
    memory: object
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    max_model_len: int
    router: str
    role: str = "colocated"
    prefix_caching: bool = True
    frontend_s: float = 0.0             # front end before the engine sees a request (s) ...
    frontend_s_per_token: float = 0.0   # ... plus this per prompt token (tokenisation)
    dp: int = 1                         # ranks per lock-stepped data-parallel instance (instances counts ranks)


@dataclass
class PoolRun:
    """Raw output of one simulation: the recorder and each instance's step log."""

    recorder: Recorder
    instances: list[Instance]
    end_time: float
    coordinator: object = None
    epd: object = None            # simulator.epd_flow.EPDCoordinator of a multimodal run


def refusal(front: PoolSpec, back: PoolSpec | None, inp: int, out: int) -> str:
    """Why a request of ``inp`` prompt and ``out`` output tokens is refused at admission ("" if it is
    not): it must fit the front pool (which, in PD, only prefills: one output token) and the back pool."""
    why = _admissible(front, front.memory.kv_blocks, front.memory.block_size, inp, 1 if back else out)
    if not why and back is not None:
        why = _admissible(back, back.memory.kv_blocks, back.memory.block_size, inp, out)
    return why


def _admissible(pool: PoolSpec, inst_kv_blocks: int, block: int, inp: int, out: int) -> str:
    total = inp + out - 1
    if pool.max_model_len and inp + out > pool.max_model_len:
        return f"prompt {inp} + output {out} tokens exceed max_model_len {pool.max_model_len}"
    if -(-max(total, inp) // block) > inst_kv_blocks:
        return f"needs {total} tokens of KV; an instance holds {inst_kv_blocks * block}"
    return ""


def run_pool(pool: PoolSpec, rec: Recorder, closed_loop=None,
             max_time_s: float | None = None, decode: PoolSpec | None = None, transfer=None,
             rng=None, epd=None, client_rng=None) -> PoolRun:
    """Simulate ``pool`` serving every request in ``rec``.

    With ``decode`` and ``transfer`` (a :class:`simulator.pd.TransferPlan`),
    ``pool`` is the prefill pool of a PD deployment and every request goes
    prefill -> KV transfer -> decode.

    Open loop (``closed_loop is None``): requests arrive at ``rec.arrival``.
    Closed loop (a :class:`simulator.workload.ClientModel`): that many clients
    each send a request (after their share of the ramp-up, and after a client
    delay drawn from ``client_rng``), wait for it to finish, think, and send
    the next; arrival times are overwritten with the send times.  The run ends when every request has
    ended, or at ``max_time_s`` (requests still in flight become "unfinished").

    With ``epd`` (a :class:`simulator.epd.EPDSetup`), requests with images go
    through the encoder tier before ``pool`` (:mod:`simulator.epd_flow`), or
    ``pool`` encodes them in the step that admits them.
    """
    env = simpy.Environment()

    def build(spec: PoolSpec) -> list[Instance]:
        out = [Instance(i, spec.name, spec.step_model, spec.memory, spec.max_num_seqs,
                        spec.max_num_batched_tokens, spec.chunked_prefill, rec, spec.role,
                        spec.prefix_caching)
               for i in range(spec.instances)]
        if spec.dp > 1:
            for g in range(0, len(out), spec.dp):
                group = DPGroup(env, spec.step_model, spec.dp)
                for r, inst in enumerate(out[g:g + spec.dp]):
                    inst.group, inst.rank = group, r
        return out
    instances = build(pool)
    router = make_router(pool.router, instances)
    inp, out = rec.input_tokens, rec.output_tokens
    inst_of = rec.instance
    coordinator = None
    every = instances
    if decode is not None:
        d_instances = build(decode)
        coordinator = PDCoordinator(env, transfer, instances, d_instances,
                                    make_router(decode.router, d_instances), rec, rng)
        inst_of = rec.prefill_instance
        every = instances + d_instances
    served = every                       # the LLM instances (every process started, less encoders)
    sglang_flow = coordinator is not None and coordinator.flow == "sglang"

    def route(rid: int, i: int | None = None) -> None:
        if i is None:
            i = router.choose(rid)
        inst_of[rid] = i
        if sglang_flow:
            coordinator.on_arrival(rid)
        instances[i].submit(rid)

    epd_coord = None
    if epd is not None:
        from simulator.epd_flow import EPDCoordinator
        epd_coord = EPDCoordinator(env, epd, instances, route, router.choose, rng)
        every = every + epd_coord.encoders

    def dispatch(rid: int) -> bool:
        rec.t_seen[rid] = env.now
        why = refusal(pool, decode, inp[rid], out[rid])
        if why:
            rec.reject(rid, env.now, why)
            return False
        if epd_coord is not None and epd_coord.handles(rid):
            epd_coord.dispatch(rid)
            return True
        route(rid)
        return True

    # Run-ahead: in a colocated pool under open-loop arrivals, instances interact only through
    # dispatch (the router reads their state, submit wakes one), so each may step inline up to the
    # next dispatch instead of scheduling one SimPy event per step.  PD hand-offs, EPD encoders and
    # closed-loop clients (woken by finishes) react to an instance's steps, so those runs step with
    # one event per step whenever another event falls inside the step.
    gate = [-math.inf] if RUN_AHEAD and decode is None and epd is None and closed_loop is None else None
    for inst in instances:
        inst.gate = gate
    limit = math.inf if max_time_s is None else max_time_s

    for inst in every:
        env.process(inst.run(env))
    start_workload(env, rec, closed_loop, (pool.frontend_s, pool.frontend_s_per_token), dispatch, client_rng,
                   gate, limit)
    # Idle instances wait on untriggered events, so the schedule empties when the last request ends.
    # The run allocates millions of short-lived events and step tuples but builds no reference
    # cycles worth collecting; the cyclic collector's passes over them cost 10-20% of the run.
    collecting = gc.isenabled()
    gc.disable()
    try:
        if max_time_s is None:
            env.run()
        else:
            env.run(until=max_time_s)
    finally:
        if collecting:
            gc.enable()
    end = env.now
    if gate is not None:
        # Instances that ran ahead past the last event: the run ends with the last step, and their
        # resume gaps join the recorder in time order (stable: ties keep the instance order).
        for inst in instances:
            if inst.steps:
                t0, dt = inst.steps[-1][:2]
                end = max(end, t0 + dt)
        merged = sorted((g for inst in instances for g in inst.gap_log), key=lambda g: g[0])
        rec.resume_gaps.extend(g for _, g in merged)
    rec.close(end, max_time_s)
    return PoolRun(rec, list(served), end, coordinator, epd_coord)
