"""Request routers: small strategy classes in an explicit registry.

A router sees the instances of one pool and picks one for each arriving
request.  ``choose`` is called once per request, so it must be cheap.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.registry import Registry


class Router:
    """Base class: pick an instance index for request ``rid``."""

    name = "base"

    def __init__(self, instances: Sequence) -> None:
        self.instances = instances

    def choose(self, rid: int) -> int:  # pragma: no cover - interface
        raise NotImplementedError


# Router classes by their ``name``; a pool's ``router`` names one.
ROUTERS: Registry[type[Router]] = Registry("router")
# Decorator adding a router class under its ``name``; a duplicate name is an error.
register = ROUTERS.register


def make_router(name: str, instances: Sequence) -> Router:
    """A new router ``name`` over ``instances``; an unknown name raises a ``ValueError`` listing the known ones."""
    return ROUTERS.get(name)(instances)


@register
class RoundRobin(Router):
    """Cycle through instances in order, ignoring their load."""

    name = "round_robin"

    def __init__(self, instances: Sequence) -> None:
        super().__init__(instances)
        self._next = 0

    def choose(self, rid: int) -> int:
        i = self._next
        self._next = (i + 1) % len(self.instances)
        return i


@register
class LeastOutstanding(Router):
    """Fewest requests queued or running (ties go to the lowest index)."""

    name = "least_outstanding"

    def choose(self, rid: int) -> int:
        # A list and min/index (both first-wins, in C) cost a third of a Python argmin loop.
        outs = [inst.outstanding for inst in self.instances]
        return outs.index(min(outs))


@register
class LeastKV(Router):
    """Least projected KV demand: blocks held plus blocks the queued prompts will claim.

    An instance's demand is its allocated KV blocks (running sequences, and on the PD sides
    blocks held for or awaiting a transfer) plus the blocks its queued requests will allocate
    when admitted (their prompts, or prompt plus generated tokens for a preempted request),
    as a fraction of its cache.  Occupancy alone ignores the queue: a request holds no KV
    until a step admits it, so an instance limited by ``max_num_seqs`` or the token budget
    keeps a low occupancy while its queue grows, and would draw every arrival.  Counting the
    queued prompts makes each arrival raise the demand of the instance it joins, so identical
    instances share the load, weighted by KV (prompt) size rather than by request count.

    Ties (an idle pool) go to the instance with fewer outstanding requests, then round robin,
    so idle instances take turns instead of the first one taking every request.
    """

    name = "least_kv"

    def __init__(self, instances: Sequence) -> None:
        super().__init__(instances)
        self._next = 0

    def choose(self, rid: int) -> int:
        insts = self.instances
        n = len(insts)
        best, best_key = 0, None
        for k in range(n):
            i = (self._next + k) % n
            inst = insts[i]
            key = ((inst.kv_used + inst.queued_kv) / inst.kv_total, inst.outstanding)
            if best_key is None or key < best_key:
                best, best_key = i, key
        self._next = (best + 1) % n
        return best


@register
class PrefixAware(Router):
    """Most cached prefix blocks of this request (vLLM prefix cache), then fewest outstanding.

    Falls back to least outstanding when requests carry no block hashes.
    """

    name = "prefix_aware"

    def choose(self, rid: int) -> int:
        best, best_key = 0, None
        for i, inst in enumerate(self.instances):
            hits = inst.prefix_hits(rid) if inst.prefix is not None else 0
            key = (-hits, inst.outstanding)
            if best_key is None or key < best_key:
                best, best_key = i, key
        return best
