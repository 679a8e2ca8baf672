"""Load generators of the calibration harness: the send schedules of one phase's requests.

:func:`run_open_loop` sends each request at its planned offset (seconds from the phase start, e.g. from
:func:`poisson_arrivals`) whatever the server's progress; :func:`run_closed_loop` keeps ``concurrency``
users busy, each sending its next request when its previous one finished.  Both send through a
:class:`~calibration.harness.client.CompletionClient` and hand each result to ``on_result`` as it arrives.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from calibration.harness.client import CompletionClient, RequestResult, RequestSpec

OnResult = Callable[[RequestResult], Awaitable[None] | None]


async def _emit(on_result: OnResult | None, res: RequestResult) -> None:
    if on_result is None:
        return
    out = on_result(res)
    if asyncio.iscoroutine(out):
        await out


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Offsets (s) of ``n`` Poisson arrivals at ``rate`` per second, first one at 0."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def run_open_loop(
    client: CompletionClient, specs: Sequence[RequestSpec], on_result: OnResult | None = None
) -> list[RequestResult]:
    """Send each request at its ``arrival_s`` offset (Poisson schedule from :func:`poisson_arrivals`),
    whatever the server's progress; results in completion order.  The offsets are shifted so
    that the first remaining request starts at once (a resumed phase keeps the others' gaps); each
    result's ``sent_s`` is on the plan's clock, as ``scheduled_s`` is (the segment started at the first
    remaining request's offset), so ``sent_s - scheduled_s`` is how late it went, in any segment."""
    t0 = time.monotonic()
    first = min((s.arrival_s or 0.0) for s in specs) if specs else 0.0
    results: list[RequestResult] = []

    async def one(spec: RequestSpec):
        delay = (spec.arrival_s or 0.0) - first - (time.monotonic() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        res = await client.complete(spec, t0 - first)
        results.append(res)
        await _emit(on_result, res)

    tasks = [asyncio.create_task(one(s)) for s in specs]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    return results


async def run_closed_loop(
    client: CompletionClient,
    specs: Iterable[RequestSpec],
    concurrency: int,
    on_result: OnResult | None = None,
    think_time_s: float = 0.0,
) -> list[RequestResult]:
    """``concurrency`` users, each sending its next request when the previous one finished."""
    queue = list(specs)
    queue.reverse()
    t0 = time.monotonic()
    results: list[RequestResult] = []

    async def user():
        while queue:
            spec = queue.pop()
            res = await client.complete(spec, t0)
            results.append(res)
            await _emit(on_result, res)
            if think_time_s:
                await asyncio.sleep(think_time_s)

    tasks = [asyncio.create_task(user()) for _ in range(max(1, concurrency))]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
    return results
