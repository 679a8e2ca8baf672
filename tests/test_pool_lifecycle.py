"""The one pool lifecycle that language-model and encoder pools share (simulator/engine/pool_lifecycle.py), on a
real SimPy clock with a pool of plain units: starts serve after their delay, a scale-down cancels the newest
starts before it retires the newest serving units and always leaves one serving, a start that is never ready
stays counted and says why, and every change is billed and logged."""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from simulator.engine.opsrecord import Life
from simulator.engine.pool_lifecycle import PoolLifecycle, Start


@dataclass
class Starts:
    """StartTimes' interface: a scale-up serves ``delay`` after the decision (None: never)."""

    delay: float | None
    provisioning_s: float = 5.0

    def new_delay(self) -> float | None:
        return self.delay

    def never_reason(self, cause: str) -> str:
        return f"{cause} pods crash-loop"


class Units(PoolLifecycle):
    """Units made at launch, serving at once, retired when told."""

    def __init__(self, env, starts) -> None:
        super().__init__(env, "u", starts, [], [])
        self.retired: list[Life] = []

    def _new(self, cause: str, billed_s: float) -> Start:
        return Start(Life("u", 0, 1, cause, billed_s), unit=object())

    def _serve(self, start: Start) -> None:
        start.life.ready_s = self.env.now
        self.active.append(start)

    def _retire(self, unit) -> None:
        unit.life.ended_s, unit.life.end = self.env.now, "removed"
        self.retired.append(unit.life)


def test_scale_ups_serve_after_their_delay_and_scale_downs_cancel_starts_first():
    env = simpy.Environment()
    pool = Units(env, Starts(delay=30.0))
    pool.scale_up(2, "queue")
    env.run(until=10.0)
    pool.scale_up(2, "queue again")
    assert pool.present == 4 and not pool.active
    env.run(until=35.0)  # the first two serve at 30 s, the others at 40 s
    assert len(pool.active) == 2 and len(pool.starting) == 2
    assert [su.start.life.ready_s for su in pool.scaleups] == [30.0, 30.0, None, None]
    assert [su.decided_s for su in pool.scaleups] == [0.0, 0.0, 10.0, 10.0]
    assert all(su.start.life.billed_s == su.decided_s + 5.0 for su in pool.scaleups)

    pool.scale_down(1, "idle")  # the newest start
    assert pool.scaleups[3].start.cancelled and not pool.scaleups[2].start.cancelled
    pool.scale_down(2, "idle")  # the other start, then the newest serving unit
    cancelled = [su.start for su in pool.scaleups[2:]]
    assert all(s.cancelled and s.life.end == "cancelled" and s.life.ended_s == 35.0 for s in cancelled)
    assert len(pool.active) == 1 and pool.retired == [pool.scaleups[1].start.life]
    env.run(until=60.0)
    assert all(s.life.ready_s is None for s in cancelled)  # a cancelled start never serves
    pool.scale_down(5, "idle")  # the last serving unit stays
    assert len(pool.active) == 1 and pool.present == 1
    assert [(t, a, n) for t, _, a, n, _ in pool.events] == [
        (0.0, "scale-up", 2),
        (10.0, "scale-up", 2),
        (35.0, "scale-down", 1),
        (35.0, "scale-down", 2),
        (60.0, "scale-down", 0),
    ]


def test_a_start_that_is_never_ready_stays_counted_and_says_why():
    env = simpy.Environment()
    pool = Units(env, Starts(delay=None))
    pool.scale_up(1, "queue")
    env.run(until=1000.0)
    (su,) = pool.scaleups
    assert pool.present == 1 and not pool.active
    assert su.start.life.ready_s is None and su.start.life.end == "never ready: scale-up pods crash-loop"
    pool.scale_down(1, "idle")  # cancelling it ends its billing
    assert pool.present == 0 and su.start.life.end == "cancelled" and su.start.life.ended_s == 1000.0
