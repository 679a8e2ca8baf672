"""Running one probe phase of a plan (:mod:`calibration.harness.probes`) against the server.

:func:`run_phase` sends the phase's remaining requests (sequential, open- or closed-loop) and appends
each result to the bundle as it arrives; a watchdog and the failed requests' own errors notice a dead
server.  Each run of a phase is a segment of it: a ``phase_start`` record, the requests, then a
``metrics`` record with the deltas of vLLM's ``/metrics`` histograms and counters over the segment
(``wall_s``: its seconds), also when the run is interrupted, and ``phase_done`` when it finishes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from calibration.harness.bundle import Bundle, now_iso
from calibration.harness.client import CompletionClient, PromptFactory, RequestResult, RequestSpec
from calibration.harness.loadgen import run_closed_loop, run_open_loop
from calibration.harness.metrics import counter_deltas, histogram_deltas, parse_prometheus
from calibration.harness.server import Endpoint


def _specs(phase: dict, prompts: PromptFactory, skip: set[str]) -> list[RequestSpec]:
    out = []
    for rid, plen, mt, arr in phase["requests"]:
        if rid in skip:
            continue
        out.append(
            RequestSpec(
                id=rid, prompt=prompts.prompt(rid, plen), max_tokens=mt, arrival_s=arr, meta={"prompt_len": plen}
            )
        )
    return out


async def _scrape(client: CompletionClient):
    try:
        return parse_prometheus(await client.metrics_text())
    except Exception:  # noqa: BLE001 - a server without /metrics is still measurable
        return None


async def watchdog(server: Endpoint, phase: str, every: float = 0.5):
    """Raise ServerDied as soon as the server process is gone, naming the phase it died in (the same
    words as the in-phase check after a failed request, whichever of the two notices first)."""
    while True:
        await asyncio.sleep(every)
        if not server.alive():
            await asyncio.to_thread(server.check, f"during phase {phase}")


async def run_phase(
    bundle: Bundle,
    phase: dict,
    client: CompletionClient,
    server: Endpoint,
    prompts: PromptFactory,
    log: Callable[[str], None] = lambda s: None,
) -> dict:
    """Run the remaining requests of one phase, appending each result as it arrives.

    Raises :class:`~calibration.harness.server.ServerError` (``ServerDied`` for a launched
    server) when the server goes away; everything measured until then is in the bundle."""
    name = phase["name"]
    if bundle.phase_done(name):
        return {"phase": name, "skipped": True}
    done_ids = bundle.completed_ids(name)
    specs = _specs(phase, prompts, done_ids)
    seg = bundle.next_segment(name)
    launch = len(bundle.manifest.get("launches", [])) - 1
    bundle.append(
        name,
        {
            "kind": "phase_start",
            "segment": seg,
            "t": time.time(),
            "at": now_iso(),
            "requests": len(specs),
            "already_done": len(done_ids),
            "launch": launch,
            "mode": phase["mode"],
            "concurrency": phase.get("concurrency"),
            "rate": phase.get("rate"),
        },
    )
    log(f"phase {name}: {len(specs)} requests" + (f" ({len(done_ids)} done before)" if done_ids else ""))
    before = await _scrape(client)
    failures: list[RequestResult] = []

    async def on_result(res: RequestResult):
        rec = res.to_record()
        rec["segment"] = seg
        bundle.append(name, rec)
        if not res.ok:
            failures.append(res)
            if res.error_kind in ("connection", "timeout", "protocol"):
                await asyncio.to_thread(server.check, f"during phase {name}")

    if phase["mode"] == "open":
        work = run_open_loop(client, specs, on_result)
    else:
        work = run_closed_loop(client, specs, phase.get("concurrency", 1), on_result)
    t0 = time.monotonic()
    main = asyncio.ensure_future(work)
    dog = asyncio.ensure_future(watchdog(server, name))
    try:
        finished, _ = await asyncio.wait({main, dog}, return_when=asyncio.FIRST_COMPLETED)
        if dog in finished:
            dog.result()  # raises ServerDied
        main.result()
    except BaseException as exc:  # Ctrl-C, SIGTERM, a dead server: keep this segment's /metrics delta
        for t in (main, dog):
            t.cancel()
        await asyncio.gather(main, dog, return_exceptions=True)
        # Ctrl-C and SIGTERM reach this task as a cancellation (interrupt.run_stoppable), without their reason
        why = (
            "cancelled (Ctrl-C, SIGINT or SIGTERM)"
            if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt))
            else f"{type(exc).__name__}: {str(exc)[:300]}"
        )
        await _segment_metrics(bundle, name, seg, client, before, time.monotonic() - t0, interrupted=why)
        raise
    finally:
        for t in (main, dog):
            t.cancel()
        await asyncio.gather(main, dog, return_exceptions=True)
    wall = time.monotonic() - t0
    await _segment_metrics(bundle, name, seg, client, before, wall)
    n_ok = len(bundle.completed_ids(name))
    bundle.append(
        name,
        {"kind": "phase_done", "t": time.time(), "at": now_iso(), "ok": n_ok, "failed": len(phase["requests"]) - n_ok},
    )
    log(f"phase {name}: done in {wall:.1f} s, {n_ok}/{len(phase['requests'])} ok")
    return {"phase": name, "ok": n_ok, "failed": len(failures), "wall_s": wall}


async def _segment_metrics(
    bundle: Bundle, name: str, seg: int, client: CompletionClient, before, wall: float, interrupted: str | None = None
) -> None:
    """Append the segment's ``metrics`` record: the /metrics delta since its start, or why there is none.

    At an interruption the delta also counts the tokens of requests cut off in flight (they have no
    ok record and are sent again on resume): the record says ``partial``.  The scrape is bounded, so
    that a hung server cannot hold up the shutdown."""
    try:
        after = await asyncio.wait_for(_scrape(client), 5.0) if before is not None else None
    except (TimeoutError, asyncio.CancelledError):
        after = None
    rec = {"kind": "metrics", "segment": seg, "t": time.time(), "wall_s": round(wall, 3)}
    if interrupted:
        rec.update(partial=True, interrupted=interrupted)
    if before is not None and after is not None:
        rec.update(histograms=histogram_deltas(before, after), counters=counter_deltas(before, after))
    else:
        rec["unavailable"] = (
            "GET /metrics failed at the interruption (the server is gone or did not answer)"
            if interrupted
            else "GET /metrics failed"
        )
    bundle.append(name, rec)
