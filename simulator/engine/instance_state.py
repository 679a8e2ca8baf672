"""An instance's state and the calls other processes make on it (routers, the PD and EPD flows).

:class:`simulator.engine.instance_lifecycle.InstanceLifecycle` adds the calls on the instance as a whole
(start, stop; expire, withdraw and crash under operations), and :class:`simulator.engine.instance.Instance`
the SimPy process that steps it.  Kept apart so that the step loop and its invariants read on their own.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from simpy.events import NORMAL, Event

from simulator.engine.admission import Reservation
from simulator.engine.steplog import StepLog
from simulator.engine.stepping import Stepping
from simulator.roles import ROLES

if TYPE_CHECKING:
    from simpy.core import Environment
    from simpy.events import Process

    from simulator.engine.dp_group import DPGroup
    from simulator.engine.records import PoolSpec

# The PD proxy's callbacks, (instance, rid, now); the running requests' state (Instance.run).
Callback = Callable[["InstanceState", int, float], None]
Live = tuple[dict[int, None], dict[int, list], dict[int, tuple]]


@dataclass(frozen=True)
class Ports:
    """What an instance calls outside itself, given when it is made: the PD proxy's ``hand_off`` (prefill role)
    or ``start_transfer`` (decode role), each ``(instance, rid, now)``, and ``encode_cost(instance, rid, now)``,
    the seconds a front instance that encodes its own images spends on a request's (EPD without an encoder
    tier); None where the instance has no such neighbour."""

    hand_off: Callback | None = None
    start_transfer: Callback | None = None
    encode_cost: Callable[[InstanceState, int, float], float] | None = None


class TimedLog:
    """``append(x)`` stores ``(env.now, x)`` in ``log``: resume gaps of a run-ahead instance."""

    __slots__ = ("log", "env")

    def __init__(self, log: list, env) -> None:
        self.log, self.env = log, env

    def append(self, x: float) -> None:
        self.log.append((self.env.now, x))


class InstanceState:
    """One instance's scheduler state and the calls that change it from outside its process.

    ``role`` is "colocated", "prefill" or "decode".  A prefill instance runs
    each prompt with ``max_tokens=1`` and, instead of decoding, hands the
    request to ``hand_off(instance, rid, now)`` while its KV blocks stay held
    until :meth:`release`.  A decode instance takes requests whose KV is
    remote (:meth:`submit_remote`): it admits one only when it has a batch
    slot for it (running + pulling < ``max_num_seqs``) and can allocate blocks
    for the whole prompt, then asks ``start_transfer(instance, rid, now)`` to
    move the KV, and decodes once :meth:`kv_arrived` is called.  Its
    first step computes the last prompt token and samples the first output
    token, as vLLM's connectors recompute the last token on the decode side.

    Invariants (checked by tests): ``0 <= kv_used <= kv_total`` at every step;
    every admitted request finishes exactly once; a request's generated tokens
    equal its requested output tokens when it completes.
    """

    def __init__(
        self,
        index: int,
        spec: PoolSpec,
        recorder,
        life=None,
        *,
        ports: Ports,
        stepping: Stepping,
        group: DPGroup | None = None,
        rank: int = 0,
    ) -> None:
        self.index = index
        self.role = ROLES[spec.role]
        self.pool = spec.name
        self.model = spec.step_model
        memory = spec.memory
        self.kv_total = memory.kv_blocks
        self.block = memory.block_size
        self.max_seqs = spec.max_num_seqs
        self.budget = spec.max_num_batched_tokens
        self.chunked = spec.chunked_prefill
        self.rec = recorder
        self.waiting: deque[int] = deque()
        takes_prompts = self.role.name in ("colocated", "prefill")
        # SGLang's scheduler_recv_interval: requests sent while a batch runs wait here until the scheduler
        # next reads its socket (Instance.run moves them to ``waiting``); 1: straight to ``waiting``.
        self.recv_every = spec.recv_interval if takes_prompts else 1
        self.inbox: deque[int] = deque()
        # vLLM's async scheduling: a prompt sent while a step runs waits here (with the time it was sent)
        # until the step after next, which is the first scheduled after it arrived (Instance.run).
        self.async_lag = spec.async_scheduling and takes_prompts
        self.sent_at: dict[int, float] = {}
        self.outstanding = self.kv_used = self.n_running = 0
        self.queued_kv = 0  # KV blocks that queued requests (waiting, remote) claim when admitted
        self._queued: dict[int, int] = {}  # rid -> its share of queued_kv
        self.wake: Event | None = None
        self.steps: StepLog | None = StepLog() if stepping.step_log else None  # the step log (None: not kept)
        self._requeue: dict[int, list] = {}  # preempted rid -> [0, recompute target, generated]
        self.hand_off = ports.hand_off  # prefill role: callback(instance, rid, now)
        self.start_transfer = ports.start_transfer  # decode role: callback(instance, rid, now)
        self.held: dict[int, int] = {}  # prefill role: rid -> KV blocks held for a transfer
        self.remote: deque[int] = deque()  # decode role: requests waiting for KV blocks
        self.receiving: set[int] = set()  # decode role: blocks allocated, KV in flight
        self.ready: deque[int] = deque()  # decode role: KV arrived, not yet decoding
        self._freed = 0  # blocks released from outside the process
        self.encode_cost = ports.encode_cost  # multimodal, encoded in place: callback(instance, rid, now) -> seconds
        self.last_tok: dict[int, float] = {}  # preempted rid -> time of its last token
        # Admission reserve (simulator/engine/admission.py; None: none, as vLLM) and the running requests'
        # prompt + output tokens, summed (what their KV grows to).
        self.reserve = Reservation(spec.admission, memory.block_size) if spec.admission is not None else None
        self.final_tokens = 0
        self._live: Live | None = None  # (running order, prefills, decodes) once run() starts
        self.group, self.rank = group, rank  # attention data parallel: the instance's DPGroup, this rank's index
        # The run's clock policy (simulator/engine/stepping.py).  Run-ahead's gate: a one-element list holding
        # the time of the next event that can look at or change this instance (the next arrival), shared by
        # the pool's instances; the instance steps without SimPy events until then.  None: any event may, so it
        # steps ahead only while SimPy has nothing else due.  With a gate, resume gaps go to ``gap_log`` as
        # (time, gap) and the pool merges them in time order, the order SimPy would have produced.
        self.inline = stepping.inline
        self.gate = stepping.gate
        self.gap_log: list[tuple[float, float]] = []
        # Lazy stepping (a decode instance of a static PD run, :meth:`catch_up`): ``paused`` is the end of
        # the step in progress while the process waits on ``hold`` without a SimPy event for that end;
        # ``limit`` is the time :meth:`catch_up` drives it to (``driving`` meanwhile).
        self.lazy = stepping.lazy_decode and self.role.name == "decode"
        self.paused: float | None = None
        self.limit = -math.inf
        self.driving = False
        self.hold: Event | None = None
        self._env: Environment | None = None  # set by start(), with the process's generator
        self._gen: Generator[Event, Any, None] | None = None
        # Prefix cache (vLLM automatic prefix caching), active when requests carry block hashes: an LRU of hash ids,
        # each covering ``hash_block_tokens`` prompt tokens, with room for as many such blocks as the KV cache holds.
        hashes = recorder.hash_ids
        self.prefix: OrderedDict | None = OrderedDict() if hashes is not None and spec.prefix_caching else None
        self.hash_tokens = recorder.hash_block_tokens or 0
        self.prefix_capacity = (self.kv_total * self.block) // self.hash_tokens if self.hash_tokens else 0
        # Lifecycle under operations (simulator/engine/opsengine.py): the billing record (opsrecord.Life), the
        # SimPy process once started, and whether the instance has died (crash, removal) or is draining.
        self.life = life
        self.proc: Process | None = None
        self.dead = self.draining = False
        self.backoff_s = 10.0  # restart back-off after its next crash

    def prefix_hits(self, rid: int) -> int:
        """Number of leading hash blocks of ``rid``'s prompt in this instance's cache (no LRU update)."""
        cache = cast(OrderedDict, self.prefix)  # the prefix methods are called only with a cache
        n = 0
        for h in self.rec.hash_ids[rid]:
            if h not in cache:
                break
            n += 1
        return n

    def cached_prefix(self, rid: int, target: int) -> int:
        """Prompt tokens of ``rid`` served from the prefix cache (a whole number of KV blocks)."""
        cache = cast(OrderedDict, self.prefix)
        n = 0
        for h in self.rec.hash_ids[rid]:
            if h not in cache:
                break
            cache.move_to_end(h)
            n += 1
        tokens = min(n * self.hash_tokens, target - 1)
        return tokens - tokens % self.block

    def remember_prefix(self, rid: int) -> None:
        """Insert ``rid``'s prompt blocks into the cache, evicting least recently used ones."""
        cache = cast(OrderedDict, self.prefix)
        for h in self.rec.hash_ids[rid]:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.prefix_capacity:
            cache.popitem(last=False)

    def _wake(self) -> None:
        if self.paused is not None:
            # Lazy, mid-step: its process now resumes at that step's end, as a SimPy timeout would have.
            t, self.paused = self.paused, None
            ev, env = cast(Event, self.hold), cast("Environment", self._env)  # a paused process waits on hold
            ev._ok, ev._value = True, None
            heapq.heappush(env._queue, (t, NORMAL, next(env._eid), ev))
            return
        wake = self.wake
        if wake is not None:
            self.wake = None
            wake.succeed()

    # ---- lazy stepping ----------------------------------------------------------------------------
    # A decode instance of a static PD run (no operations, open loop, no EPD, one rank) with no KV
    # queued to pull acts on nothing outside itself (it starts transfers only for queued KV; its
    # finishes are records), is seen by nothing but the decode router at a hand-off, and is changed
    # from outside only by a hand-off or a landing of KV it pulls.  So it needs no SimPy event per
    # step: when a step would end, it waits on an event that nothing schedules (``paused`` holds the
    # step's end), and the PD proxy calls :meth:`catch_up` before each hand-off and each landing,
    # which runs its steps that end before then inline.  A hand-off to it (:meth:`_wake`) schedules
    # the end of the step in progress, where SimPy would have resumed it to start the transfer; a
    # landing does not (the next step takes the request in, whenever it is driven).  OpsRun.run
    # catches every instance up at the end of the run.

    def suspend(self) -> Event:
        """The event the process waits on (lazy): while :meth:`catch_up` drives it, the one SimPy
        already resumes it on; else a new one."""
        if not self.driving:
            self.hold = Event(cast("Environment", self._env))  # set by start(), which runs this process
        return cast(Event, self.hold)

    def catch_up(self, t: float) -> None:
        """Lazy: run the steps owed that end before ``t`` (the current time of whoever is about to
        look at this instance or hand it a request), stopping in the step in progress at ``t``."""
        if self.paused is None or self.paused >= t:
            return
        env = cast("Environment", self._env)  # a paused instance was started
        now = env._now
        self.limit, self.driving = t, True
        try:
            ev = cast("Generator[Event, Any, None]", self._gen).send(None)
        finally:
            self.limit, self.driving = -math.inf, False
            env._now = now
        if ev is not self.hold:
            raise RuntimeError(f"instance {self.index}: a lazy step waited on another event")

    def left(self, rid: int, step: int | None = None) -> None:
        """``rid`` stopped running (finished, handed off, preempted at ``step``: the reserve's ratio restarts)."""
        self.final_tokens -= self.rec.input_tokens[rid] + self.rec.output_tokens[rid]
        if step is not None and self.reserve is not None:
            self.reserve.reset_at = step

    def queue_kv(self, rid: int, tokens: int) -> None:
        """Count the blocks that ``rid``, now queued, will allocate for ``tokens`` when admitted."""
        b = -(-tokens // self.block)
        self.queued_kv += b - self._queued.get(rid, 0)
        self._queued[rid] = b

    def unqueue(self, rid: int) -> None:
        """``rid`` left the queue (admitted, or taken away by the operations engine)."""
        self.queued_kv -= self._queued.pop(rid, 0)

    def release(self, rid: int) -> None:
        """Prefill role: the transfer of ``rid`` is done; free its held blocks."""
        self._freed += self.held.pop(rid)
        self._wake()

    def submit_remote(self, rid: int) -> None:
        """Decode role: queue a request whose prompt KV sits on a prefill instance."""
        self.remote.append(rid)
        self.queue_kv(rid, self.rec.input_tokens[rid] - 1)
        self.outstanding += 1
        self._wake()

    def kv_arrived(self, rid: int) -> None:
        """Decode role: the KV of ``rid`` has arrived; it decodes from the next step (lazy and in a
        step: the step after it, whenever it is driven there)."""
        self.receiving.remove(rid)
        self.ready.append(rid)
        if self.paused is None:
            self._wake()

    def allocate_pulls(self, free: int, running: int, now: float) -> int:
        """Decode role: allocate blocks for whole prompts whose KV is remote, FCFS, and start their pulls,
        only for requests that have a batch slot (``running`` requests run): pulled KV must not sit in
        blocks while the running batch starves for them, or the batch can preempt itself empty with
        nothing left to run.  Returns the blocks allocated (at most ``free``)."""
        remote, receiving, ready, inp = self.remote, self.receiving, self.ready, self.rec.input_tokens
        start_transfer = cast(Callback, self.start_transfer)  # the PD proxy set it (decode role)
        used = 0
        while remote and running + len(receiving) + len(ready) < self.max_seqs:
            rid = remote[0]
            grow = -(-(inp[rid] - 1) // self.block)
            if free - used < grow:
                break
            remote.popleft()
            self.unqueue(rid)
            used += grow
            receiving.add(rid)
            start_transfer(self, rid, now)
        return used

    def receive(self, running: bool, since: float) -> None:
        """SGLang reads its socket (every ``recv_every`` steps): the prompts the step now starting can take move to
        ``waiting``; with the overlap scheduler (``async_lag``) those sent before ``since`` (:meth:`admit_sent`)."""
        if self.async_lag:
            self.admit_sent(running, since)
        else:
            self.waiting.extend(self.inbox)
            self.inbox.clear()

    def admit_sent(self, running: bool, since: float) -> None:
        """Async scheduling (vLLM's, SGLang's overlap scheduler): move to ``waiting`` the prompts sent before
        ``since`` (the start of the step that ended last, when the step now starting was scheduled), or all of them
        when nothing is ``running``."""
        inbox = self.inbox
        while inbox and (not running or self.sent_at[inbox[0]] < since):
            self.waiting.append(inbox.popleft())
        if not inbox:
            self.sent_at.clear()

    def submit(self, rid: int) -> None:
        """Queue a request; wakes the instance if it is idle."""
        if self.async_lag and self.n_running:
            self.sent_at[rid] = cast("Environment", self._env).now
            self.inbox.append(rid)
        else:
            (self.inbox if self.recv_every > 1 and self.n_running else self.waiting).append(rid)
        self.queue_kv(rid, self.rec.input_tokens[rid])
        self.outstanding += 1
        self._wake()

    # ---- queries ------------------------------------------------------------------------------
    def is_empty(self) -> bool:
        """Nothing queued, running, held for a transfer or being pulled."""
        return not (self.outstanding or self.held or self.receiving or self.remote or self.ready)

    def n_queued(self) -> int:
        """Requests waiting for admission (prompts to prefill and, decode role, KV to pull)."""
        return len(self.waiting) + len(self.remote) + len(self.inbox)

    def holds(self, rid: int) -> bool:
        """Prefill role: ``rid``'s KV blocks are held here for a transfer."""
        return rid in self.held

    def decode_contexts(self):
        """KV length (prompt plus tokens so far) of each decoding sequence, at the current step."""
        if self._live is None:
            return
        s = len(cast(StepLog, self.steps))  # kept: an operations run keeps its step log
        for sd, ld, _ in self._live[2].values():
            yield ld + s - sd

    def _finish(self, rid: int, now: float, order: dict, generated: int) -> None:
        del order[rid]
        self.left(rid)
        self.outstanding -= 1
        self.rec.finish(rid, now, self.index, generated)
