"""How a request ended: the :class:`Outcome` of every request of a run.

A recorder holds one outcome per request, ``PENDING`` until the request ends;
it ends exactly once (a second end is a simulator bug and raises).  The
requests table writes the outcome's :attr:`Outcome.label`, the strings users
filter on ("completed", "rejected", "unfinished", "failed").
"""

from __future__ import annotations

from enum import IntEnum


class Outcome(IntEnum):
    """A request's end.  ``FAILED`` occurs only in runs with operations (crashes)."""

    PENDING = 0  # not ended yet; never in a finished run's table
    COMPLETED = 1  # every output token generated
    REJECTED = 2  # refused at admission (too long for the engine) or expired in a queue
    UNFINISHED = 3  # still in flight at the run's time limit
    FAILED = 4  # lost to a crash (retry policy "none") or retries exhausted

    @property
    def label(self) -> str:
        """The string in the requests table."""
        return self.name.lower()


# Labels by outcome value, for building a table's column without an Enum lookup per request.
LABELS = tuple(o.label for o in Outcome)
# The table's categories: a run without operations never fails a request, and its table lists no "failed".
STATIC_OUTCOMES = (Outcome.PENDING, Outcome.COMPLETED, Outcome.REJECTED, Outcome.UNFINISHED)
