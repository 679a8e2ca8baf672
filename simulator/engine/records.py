"""The engine's records and pool description: what a run (:class:`simulator.engine.opsengine.OpsRun`) fills in.

:class:`Recorder` holds per-request records as plain Python lists, turned into DataFrames at the
end (``simulator.engine.results``); :class:`PoolSpec` is what the engine needs to build a pool's
instances; :class:`PoolRun` is a run's raw output; :func:`refusal` is the one admission check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from simulator.engine.frontend import FrontEnd
from simulator.engine.instance import Instance
from simulator.engine.outcome import Outcome

if TYPE_CHECKING:
    from collections.abc import Callable

    from simpy.events import Event

    from hwdb.engine_schema import AdmissionRule
    from simulator.epd.epd_flow import EPDCoordinator
    from simulator.memory import MemoryPlan
    from simulator.pd.pd_proxy import PDCoordinator
    from simulator.stepmodel import StepModel

PENDING = Outcome.PENDING


class Recorder:
    """Per-request records, indexed by request id (0..n-1).  Times in seconds.

    Every request ends exactly once (:meth:`finish`, :meth:`reject`, :meth:`expire`, :meth:`fail`, or
    :meth:`close` at the end of the run); a second end raises.  ``all_ended`` (a SimPy event the run
    sets) fires when the last one ends.  Crashes and retries (operations) rewrite a request's lengths
    per attempt; the original ones are kept to restore (:meth:`finalize`).
    """

    def __init__(self, input_tokens, output_tokens, arrival_s, hash_ids=None, hash_block_tokens=None) -> None:
        n = len(input_tokens)
        nan = math.nan
        self.input_tokens = [int(x) for x in input_tokens]
        self.output_tokens = [int(x) for x in output_tokens]
        self.arrival = [float(x) for x in arrival_s]
        self.t_sched = [nan] * n
        self.t_seen = [nan] * n  # the engine sees the request (after the front end)
        self.t_first = [nan] * n
        self.t_finish = [nan] * n
        self.t_prefilled = [nan] * n  # PD: prefill instance finished the prompt
        self.t_kv_start = [nan] * n  # PD: decode instance allocated blocks, pull starts
        self.t_kv_done = [nan] * n  # PD: KV arrived on the decode instance
        self.prefill_instance = [-1] * n  # PD: which prefill instance ran the prompt
        self.instance = [-1] * n
        self.preemptions = [0] * n
        self.hash_ids = hash_ids  # per request: tuple of prompt block hashes, or None
        self.hash_block_tokens = hash_block_tokens
        self.cached_tokens = [0] * n  # prompt tokens served from the prefix cache
        self.generated = [0] * n
        self.outcome: list[Outcome] = [PENDING] * n
        self.attempt = [0] * n  # bumped at every crash: stale transfer completions ignore it
        self.reason = [""] * n
        self.resume_gaps: list[float] = []
        self.waiters: dict[int, Event] | None = None
        self.ended = 0
        self.all_ended: Event | None = None  # set by the run
        self.retries = [0] * n
        self.discarded = [0] * n  # tokens streamed by attempts the client threw away
        self.carried = [0] * n  # tokens a re-prefilled continuation had already produced
        self.orig_input = list(self.input_tokens)
        self.orig_output = list(self.output_tokens)
        self.first_orig = [nan] * n  # first token of the first attempt (re-prefill)
        self.sched_orig = [nan] * n  # when the first attempt was scheduled (re-prefill)
        self.pd_orig: dict[int, tuple] = {}  # PD: the first attempt's (t_prefilled, t_kv_start, t_kv_done)
        self.resumed_from = [nan] * n  # crash time a re-prefilled request resumes from
        self.sent_at = [nan] * n  # when the gateway took this attempt (arrival or re-send)
        self.finalized = False
        # callback(rid, outcome, now) at every end (simulator.goodput.VerdictWatch)
        self.watch: Callable[[int, Outcome, float], None] | None = None

    def _end(
        self,
        rid: int,
        outcome: Outcome,
        now: float,
        reason: str | None = None,
        generated: int | None = None,
        wake: bool = True,
    ) -> None:
        """End ``rid`` once (a second end is a simulator bug); ``wake``: its closed-loop user stops waiting."""
        if self.outcome[rid] != PENDING:
            raise RuntimeError(f"request {rid} ended twice")
        self.outcome[rid] = outcome
        self.t_finish[rid] = now
        if reason is not None:
            self.reason[rid] = reason
        if generated is not None:
            self.generated[rid] = generated
        if self.watch is not None:
            self.watch(rid, outcome, now)
        if wake and self.waiters is not None:
            self.waiters.pop(rid).succeed()
        self.ended += 1
        if self.ended == len(self.outcome) and self.all_ended is not None:
            self.all_ended.succeed()

    def finish(self, rid: int, now: float, instance: int, generated: int) -> None:
        self._end(rid, Outcome.COMPLETED, now, generated=generated)

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
            raise RuntimeError(
                f"simulation stalled at t={end:.6g} s: {len(stuck)} requests never ended "
                f"(first: request {stuck[0]}); no process was left to serve them"
            )
        for rid, o in enumerate(outcome):
            if o == PENDING:
                outcome[rid] = Outcome.UNFINISHED
                self.reason[rid] = f"still in flight at the time limit {max_time_s} s"

    def reject(self, rid: int, now: float, reason: str) -> None:
        """Refused at admission: its closed-loop user learns it from the send and does not wait."""
        self._end(rid, Outcome.REJECTED, now, reason, wake=False)

    def expire(self, rid: int, now: float, reason: str) -> None:
        """Reject a request that was already dispatched (a queue timeout): its client stops waiting."""
        self._end(rid, Outcome.REJECTED, now, reason)

    def fail(self, rid: int, now: float, reason: str, generated: int) -> None:
        """A crash ended the request (retry policy "none", or retries exhausted) after ``generated`` tokens."""
        self._end(rid, Outcome.FAILED, now, reason, generated)

    def finalize(self) -> None:
        """Undo the per-attempt rewriting of re-prefilled requests (operations runs): original lengths,
        the first token of the first attempt, tokens carried over; the wait from the crash to the
        resumed token is an ITL gap.  Idempotent; a no-op for a run in which nothing crashed."""
        if self.finalized:
            return
        self.finalized = True
        if not any(self.attempt):  # only a crash (which bumps the attempt) rewrites a request
            return
        for rid in range(len(self.outcome)):
            if self.carried[rid] and self.outcome[rid] == Outcome.COMPLETED:
                self.generated[rid] += self.carried[rid]
            if self.resumed_from[rid] == self.resumed_from[rid] and self.t_first[rid] == self.t_first[rid]:
                self.resume_gaps.append(self.t_first[rid] - self.resumed_from[rid])
            if self.first_orig[rid] == self.first_orig[rid]:
                # The TTFT split is the first attempt's, whose first token the row keeps.
                self.t_first[rid], self.t_sched[rid] = self.first_orig[rid], self.sched_orig[rid]
                if rid in self.pd_orig:
                    self.t_prefilled[rid], self.t_kv_start[rid], self.t_kv_done[rid] = self.pd_orig[rid]
            self.input_tokens[rid], self.output_tokens[rid] = self.orig_input[rid], self.orig_output[rid]


@dataclass(frozen=True)
class PoolSpec:
    """What the engine needs to build a pool's instances."""

    name: str
    instances: int
    step_model: StepModel
    memory: MemoryPlan
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    max_model_len: int
    router: str
    role: str = "colocated"
    prefix_caching: bool = True
    frontend: FrontEnd = FrontEnd()  # the API server: a delay on the way in, a queue on the way out
    dp: int = 1  # ranks per lock-stepped data-parallel instance (instances counts ranks)
    admission: AdmissionRule | None = None  # KV kept free for running requests (None: vLLM's none)
    dp_context_wait: int | None = None  # attention DP: steps a rank holds prompts back to prefill with the others
    recv_interval: int = 1  # SGLang's scheduler_recv_interval: decode steps between takes of new requests
    async_scheduling: bool = False  # vLLM schedules a step ahead: a prompt sent during step K joins K + 2


@dataclass
class PoolRun:
    """Raw output of one simulation: the recorder and each instance's step log."""

    recorder: Recorder
    instances: list[Instance]
    end_time: float
    coordinator: PDCoordinator | None = None
    epd: EPDCoordinator | None = None  # the EPD proxy of a multimodal run


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
