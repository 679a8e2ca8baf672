"""Records of an operations run: requests that can fail, and instance incarnations with their billing.

:class:`OpsRecorder` is the engine's :class:`~simulator.engine.Recorder` plus what
crashes and retries need: the ``Outcome.FAILED`` outcome, per-request retry counts and
tokens discarded or carried over, the original lengths of re-prefilled requests,
and an event that fires when every request has ended.  :class:`Life` is one
incarnation of an instance (a restarted container or a new pod is a new one).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.engine import Recorder
from simulator.outcome import Outcome


class OpsRecorder(Recorder):
    """A :class:`Recorder` that also records failures and says when every request has ended."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        n = len(self.input_tokens)
        self.ended = 0
        self.all_ended = None                # a SimPy event, set by OpsRun
        self.retries = [0] * n
        self.discarded = [0] * n             # tokens streamed by attempts the client threw away
        self.carried = [0] * n               # tokens a re-prefilled continuation had already produced
        self.orig_input = list(self.input_tokens)
        self.orig_output = list(self.output_tokens)
        self.first_orig = [math.nan] * n     # first token of the first attempt (re-prefill)
        self.sched_orig = [math.nan] * n     # when the first attempt was scheduled (re-prefill)
        self.resumed_from = [math.nan] * n   # crash time a re-prefilled request resumes from
        self.sent_at = [math.nan] * n        # when the gateway took this attempt (arrival or re-send)

    def _end(self) -> None:
        self.ended += 1
        if self.ended == len(self.outcome) and self.all_ended is not None:
            self.all_ended.succeed()

    def finish(self, rid: int, now: float, instance: int, generated: int) -> None:
        super().finish(rid, now, instance, generated)
        self._end()

    def reject(self, rid: int, now: float, reason: str) -> None:
        super().reject(rid, now, reason)
        self._end()

    def expire(self, rid: int, now: float, reason: str) -> None:
        """Reject a request that was already dispatched (a queue timeout)."""
        super().reject(rid, now, reason)
        if self.waiters is not None:
            self.waiters.pop(rid).succeed()
        self._end()

    def fail(self, rid: int, now: float, reason: str, generated: int) -> None:
        if self.outcome[rid] != Outcome.PENDING:
            raise RuntimeError(f"request {rid} ended twice")
        self.outcome[rid] = Outcome.FAILED
        self.reason[rid] = reason
        self.t_finish[rid] = now
        self.generated[rid] = generated
        if self.waiters is not None:
            self.waiters.pop(rid).succeed()
        self._end()


@dataclass
class Life:
    """One incarnation of an instance: billed from ``billed_s`` to ``ended_s`` (seconds)."""

    pool: str
    index: int
    gpus: int
    cause: str                  # initial | scale-up | restart | replacement
    billed_s: float
    ready_s: float | None = None
    ended_s: float | None = None
    end: str = ""               # crash reason, "removed" (scale-down), "cancelled", or "" (alive at the end)
    lost_tokens: int = 0        # KV tokens lost in a crash
