"""What every autoscaled pool does over time, language-model and encoder pools alike: :class:`PoolLifecycle`.

A pool holds the units that serve (``active``, what its router or proxy sends work to) and the incarnations
on their way (``starting``, one :class:`Start` each).  A scale-up starts ``n`` incarnations that serve after
the pool's start delay; a scale-down cancels starts first (newest first), then takes the newest serving units
out of routing (one always stays), each of which finishes what it holds before it is removed.  Every
incarnation is billed by its :class:`~simulator.engine.opsrecord.Life`.  The two kinds of pool differ only in
what a unit is, when it is made and how it drains (:class:`~simulator.engine.opspool.OpsPool`,
:class:`~simulator.engine.opsencoder.EncoderPool`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simulator.engine.opsrecord import Life


@dataclass(eq=False)
class Start:
    """One incarnation on its way to serving: its billing record, the unit made at launch (a language-model
    pool's instance; None for an encoder, made when it serves) and whether a scale-down cancelled it."""

    life: Life
    unit: Any = None
    cancelled: bool = False


@dataclass(frozen=True)
class ScaleUpStart:
    """One incarnation a scale-up started: when the autoscaler decided it (seconds) and its :class:`Start`;
    it serves from ``start.life.ready_s`` (None: not yet, or never)."""

    decided_s: float
    start: Start


class PoolLifecycle:
    """The units of one pool over time (see the module).  ``events``: the run's operations log, appended
    ``(time_s, pool, action, count, why)``; ``starts``: the pool's :class:`simulator.ops.opsstart.StartTimes`;
    ``decisions``: the autoscaler's ``(time_s, present, proposed, target)``, appended by it."""

    def __init__(self, env, name: str, starts, events: list, active: list) -> None:
        self.env = env
        self.name = name
        self.starts = starts
        self.events = events
        self.active = active
        self.starting: list[Start] = []
        self.decisions: list[tuple] = []
        self.scaleups: list[ScaleUpStart] = []

    @property
    def present(self) -> int:
        """Units serving or on their way (what the autoscaler counts)."""
        return len(self.active) + len(self.starting)

    # ---- what differs between pools ------------------------------------------------------------
    def _new(self, cause: str, billed_s: float) -> Start:
        """A new incarnation's :class:`Start` (billed from ``billed_s``)."""
        raise NotImplementedError

    def _serve(self, start: Start) -> None:
        """``start``'s incarnation serves from now on."""
        raise NotImplementedError

    def _retire(self, unit) -> None:
        """``unit``, just taken out of ``active``: finishes what it holds, then is removed (billing ends)."""
        raise NotImplementedError

    # ---- the lifecycle -------------------------------------------------------------------------
    def launch(self, cause: str, delay_s: float | None, billed_s: float) -> Start:
        """Start an incarnation that serves ``delay_s`` from now (never, if None: billed, counted, not serving)."""
        start = self._new(cause, billed_s)
        self.starting.append(start)
        self.env.process(self._start(delay_s, start))
        return start

    def _start(self, delay_s: float | None, start: Start):
        if delay_s is None:
            start.life.end = "never ready: " + self.starts.never_reason(start.life.cause)
            return  # a crash-looping pod: billed, never serving, stays counted as starting
        yield self.env.timeout(delay_s)
        if start.cancelled:
            return
        self.starting.remove(start)
        self._serve(start)

    def scale_up(self, n: int, why: str) -> None:
        now = self.env.now
        delay = self.starts.new_delay()
        for _ in range(n):
            start = self.launch("scale-up", delay, now + self.starts.provisioning_s)
            self.scaleups.append(ScaleUpStart(now, start))
        self.events.append((now, self.name, "scale-up", n, why))

    def scale_down(self, n: int, why: str) -> None:
        """Cancel starts first (newest first), then retire the newest serving units (one stays)."""
        now = self.env.now
        done = 0
        while done < n and self.starting:
            start = self.starting.pop()
            start.cancelled = True
            life = start.life
            life.ended_s, life.end = max(now, life.billed_s), "cancelled"
            done += 1
        while done < n and len(self.active) > 1:
            self._retire(self.active.pop())
            done += 1
        self.events.append((now, self.name, "scale-down", done, why))
