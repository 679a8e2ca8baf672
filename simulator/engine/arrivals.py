"""The workload's side of a run: open-loop arrivals or closed-loop clients, as SimPy processes.

One loop for every engine.  Each request reaches the engine after the way in
of its front end (:class:`simulator.engine.frontend.WayIn`, seconds);
the engine's ``admit(rid)`` then returns True when it took the request (the
request will end later, as the recorder records) or False when it refused it
at once (it has ended already).  Arrival times are in seconds from the start.
"""

from __future__ import annotations

import math

from simulator.engine.frontend import FrontEnd, WayIn, seen_times


def start_workload(
    env, rec, closed_loop, frontend: FrontEnd, admit, client_rng, gate: list | None = None, limit: float = math.inf
) -> None:
    """Start the open loop (``closed_loop`` None: requests arrive at ``rec.arrival``) or one process per
    closed-loop user (a :class:`simulator.workload.ClientModel`; users beyond the request count would
    never send, so at most one per request).  ``gate``/``limit``: see :func:`open_loop`."""
    if closed_loop is None:
        env.process(open_loop(env, rec, seen_times(rec.arrival, rec.input_tokens, frontend), admit, gate, limit))
        return
    rec.waiters = {}
    next_id = [0]  # the next request any user sends, shared by all users
    way = WayIn(frontend) if frontend.has_way_in else None  # one front end for all users
    for k in range(min(closed_loop.concurrency, len(rec.input_tokens))):
        env.process(client(env, k, next_id, closed_loop, rec, way, admit, client_rng))


def open_loop(env, rec, seen: list[float] | None, admit, gate: list | None = None, limit: float = math.inf):
    """Admit each request at ``seen`` (:func:`simulator.engine.frontend.seen_times`; None: at its
    arrival), in that order (arrivals are non-decreasing, and so are they when there is no front end).

    ``gate`` (a one-element list, or None): set before each wait to the time this process next
    dispatches (capped at ``limit``), and to ``limit`` once every request is dispatched, so that
    instances which run ahead of SimPy (:mod:`simulator.engine.stepping`) stop there."""
    arrival = rec.arrival
    timeout = env.timeout
    order: range | list[int] = range(len(arrival))
    if seen is None:
        seen = arrival
    else:
        # The side-by-side delay depends on the prompt: a long prompt's request may be overtaken there.
        order = sorted(order, key=seen.__getitem__)
    for rid in order:
        dt = seen[rid] - env.now
        if dt > 0:
            if gate is not None:
                t = env.now + dt  # when this timeout fires, computed as SimPy does
                gate[0] = t if t < limit else limit
            yield timeout(dt)
        admit(rid)
    if gate is not None:
        gate[0] = limit


def client(env, k: int, next_id: list, cl, rec, way: WayIn | None, admit, client_rng):
    """User ``k`` of a closed loop: after its share of the ramp-up, sends a request (after a client
    delay drawn from ``client_rng``), waits for it to end, thinks, and sends the next; the arrival
    time recorded is the send time, and the engine sees it after the way in ``way`` (None: none)."""
    inp = rec.input_tokens
    if cl.ramp_up_s > 0:
        yield env.timeout(cl.ramp_up_s * k / cl.concurrency)
    delay, think = cl.send_delay_s, cl.think_time_s
    while next_id[0] < len(inp):
        if delay > 0:
            yield env.timeout(client_rng.exponential(delay))
            if next_id[0] >= len(inp):  # another user sent the last request meanwhile
                return
        rid = next_id[0]
        next_id[0] += 1
        rec.arrival[rid] = env.now
        done = env.event()
        rec.waiters[rid] = done
        if way is not None:
            yield env.timeout(way.seen(env.now, inp[rid]) - env.now)
        if admit(rid):
            yield done
        else:
            rec.waiters.pop(rid)
        if think > 0:
            yield env.timeout(think)
