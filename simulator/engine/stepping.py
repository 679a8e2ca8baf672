"""How a run's instances advance the clock, chosen once per run: :class:`Stepping`, :func:`choose`.

Each instance is a SimPy process, and by default each of its steps is one SimPy timeout.  Three shortcuts
leave the results unchanged (tests/test_run_ahead.py compares every one with one event per step):

* **inline steps**: a decode-only step that ends before any other event advances the clock inline, and
  decode-only steps skip the general step's empty branches;
* **run-ahead**: in a static colocated pool under open-loop arrivals the instances interact only through
  dispatch (the router reads their state, a submit wakes one), so each steps without SimPy events up to the
  next dispatch, whose time the arrivals write into a gate the pool's instances share.  PD hand-offs, EPD
  encoders, closed-loop clients (woken by finishes) and the lifecycle (crashes, scaling) react to an
  instance's steps, so those runs step with one event per step whenever another event falls inside one;
* **lazy decode**: in a static PD run under open-loop arrivals (one rank per decode instance) a decode
  instance that pulls no KV meets the rest of the run only at hand-offs, so it steps when the PD proxy
  catches it up before each hand-off (:meth:`simulator.engine.instance_state.InstanceState.catch_up`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Stepping:
    """The clock policy of one run, given to every instance when it is made.

    ``inline``: inline decode-only steps; ``gate``: run-ahead's one-element list holding the time of the next
    event that can look at or change the pool's instances (None: no run-ahead; an instance then steps ahead
    only while SimPy has nothing else due); ``lazy_decode``: decode instances step lazily; ``step_log``: the
    instances keep a step log (False: no step table will be built)."""

    inline: bool = False
    gate: list[float] | None = None
    lazy_decode: bool = False
    step_log: bool = True


def choose(
    *, static: bool, pd: bool, epd: bool, closed_loop: bool, decode_dp: int, step_log: bool, shortcuts: bool = True
) -> Stepping:
    """The clock policy of a run (see the module); ``static``: no operations; ``decode_dp``: ranks per decode
    instance; ``shortcuts`` False: one SimPy event per step, the reference the shortcuts are tested against."""
    open_static = shortcuts and static and not epd and not closed_loop
    return Stepping(
        inline=shortcuts,
        gate=[-math.inf] if open_static and not pd else None,
        lazy_decode=open_static and pd and decode_dp == 1,
        step_log=step_log,
    )
