"""Planner speed: one plan over >= 500 candidate deployments, discrete-event verification included.

Run on demand (not part of the tests):

    .venv/bin/python benchmarks/bench_plan.py [--request examples/plan_llama8b.yaml] [--workers 2]

Prints the candidates enumerated, the time of each stage (enumerate + screen, simulation), the
candidates simulated and the simulations run, and the total wall time; the issue's target is
under 2 minutes on the project's 2-core machine (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from simulator.plan import load_plan_request, run_plan

DEFAULT = Path(__file__).resolve().parents[1] / "examples" / "plan_llama8b.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--request", default=str(DEFAULT))
    ap.add_argument("--workers", type=int, default=None, help="default: the usable cores")
    args = ap.parse_args()
    req = load_plan_request(args.request)
    stamps: dict[str, float] = {}
    t0 = time.perf_counter()

    def progress(done: int, total: int, stage: str) -> None:
        stamps.setdefault(stage + ":start", time.perf_counter())
        stamps[stage + ":end"] = time.perf_counter()

    res = run_plan(req, progress=progress, workers=args.workers)
    wall = time.perf_counter() - t0
    df = res.candidates
    screened = stamps.get("verify:start", stamps["screen:end"]) - t0
    runs = int(df["des_runs"].sum())
    print(f"request            {args.request} ({req.name}, target {req.target_rate:g} req/s)")
    print(f"load average       {os.getloadavg()[0]:.2f} (1 min, at the end; 2 cores)")
    print(
        f"candidates         {len(df)} ({(df['rejected_reason'].str.startswith(('memory', 'kv-transfer'))).sum()} "
        "ruled out before screening)"
    )
    print(f"enumerate + screen {screened:.2f} s")
    print(
        f"simulated          {int(df['verified'].sum())} candidates x {req.search.replications} seeds"
        f", {runs} simulations, {wall - screened:.2f} s"
    )
    print(
        f"total wall         {wall:.2f} s; recommended: " + (res.recommended["layout"] if res.recommended else "none")
    )


if __name__ == "__main__":
    main()
