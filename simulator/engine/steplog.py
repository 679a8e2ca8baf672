"""The per-step log of one instance, kept flat.

A step is nine consecutive entries of one list, in the order of :data:`STEP_COLUMNS`
(``simulator.engine.results``): start (s), duration (s), decode tokens, prefill tokens, first tokens,
batch size, waiting requests at the step's end, KV blocks in use, preemptions.  Flat, not a tuple per
step: the engine extends the list with a short-lived tuple (as cheap as appending it), so no container
object per step outlives the step (none for the garbage collector to track, less memory), and the step
table is built by one ``numpy.fromiter`` over the lists (docs/performance.md has the figures).
"""

from __future__ import annotations

from collections.abc import Callable

NCOL = 9
LogRow = Callable[[tuple], None]  # StepLog.add: logs one step's nine entries


class StepLog:
    """``add((start, duration, decode, prefill, first, batch, waiting, kv, preempted))`` logs one step;
    ``len`` is the number of steps; iteration gives each step as a tuple in that order."""

    __slots__ = ("flat", "add")

    def __init__(self) -> None:
        self.flat: list = []
        self.add: LogRow = self.flat.extend

    def __len__(self) -> int:
        return len(self.flat) // NCOL

    def __iter__(self):
        it = iter(self.flat)
        return zip(*[it] * NCOL, strict=True)

    def column(self, j: int) -> list:
        """Column ``j`` (0 = start, 1 = duration, ...) as a list, in step order."""
        return self.flat[j::NCOL]

    def end(self) -> float:
        """When the last step ended (s); the log must not be empty."""
        return self.flat[-NCOL] + self.flat[1 - NCOL]
