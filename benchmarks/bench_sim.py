"""Simulator speed: simulated requests per wall second, and per-step cost vs batch size.

Run on demand (not part of the tests):

    .venv/bin/python benchmarks/bench_sim.py [--requests 100000] [--repeat 3]

Reference scenario (issue 2): Llama-3.1-70B, TP4 on H100 SXM, 8 instances,
Poisson arrivals at ~80% of the measured saturation throughput,
ShareGPT-like lengths (the ShareGPT length table in ../shared when present,
else a lognormal fit of it), per-request records and the per-step log kept.
"""
from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path

from simulator.run import simulate
from simulator.scenario import parse_scenario

SHAREGPT = Path(__file__).resolve().parents[2] / "shared/data/traces/sharegpt_lengths/sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


def _lengths() -> dict:
    if SHAREGPT.exists():
        return {"lengths": {"kind": "pairs", "path": str(SHAREGPT), "input_column": "num_prefill_tokens",
                            "output_column": "num_decode_tokens"}}
    # Lognormal with the same table's mean, coefficient of variation and range
    # (prompt mean 2,340, cv 0.89, 1..8,141; output mean 439, cv 0.61, 2..1,024).
    return {"input_length": {"kind": "lognormal", "mean": 2340, "cv": 0.89, "low": 1, "high": 8141},
            "output_length": {"kind": "lognormal", "mean": 439, "cv": 0.61, "low": 2, "high": 1024}}


def reference(arrival: dict, n: int, max_num_seqs: int | None = None, instances: int = 8) -> dict:
    engine = {"max_num_seqs": max_num_seqs} if max_num_seqs else {}
    return {"name": "bench-70b-tp4-h100", "seed": 3, "model": "Llama-3.1-70B",
            "pools": [{"gpu": "H100", "tp": 4, "instances": instances, "engine": engine}],
            "workload": {"arrival": arrival, "num_requests": n, **_lengths()}}


def timed(data: dict):
    scn = parse_scenario(data)
    gc.collect()
    t = time.perf_counter()
    res = simulate(scn)
    return res, time.perf_counter() - t


def at_80_percent(make, concurrency: int, requests: int, repeat: int):
    """Saturation throughput from a closed loop, then the best of ``repeat`` timed Poisson runs at 80% of it.

    Returns (saturation req/s, Poisson rate, last result, best wall seconds).
    """
    sat, _ = timed(make({"kind": "closed", "concurrency": concurrency}, 40_000))
    capacity = sat.summary["throughput_rps"]
    rate = 0.8 * capacity
    best = res = None
    for _ in range(repeat):
        res, wall = timed(make({"kind": "poisson", "rate": rate}, requests))
        best = wall if best is None or wall < best else best
    return capacity, rate, res, best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    lengths = "ShareGPT length table" if SHAREGPT.exists() else "lognormal ShareGPT-like lengths"

    capacity, rate, res, best = at_80_percent(reference, 8 * 1024, args.requests, args.repeat)
    print(f"saturation throughput {capacity:.1f} req/s -> Poisson rate {rate:.1f} req/s ({lengths})")
    steps = len(res.steps)
    print(f"reference: {args.requests:,} requests, {steps:,} steps, wall {best:.2f} s (best of {args.repeat}) -> "
          f"{args.requests / best:,.0f} simulated requests/s, {best / steps * 1e6:.1f} us per step (all work / steps); "
          f"mean batch {res.summary['mean_batch_size']:.0f}, TTFT p50 {res.summary['ttft_s']['p50'] * 1e3:.0f} ms")

    # PD reference (issue 3): Llama-3.1-70B, 4 prefill TP2 + 4 decode TP4 on H200, NIXL over IB NDR.
    def pd(arrival: dict, n: int) -> dict:
        return {"name": "bench-pd", "seed": 3, "model": "Llama-3.1-70B",
                "pools": [{"name": "prefill", "role": "prefill", "gpu": "H200", "tp": 2, "instances": 4},
                          {"name": "decode", "role": "decode", "gpu": "H200", "tp": 4, "instances": 4}],
                "kv_transfer": {"connector": "nixl", "fabric": "ib-ndr"},
                "workload": {"arrival": arrival, "num_requests": n, **_lengths()}}
    capacity, rate, res, best = at_80_percent(pd, 4 * 1024, args.requests, args.repeat)
    steps = len(res.steps)
    print(f"PD reference: saturation {capacity:.1f} req/s, Poisson {rate:.1f} req/s; "
          f"{args.requests:,} requests, {steps:,} steps, {args.requests:,} KV transfers, wall {best:.2f} s -> "
          f"{args.requests / best:,.0f} simulated requests/s; TTFT p50 {res.summary['ttft_s']['p50'] * 1e3:.0f} ms, "
          f"transfer mean {res.summary['ttft_breakdown_mean_s']['transfer'] * 1e3:.1f} ms")

    # Per-step cost vs batch size: a closed loop that keeps max_num_seqs sequences decoding
    # (Llama-3.1-8B on one H200). Two output lengths per batch size; the difference in wall time
    # over the difference in steps cancels the per-request work and leaves the cost of a step.
    print("per-step cost vs batch size (differential: extra wall time / extra steps):")
    for seqs in (64, 512):
        walls, nsteps = [], []
        for out in (200, 1200):
            data = {"name": "bench-step", "seed": 1, "model": "Llama-3.1-8B",
                    "pools": [{"gpu": "H200", "tp": 1, "instances": 1, "engine": {"max_num_seqs": seqs}}],
                    "workload": {"arrival": {"kind": "closed", "concurrency": seqs}, "num_requests": 10 * seqs,
                                 "input_length": {"kind": "fixed", "value": 64},
                                 "output_length": {"kind": "fixed", "value": out}}}
            best = min(timed(data)[1] for _ in range(max(args.repeat, 7)))
            res, _ = timed(data)
            assert res.summary["preemptions"] == 0 and res.steps["batch_size"].max() == seqs
            walls.append(best)
            nsteps.append(len(res.steps))
        print(f"  max_num_seqs={seqs:4d} (batch {seqs}): {(walls[1] - walls[0]) / (nsteps[1] - nsteps[0]) * 1e6:.2f} us "
              f"per step ({nsteps[1] - nsteps[0]:,} extra steps)")


if __name__ == "__main__":
    main()
