"""An instance's state and the calls other processes make on it (routers, the PD and EPD flows).

:class:`simulator.instance.Instance` adds the SimPy process that steps it.  Kept apart so that the
step loop and its invariants read on their own.
"""
from __future__ import annotations

from collections import OrderedDict, deque

from simulator.perf import MemoryPlan, StepModel


class _TimedLog:
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

    def __init__(self, index: int, pool: str, step_model: StepModel, memory: MemoryPlan,
                 max_num_seqs: int, max_num_batched_tokens: int, chunked_prefill: bool, recorder,
                 role: str = "colocated", prefix_caching: bool = True) -> None:
        self.index = index
        self.role = role
        self.pool = pool
        self.model = step_model
        self.kv_total = memory.kv_blocks
        self.block = memory.block_size
        self.max_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.chunked = chunked_prefill
        self.rec = recorder
        self.waiting: deque[int] = deque()
        self.outstanding = 0
        self.kv_used = 0
        self.n_running = 0
        self.queued_kv = 0                     # KV blocks that queued requests (waiting, remote) claim when admitted
        self._queued: dict[int, int] = {}      # rid -> its share of queued_kv
        self.wake = None
        self.steps: list[tuple] = []
        self._requeue: dict[int, list] = {}   # preempted rid -> [0, recompute target, generated]
        self.hand_off = None                   # prefill role: callback(instance, rid, now)
        self.start_transfer = None             # decode role: callback(instance, rid, now)
        self.held: dict[int, int] = {}         # prefill role: rid -> KV blocks held for a transfer
        self.remote: deque[int] = deque()      # decode role: requests waiting for KV blocks
        self.receiving: set[int] = set()       # decode role: blocks allocated, KV in flight
        self.ready: deque[int] = deque()       # decode role: KV arrived, not yet decoding
        self._freed = 0                        # blocks released from outside the process
        self.encode_cost = None                # multimodal: callback(instance, rid, now) -> encoder seconds
        self.last_tok: dict[int, float] = {}   # preempted rid -> time of its last token
        self.live = None                       # (running order, prefills, decodes) once run() starts
        self.group = None                      # attention data parallel: the instance's DPGroup, this rank's index
        self.rank = 0
        # Run-ahead (simulator/engine.py): a one-element list holding the time of the next event that
        # can look at or change this instance (the next arrival), shared by the pool's instances; the
        # instance steps without SimPy events until then.  None: any event may, so it steps ahead only
        # while SimPy has nothing else due.  With a gate, resume gaps go to ``gap_log`` as (time, gap)
        # and the pool merges them in time order, the order SimPy would have produced.
        self.gate: list[float] | None = None
        self.gap_log: list[tuple[float, float]] = []
        # Prefix cache (vLLM automatic prefix caching), active when requests carry block hashes:
        # an LRU of hash ids, each covering ``hash_block_tokens`` prompt tokens, with room for as
        # many such blocks as the KV cache holds.
        hashes = recorder.hash_ids
        self.prefix: OrderedDict | None = OrderedDict() if hashes is not None and prefix_caching else None
        self.hash_tokens = recorder.hash_block_tokens or 0
        self.prefix_capacity = (self.kv_total * self.block) // self.hash_tokens if self.hash_tokens else 0

    def prefix_hits(self, rid: int) -> int:
        """Number of leading hash blocks of ``rid``'s prompt in this instance's cache (no LRU update)."""
        cache = self.prefix
        n = 0
        for h in self.rec.hash_ids[rid]:
            if h not in cache:
                break
            n += 1
        return n

    def cached_prefix(self, rid: int, target: int) -> int:
        """Prompt tokens of ``rid`` served from the prefix cache (a whole number of KV blocks)."""
        cache = self.prefix
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
        cache = self.prefix
        for h in self.rec.hash_ids[rid]:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self.prefix_capacity:
            cache.popitem(last=False)

    def _wake(self) -> None:
        wake = self.wake
        if wake is not None:
            self.wake = None
            wake.succeed()

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
        """Decode role: the KV of ``rid`` has arrived; it decodes from the next step."""
        self.receiving.remove(rid)
        self.ready.append(rid)
        self._wake()

    def submit(self, rid: int) -> None:
        """Queue a request; wakes the instance if it is idle."""
        self.waiting.append(rid)
        self.queue_kv(rid, self.rec.input_tokens[rid])
        self.outstanding += 1
        self._wake()
