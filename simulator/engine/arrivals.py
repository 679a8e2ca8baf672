"""The workload's side of a run: open-loop arrivals or closed-loop clients, as SimPy processes.

One loop for every engine.  Each request reaches the engine after its front
end (``frontend_s`` plus ``frontend_s_per_token`` per prompt token, seconds);
the engine's ``admit(rid)`` then returns True when it took the request (the
request will end later, as the recorder records) or False when it refused it
at once (it has ended already).  Arrival times are in seconds from the start.
"""
from __future__ import annotations

import math


def start_workload(env, rec, closed_loop, frontend: tuple[float, float], admit, client_rng,
                   gate: list | None = None, limit: float = math.inf, whole_frontend: bool = False) -> None:
    """Start the open loop (``closed_loop`` None: requests arrive at ``rec.arrival``) or one process per
    closed-loop user (a :class:`simulator.workload.ClientModel`; users beyond the request count would
    never send, so at most one per request).  ``gate``/``limit``: see :func:`open_loop`;
    ``whole_frontend``: see :func:`seen_times`."""
    if closed_loop is None:
        env.process(open_loop(env, rec, seen_times(rec, frontend, whole_frontend), admit, gate, limit))
        return
    rec.waiters = {}
    next_id = [0]                       # the next request any user sends, shared by all users
    for k in range(min(closed_loop.concurrency, len(rec.input_tokens))):
        env.process(client(env, k, next_id, closed_loop, rec, frontend, admit, client_rng))


def seen_times(rec, frontend: tuple[float, float], whole_frontend: bool) -> list[float] | None:
    """When the engine sees each open-loop request (seconds), or None when there is no front end
    (it sees each at its arrival).

    The operations engine adds the front end to the arrival as one duration, as a closed-loop user's
    wait does (``whole_frontend``); the static engine adds its fixed and per-token terms in turn.
    The two sums differ by an ulp at most; both are kept so that both engines' tables stay
    byte-identical to their records until one sum is chosen and the regress baseline moved with it."""
    fe0, fe_tok = frontend
    if not (fe0 or fe_tok):
        return None
    arrival, inp = rec.arrival, rec.input_tokens
    if whole_frontend:
        return [arrival[r] + (fe0 + fe_tok * inp[r]) for r in range(len(arrival))]
    return [arrival[r] + fe0 + fe_tok * inp[r] for r in range(len(arrival))]


def open_loop(env, rec, seen: list[float] | None, admit, gate: list | None = None, limit: float = math.inf):
    """Admit each request at ``seen`` (:func:`seen_times`; None: at its arrival), in that order
    (arrivals are non-decreasing, and so are they when there is no front end).

    ``gate`` (a one-element list, or None): set before each wait to the time this process next
    dispatches (capped at ``limit``), and to ``limit`` once every request is dispatched, so that
    instances which run ahead of SimPy (:data:`simulator.engine.engine.RUN_AHEAD`) stop there."""
    arrival = rec.arrival
    timeout = env.timeout
    order = range(len(arrival))
    if seen is None:
        seen = arrival
    else:
        # The front end depends on the prompt: a long prompt's request may be overtaken.
        order = sorted(order, key=seen.__getitem__)
    for rid in order:
        dt = seen[rid] - env.now
        if dt > 0:
            if gate is not None:
                t = env.now + dt        # when this timeout fires, computed as SimPy does
                gate[0] = t if t < limit else limit
            yield timeout(dt)
        admit(rid)
    if gate is not None:
        gate[0] = limit


def client(env, k: int, next_id: list, cl, rec, frontend: tuple[float, float], admit, client_rng):
    """User ``k`` of a closed loop: after its share of the ramp-up, sends a request (after a client
    delay drawn from ``client_rng``), waits for it to end, thinks, and sends the next; the arrival
    time recorded is the send time."""
    fe0, fe_tok = frontend
    inp = rec.input_tokens
    if cl.ramp_up_s > 0:
        yield env.timeout(cl.ramp_up_s * k / cl.concurrency)
    delay, think = cl.send_delay_s, cl.think_time_s
    while next_id[0] < len(inp):
        if delay > 0:
            yield env.timeout(client_rng.exponential(delay))
            if next_id[0] >= len(inp):   # another user sent the last request meanwhile
                return
        rid = next_id[0]
        next_id[0] += 1
        rec.arrival[rid] = env.now
        done = env.event()
        rec.waiters[rid] = done
        if fe0 or fe_tok:
            yield env.timeout(fe0 + fe_tok * inp[rid])
        if admit(rid):
            yield done
        else:
            rec.waiters.pop(rid)
        if think > 0:
            yield env.timeout(think)
