"""An instance's lifecycle: its SimPy process started and stopped, and what the operations engine does to it.

:class:`InstanceLifecycle` adds to :class:`~simulator.engine.instance_state.InstanceState` the calls made
on an instance as a whole rather than on one of its requests: :meth:`~InstanceLifecycle.start` and
:meth:`~InstanceLifecycle.stop` its process, and, under operations (:mod:`simulator.engine.opsengine`),
the queue timeout taking stale requests out (:meth:`~InstanceLifecycle.expire`), a pull whose prefill
instance died given up (:meth:`~InstanceLifecycle.withdraw`), and a crash emptying it
(:meth:`~InstanceLifecycle.crash`).  :class:`simulator.engine.instance.Instance` adds the process itself.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any, cast

from simulator.engine.instance_state import InstanceState
from simulator.engine.steplog import StepLog

if TYPE_CHECKING:
    from simpy.core import Environment
    from simpy.events import Event, Process


class InstanceLifecycle(InstanceState):
    """An instance's state (:class:`InstanceState`) and the calls that start, stop, expire, withdraw from
    or crash it."""

    def run(self, env: Environment) -> Generator[Event, Any, None]:
        """The SimPy process that steps the instance: :class:`simulator.engine.instance.Instance`'s."""
        raise NotImplementedError

    def start(self, env):
        """Start the instance's SimPy process (:meth:`run`); returns it."""
        self._env = env
        self._gen = self.run(env)
        self.proc = env.process(self._gen)
        return self.proc

    def stop(self) -> None:
        """Mark the instance dead and end its process (what it held is not touched: see :meth:`crash`)."""
        self.dead = True
        cast("Process", self.proc).interrupt()

    def expire(self, stale) -> list[int]:
        """Take the waiting requests for which ``stale(rid)`` holds (never a preempted one) out of the
        queue, in queue order; returns them.  The queue is edited in place (the process holds it)."""
        requeue = self._requeue
        gone = [rid for box in (self.inbox, self.waiting) for rid in box if rid not in requeue and stale(rid)]
        if gone:
            out = set(gone)
            for box in (self.inbox, self.waiting):
                keep = [rid for rid in box if rid not in out]
                box.clear()
                box.extend(keep)
            self.outstanding -= len(gone)
            for rid in gone:
                self.unqueue(rid)
        return gone

    def withdraw(self, rid: int) -> str:
        """Decode role: ``rid``'s KV will never come (its prefill instance died).  Drops it from the
        remote queue ("remote") or frees the blocks allocated for its pull ("receiving"); "" if neither."""
        if rid in self.remote:
            self.remote.remove(rid)
            self.unqueue(rid)
            self.outstanding -= 1
            return "remote"
        if rid in self.receiving:
            self.receiving.discard(rid)
            self._freed += -(-(self.rec.input_tokens[rid] - 1) // self.block)
            self.outstanding -= 1
            self._wake()
            return "receiving"
        return ""

    def crash(self):
        """The instance dies now: its KV blocks, queues and prefix cache are gone (its process must be
        stopped by the caller, after the other side of its transfers is settled).

        Returns ``(affected, lost, held, remote, receiving)``: each request it held with the tokens its
        current attempt had produced (running, then waiting, held, remote, receiving, ready), the KV
        tokens lost, and the requests whose transfers other instances take part in (held here for a
        pull; queued or being pulled from a prefill instance).
        """
        self.dead = True
        inp = self.rec.input_tokens
        affected: list[tuple[int, int]] = []
        lost = 0
        order, prefill, dec_start = self._live if self._live is not None else ({}, {}, {})
        s = len(cast(StepLog, self.steps))  # kept: an operations run keeps its step log
        for rid in order:
            if rid in dec_start:
                sd, ld, g0 = dec_start[rid]
                affected.append((rid, g0 + s - sd))
                lost += ld + s - sd
            else:
                pf = prefill[rid]
                affected.append((rid, pf[2]))
                lost += pf[0]
        for rid in (*self.waiting, *self.inbox):
            rq = self._requeue.get(rid)
            affected.append((rid, rq[2] if rq is not None else 0))
        held = list(self.held)
        for rid in held:  # prefill role: KV kept for a pull that will not come
            lost += inp[rid]
            affected.append((rid, 0))
        remote: list[int] = []
        receiving: list[int] = []
        if self.role.pulls_kv:
            remote, receiving = list(self.remote), list(self.receiving)
            affected.extend((rid, 0) for rid in remote)
            affected.extend((rid, 0) for rid in receiving)
            for rid in self.ready:
                lost += inp[rid] - 1
                affected.append((rid, 0))
        for box in (
            self.waiting,
            self.inbox,
            self._requeue,
            self._queued,
            self.held,
            self.remote,
            self.receiving,
            self.ready,
            self.last_tok,
            order,
            prefill,
            dec_start,
        ):
            box.clear()
        if self.prefix is not None:
            self.prefix.clear()
        self.kv_used = self.outstanding = self.n_running = self._freed = self.queued_kv = 0
        self.wake = None
        return affected, lost, held, remote, receiving
