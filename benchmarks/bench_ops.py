"""Cost of the operations engine: bench_sim.py's colocated scenario on the plain engine and on
the operations engine with nothing happening (autoscaler pinned); then with FP8 weights on the plain
engine and with FP8 crashes and re-prefill on the operations engine.

Run on demand (not part of the tests):

    .venv/bin/python benchmarks/bench_ops.py [--requests 20000] [--repeat 3]

Each variant's wall time is the best of ``repeat`` runs, interleaved so that load from other
processes spreads over all of them.
"""

from __future__ import annotations

import argparse
import time

from benchmarks.bench_sim import colocated
from simulator.run import simulate
from simulator.scenario import parse_scenario


def timed(data: dict):
    """The run of one scenario and its wall time (s), the scenario's validation left out."""
    scn = parse_scenario(data)
    t = time.perf_counter()
    res = simulate(scn)
    return res, time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    base = colocated(args.requests)
    variants = {
        "plain engine": base,
        "operations engine, autoscaler pinned": {
            **base,
            "operations": {"autoscale": {"main": {"min_instances": 8, "max_instances": 8}}},
        },
        "plain engine, FP8 weights": {**base, "pools": [{**base["pools"][0], "dtype": "fp8"}]},
        "operations engine, FP8 weights, crashes + re-prefill": {
            **base,
            "pools": [{**base["pools"][0], "dtype": "fp8"}],
            "operations": {
                "faults": {"fp8_crash": {"rate_per_token_s": 2e-8, "onset_tokens": 2048}},
                "retry": {"policy": "reprefill"},
                "startup": {"image_cached": True},
            },
        },
    }
    best: dict[str, float] = {}
    last = {}
    for _ in range(args.repeat):
        for name, data in variants.items():
            res, wall = timed(data)
            best[name] = min(best.get(name, wall), wall)
            last[name] = res
    for name, wall in best.items():
        res = last[name]
        ops = res.summary.get("operations", {})
        extra = f", crashes {ops['crashes']}, re-sends {ops['retries']}" if ops.get("crashes") else ""
        print(
            f"{name}: {args.requests:,} requests, {len(res.steps):,} steps, wall {wall:.2f} s "
            f"(best of {args.repeat}) -> {args.requests / wall:,.0f} simulated requests/s{extra}"
        )


if __name__ == "__main__":
    main()
