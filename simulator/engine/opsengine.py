"""The engine: one simulation of a scenario's pools in SimPy, static or with operations.

:class:`OpsRun` creates the environment; the workload (open-loop arrivals or closed-loop clients,
:mod:`simulator.engine.arrivals`), every instance, the PD proxy (:mod:`simulator.pd.pd_proxy`) and the EPD
proxy (:mod:`simulator.epd.epd_flow`) are processes or callbacks that receive it.  A static pool is a
run whose lifecycle never fires: without an ``operations`` block no instance crashes, starts or
leaves, and the run ends when its schedule empties.  With one, pools change over time:

* :class:`~simulator.engine.opspool.OpsPool`: every incarnation of a pool's instances (a restarted
  container or a new pod is a new incarnation with a new index), the list the router sees
  (serving ones only), starts under way, and billing (:class:`~simulator.engine.opsrecord.Life`);
  an encoder pool that autoscales: :mod:`simulator.engine.opsencoder`;
* a gateway that holds requests while a pool has no serving instance;
* crashes (:meth:`OpsRun.crash`): the instance's process stops at once (the
  step it was running produces nothing), its KV blocks and queues are gone,
  blocks held for it elsewhere are freed, and each request it held is
  failed, retried from scratch or re-prefilled elsewhere (``retry.policy``);
  the instance restarts through the cold-start and probe model.

Request accounting: every request ends exactly once, as completed, rejected,
failed (``Outcome.FAILED``, with the crash or "retries exhausted" as reason) or, past
``max_time_s``, unfinished.  Re-prefill continues a request by prefilling its
prompt plus the tokens it had generated and asking for the rest; its TTFT
keeps the first token of the first attempt and the wait is an ITL gap.
"""

from __future__ import annotations

import gc
import math
from collections import deque
from typing import cast

import simpy

from simulator.engine.arrivals import start_workload
from simulator.engine.instance import Instance
from simulator.engine.instance_state import Ports
from simulator.engine.opscrash import collect_and_clear
from simulator.engine.opsencoder import EncoderPool
from simulator.engine.opsobserve import observe
from simulator.engine.opspool import OpsPool
from simulator.engine.opsrecord import Life
from simulator.engine.records import PoolRun, Recorder, refusal
from simulator.engine.stepping import Stepping, choose
from simulator.epd.epd_flow import EPDCoordinator
from simulator.ops import faults as flt
from simulator.ops.autoscale import POLICIES, autoscaler
from simulator.pd.pd_proxy import PDCoordinator
from simulator.roles import ROLES
from simulator.summary_types import CrashRecord


class OpsRun:
    """One simulation, with or without operations; :meth:`run` returns a :class:`PoolRun`."""

    def __init__(self, scn, rec: Recorder, rng, starts_for, step_log: bool = True, shortcuts: bool = True) -> None:
        self.scn = scn
        self.shortcuts = shortcuts  # False: one SimPy event per step (simulator/engine/stepping.py)
        self.stepping = Stepping()  # the run's clock policy, chosen by run()
        # Without operations a run may keep no step log (its caller builds no step table); a lifecycle
        # counts steps on it (crashes, the FP8 hazard).
        self.step_log = step_log or scn.operations.enabled
        self.cfg = scn.operations
        self.rec = rec
        self.rng = rng
        self.starts_for = starts_for  # pool name -> StartTimes
        self.env = simpy.Environment()
        self.events: list[tuple] = []  # (time_s, pool, what, count, why)
        self.link_log: list[tuple] = []
        self.crashes: list[CrashRecord] = []
        self.arrived: list[float] = []
        self.sum_in = self.sum_out = 0
        self.limbo: deque[int] = deque()
        self.coord: PDCoordinator | None = None
        self.epd: EPDCoordinator | None = None  # the EPD proxy of a multimodal run
        self.encoder_lives: list[Life] = []  # billing records of the encoder tier's instances
        self.encoder_pool: EncoderPool | None = None  # an autoscaled encoder tier
        self.front: OpsPool  # the colocated or prefill pool (set by run()) and the decode pool
        self.back: OpsPool | None = None
        self.fp8: dict = {}
        self.coord_rng = None  # the KV fabric's jitter stream (as in the plain engine)
        self.client_rng = None  # closed-loop client delays (the scenario's "clients" stream)

    # ---- building -------------------------------------------------------------------------
    def ports_for(self, pool: OpsPool) -> Ports:
        """What ``pool``'s new instances call outside themselves: the PD proxy's hand-off (prefill pool) or
        transfer start (decode pool), and the EPD proxy's in-place encoder cost (a front pool that encodes
        its own images)."""
        coord, epd = self.coord, self.epd
        out = ROLES[pool.spec.role].fabric_side == "out"
        return Ports(
            hand_off=coord.hand_off if coord is not None and out else None,
            start_transfer=coord.start_transfer if coord is not None and not out else None,
            encode_cost=epd.inline_cost if epd is not None and pool is self.front and epd.encodes_inline else None,
        )

    def on_make(self, pool: OpsPool, inst: Instance) -> None:
        if self.coord is not None:
            self.coord.add(inst)
        if self.epd is not None and pool is self.front:
            self.epd.add_front(inst)

    def on_live(self, pool: OpsPool, inst: Instance) -> None:
        env, f = self.env, self.cfg.faults
        hz = self.fp8.get(pool.spec.name)
        if hz is not None and ROLES[pool.spec.role].decodes:
            env.process(flt.fp8_crash_process(env, inst, hz, self.rng, self.crash))
        if f.node_failure is not None and (not f.node_failure.pools or pool.spec.name in f.node_failure.pools):
            env.process(flt.node_failure_process(env, inst, f.node_failure.mtbf_s, self.rng, self.crash))
        if pool is self.front:
            while self.limbo and pool.active:
                self.dispatch(self.limbo.popleft())
        elif self.coord is not None:
            self.coord.flush()

    # ---- requests -------------------------------------------------------------------------
    def dispatch(self, rid: int) -> None:
        active = self.front.active
        if not active:
            self.limbo.append(rid)
            return
        self._submit(rid, active[self.front.router.choose(rid) % len(active)])

    def _submit(self, rid: int, inst: Instance) -> None:
        if self.coord is not None:
            self.rec.prefill_instance[rid] = inst.index
            self.coord.on_arrival(rid)
        else:
            self.rec.instance[rid] = inst.index
        inst.submit(rid)

    def arrive(self, rid: int) -> bool:
        """The engine sees ``rid`` (after its front end): admit it (True) or reject it at once (False)."""
        rec, now = self.rec, self.env.now
        inp, out = rec.input_tokens[rid], rec.output_tokens[rid]
        self.arrived.append(now)
        rec.sent_at[rid] = now
        if rec.t_seen[rid] != rec.t_seen[rid]:  # NaN: first attempt (a retry keeps its first front end)
            rec.t_seen[rid] = now
        self.sum_in += inp
        self.sum_out += out
        why = refusal(self.front.spec, self.back.spec if self.back else None, inp, out)
        if why:
            rec.reject(rid, now, why)
            return False
        self.send(rid)
        return True

    def send(self, rid: int) -> None:
        """Send an admitted request on: through the encoder tier if it has images for one, else to the front."""
        if self.epd is not None and self.epd.handles(rid):
            self.epd.dispatch(rid)
        else:
            self.dispatch(rid)

    def choose_front(self, rid: int) -> int | None:
        """The front instance the router picks for ``rid`` (its index), or None while none serves."""
        active = self.front.active
        return active[self.front.router.choose(rid) % len(active)].index if active else None

    def encoded(self, rid: int, i: int | None) -> None:
        """The encoder tier is done with ``rid`` and its embeddings reached front instance ``i``; if that
        one has since crashed or left routing (or none served), the gateway routes the request anew."""
        inst = None if i is None else self.front.all[i]
        if inst is None or inst.dead or inst.draining:
            self.dispatch(rid)
            return
        self._submit(rid, inst)

    # ---- crashes --------------------------------------------------------------------------
    def crash(self, inst: Instance, why: str, kind: str) -> None:
        """``inst`` dies now: its KV and queues are gone; its requests follow the retry policy."""
        if inst.dead:
            return
        now = self.env.now
        pool = cast(OpsPool, self.front if inst.pool == self.front.spec.name else self.back)  # back: PD's decode
        if inst in pool.active:
            pool.active.remove(inst)
        affected, lost = collect_and_clear(self, pool, inst)
        inst.stop()
        life = inst.life
        life.ended_s, life.end, life.lost_tokens = now, why, lost
        self.crashes.append(
            {
                "time_s": now,
                "pool": pool.spec.name,
                "instance": inst.index,
                "kind": kind,
                "reason": why,
                "requests": len(affected),
                "lost_kv_tokens": lost,
            }
        )
        for rid, g in affected:
            self.handle(rid, g, f"instance {pool.spec.name}#{inst.index} crashed at {now:.1f} s: {why}")
        st = pool.starts
        if inst.draining:
            return  # it was being removed: nothing to restart
        if kind == "node":
            mttr = self.cfg.faults.node_failure.mttr_s
            delay = st.new_delay()
            pool.launch("replacement", None if delay is None else mttr + delay, now + mttr + st.provisioning_s)
        else:
            ran = now - (life.ready_s if life.ready_s is not None else now)
            backoff = 10.0 if ran >= 600 else inst.backoff_s
            delay = st.restart_delay()
            pool.launch("restart", None if delay is None else backoff + delay, now, min(2 * backoff, 300.0))

    def handle(self, rid: int, g: int, why: str) -> None:
        """A request lost its instance after ``g`` tokens of this attempt: fail, retry or re-prefill."""
        rec, pol = self.rec, self.cfg.retry
        now = self.env.now
        rec.attempt[rid] += 1
        if pol.policy == "none" or rec.retries[rid] >= pol.max_retries:
            reason = why if pol.policy == "none" else f"retries exhausted ({rec.retries[rid]}): {why}"
            rec.fail(rid, now, reason, g + rec.carried[rid])
            return
        rec.retries[rid] += 1
        if pol.policy == "retry":
            rec.discarded[rid] += g + rec.carried[rid]
            rec.carried[rid] = 0
            rec.input_tokens[rid], rec.output_tokens[rid] = rec.orig_input[rid], rec.orig_output[rid]
            rec.first_orig[rid] = rec.sched_orig[rid] = rec.resumed_from[rid] = math.nan
            rec.pd_orig.pop(rid, None)
        elif g:
            rec.carried[rid] += g
            rec.input_tokens[rid] += g
            rec.output_tokens[rid] -= g
            if rec.first_orig[rid] != rec.first_orig[rid]:
                rec.first_orig[rid], rec.sched_orig[rid] = rec.t_first[rid], rec.t_sched[rid]
                rec.pd_orig[rid] = (rec.t_prefilled[rid], rec.t_kv_start[rid], rec.t_kv_done[rid])
            rec.resumed_from[rid] = now
        rec.t_first[rid] = rec.t_sched[rid] = math.nan
        rec.sent_at[rid] = now
        # Its embeddings went with the crashed instance: a request with images is encoded again
        # (an encoder that still caches an image serves it as a hit).
        self.send(rid)

    # ---- the run --------------------------------------------------------------------------
    def run(
        self,
        front_spec,
        front_gpus: int,
        closed_loop=None,
        max_time_s=None,
        back_spec=None,
        back_gpus=0,
        plan=None,
        contexts=None,
        epd=None,
    ) -> PoolRun:
        """Serve every request of the recorder; ``epd`` (a :class:`simulator.epd.epd.EPDSetup`): requests with
        images go through the encoder tier first, or the front pool encodes them (:mod:`simulator.epd.epd_flow`)."""
        env, rec, cfg = self.env, self.rec, self.cfg
        rec.all_ended = env.event()
        static = not cfg.enabled
        self.stepping = stepping = choose(
            static=static,
            pd=back_spec is not None,
            epd=epd is not None,
            closed_loop=closed_loop is not None,
            decode_dp=back_spec.dp if back_spec is not None else 1,
            step_log=self.step_log,
            shortcuts=self.shortcuts,
        )
        gate = stepping.gate
        self.front = OpsPool(self, front_spec, front_gpus, self.starts_for[front_spec.name])
        if back_spec is not None:
            self.back = OpsPool(self, back_spec, back_gpus, self.starts_for[back_spec.name])
            self.coord = PDCoordinator(
                env, plan, [], self.back.all, self.back.router, rec, self.coord_rng, serving=self.back.active
            )
            self.coord.lazy = stepping.lazy_decode  # it catches its decode instances up before routing
        pools = [p for p in (self.front, self.back) if p is not None]
        if epd is not None:
            self.epd = EPDCoordinator(env, epd, [], self.encoded, self.choose_front, self.coord_rng)
        self.fp8 = flt.fp8_hazard(cfg.faults.fp8_crash, self.scn.pools, self.scn.hwdb)
        for pool in pools:
            pool.start_initial()
        enc_gpus = epd.encoder_pool.tp if epd is not None and epd.encoder_pool is not None else 0
        for enc in self.epd.encoders if self.epd is not None else ():
            enc.life = life = Life(enc.pool, enc.index, enc_gpus, "initial", 0.0, ready_s=0.0)
            self.encoder_lives.append(life)
            env.process(enc.run(env))
        if self.coord is not None and cfg.faults.link_degradation is not None:
            self.coord.degrade(cfg.faults.link_degradation, self.rng, self.link_log)
        for name, acfg in cfg.autoscale.items():
            if self.epd is not None and name == epd.encoder_pool.name:
                tier = self.encoder_pool = EncoderPool(
                    env, self.epd, self.starts_for[front_spec.name], self.events, self.encoder_lives, enc_gpus
                )
                policy = POLICIES[acfg.policy](acfg, None)
                env.process(autoscaler(env, tier, acfg, policy, lambda p=tier, c=acfg: p.observe(c)))
                continue
            pool = next(p for p in pools if p.spec.name == name)
            policy = POLICIES[acfg.policy](acfg, contexts[name])
            env.process(autoscaler(env, pool, acfg, policy, lambda p=pool, c=acfg: observe(self, p, c)))
        if cfg.queue_timeout_s is not None:
            env.process(self._expire_queued(env, cfg.queue_timeout_s))
        limit = math.inf if max_time_s is None else max_time_s
        start_workload(env, rec, closed_loop, front_spec.frontend, self.arrive, self.client_rng, gate, limit)
        # A static run's idle instances wait on untriggered events, so its schedule empties when the last
        # request ends; the lifecycle's processes (autoscalers, fault clocks) never end, so a run with
        # operations stops when every request has ended.
        if static:
            stop = max_time_s
        else:
            stop = rec.all_ended if max_time_s is None else env.any_of([rec.all_ended, env.timeout(max_time_s)])
        # The run allocates millions of short-lived events and step tuples but builds no reference
        # cycles worth collecting; the cyclic collector's passes over them cost 10-20% of the run.
        collecting = gc.isenabled()
        gc.disable()
        try:
            env.run(until=stop)
        finally:
            if collecting:
                gc.enable()
        end = env.now
        caught = self.back.all if stepping.lazy_decode and self.back is not None else []
        ahead = self.front.all if gate is not None else caught
        for inst in caught:
            inst.catch_up(limit)  # the steps it owes, up to the time limit
        if ahead:
            # Instances that ran ahead past the last event, or stepped lazily: the run ends with the last
            # step, and their resume gaps join the recorder in time order (stable: ties keep the instance
            # order).
            for inst in ahead:
                if inst.steps:
                    end = max(end, inst.steps.end())
            merged = sorted((g for inst in ahead for g in inst.gap_log), key=lambda g: g[0])
            rec.resume_gaps.extend(g for _, g in merged)
            env._now = end  # the clock where SimPy's last event would have left it
        rec.close(end, max_time_s)
        for pool in pools:
            for inst in pool.all:
                if inst.life.ended_s is None:
                    inst.life.ended_s = end
        self.end = end
        return PoolRun(rec, [i for p in pools for i in p.all], end, self.coord, self.epd)

    def _expire_queued(self, env, timeout: float):
        """Reject requests whose current attempt is still unscheduled ``timeout`` seconds after the gateway
        took it (arrival or re-send), unless it already streamed tokens (a re-prefilled continuation).
        Queues are edited in place: the instance processes hold references to them."""
        rec = self.rec
        period = min(1.0, timeout / 10)
        why = f"timeout: not scheduled within queue_timeout_s={timeout:g} s"
        while True:
            yield env.timeout(period)
            cut = env.now - timeout

            def stale(rid, cut=cut):
                return rec.sent_at[rid] <= cut and rec.t_sched[rid] != rec.t_sched[rid] and not rec.carried[rid]

            for inst in self.front.all:
                if inst.dead:
                    continue
                for rid in inst.expire(stale):
                    rec.expire(rid, env.now, why)
            if self.limbo:
                gone = [rid for rid in self.limbo if stale(rid)]
                if gone:
                    keep = [rid for rid in self.limbo if not stale(rid)]
                    self.limbo.clear()
                    self.limbo.extend(keep)
                    for rid in gone:
                        rec.expire(rid, env.now, why)
