"""The instances of one pool over time: every incarnation, the serving ones the router sees, starts under way.

A restarted container or a new pod is a new incarnation with a new index
(:class:`~simulator.engine.opsrecord.Life` bills it); scaling is
:class:`~simulator.engine.pool_lifecycle.PoolLifecycle`'s, as for an encoder pool. A static pool (no
operations) is the same object whose lifecycle never fires: its instances go live at time 0 and serve to the
end.
"""

from __future__ import annotations

import simpy

from simulator.engine.dp_group import DPGroup
from simulator.engine.instance import Instance
from simulator.engine.opsrecord import Life
from simulator.engine.pool_lifecycle import PoolLifecycle, Start
from simulator.routing import make_router


def _interrupted_is_fine(event) -> None:
    """Callback on an instance process: its end by a crash or removal (an Interrupt) is expected;
    any other exception still stops the simulation."""
    if not event._ok and isinstance(event._value, simpy.Interrupt):
        event.defused = True


class OpsPool(PoolLifecycle):
    """The instances of one pool over time; ``active`` (serving, routable) is what the router sees and
    ``all`` every incarnation, in index order."""

    def __init__(self, ops, spec, gpus: int, starts) -> None:
        active: list[Instance] = []
        super().__init__(ops.env, spec.name, starts, ops.events, active)
        self.ops = ops
        self.spec = spec
        self.gpus = gpus
        self.all: list[Instance] = []
        self.router = make_router(spec.router, active)

    def make(self, cause: str, billed_s: float, group: DPGroup | None = None, rank: int = 0) -> Instance:
        """A new incarnation (the next index), with the run's ports to its neighbours and clock policy."""
        s = self.spec
        index = len(self.all)
        inst = Instance(
            index,
            s,
            self.ops.rec,
            Life(s.name, index, self.gpus, cause, billed_s),
            ports=self.ops.ports_for(self),
            stepping=self.ops.stepping,
            group=group,
            rank=rank,
        )
        if group is not None:
            group.members.append(inst)
        self.all.append(inst)
        self.ops.on_make(self, inst)
        return inst

    def start_initial(self) -> None:
        """The pool's instances at time 0: made, in lock-stepped data-parallel instances of ``spec.dp`` ranks
        (static pools only), then serving, in index order."""
        dp = self.spec.dp
        insts = []
        group = None
        for i in range(self.spec.instances):
            if dp > 1 and i % dp == 0:
                group = DPGroup(self.env, self.spec.step_model, dp, self.spec.dp_context_wait)
            insts.append(self.make("initial", 0.0, group, i % dp))
        for inst in insts:
            self.go_live(inst)

    def go_live(self, inst: Instance) -> None:
        inst.start(self.env).callbacks.append(_interrupted_is_fine)
        inst.life.ready_s = self.env.now
        self.active.append(inst)
        self.ops.on_live(self, inst)

    def launch(self, cause: str, delay_s: float | None, billed_s: float, backoff_s: float = 10.0) -> Start:
        """Start an incarnation that serves ``delay_s`` from now (never, if None); a crash of it restarts after
        ``backoff_s`` (a crash-looping container's back-off doubles: simulator.engine.opsengine)."""
        start = super().launch(cause, delay_s, billed_s)
        start.unit.backoff_s = backoff_s
        return start

    def _new(self, cause: str, billed_s: float) -> Start:
        inst = self.make(cause, billed_s)
        return Start(inst.life, inst)

    def _serve(self, start: Start) -> None:
        self.go_live(start.unit)

    def _retire(self, unit) -> None:
        unit.draining = True
        self.env.process(self._drain(unit))

    def _drain(self, inst: Instance):
        """Removed from routing; serves what it holds, then stops (billing ends)."""
        while not inst.dead and not inst.is_empty():
            yield self.env.timeout(1.0)
        if not inst.dead:
            inst.life.ended_s, inst.life.end = self.env.now, "removed"
            inst.stop()
