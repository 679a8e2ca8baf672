"""EPD simulation speed: simulated requests per wall second with and without an encoder tier.

Run on demand (not part of the tests):

    .venv/bin/python benchmarks/bench_epd.py [--requests 20000] [--repeat 3]

Scenario: examples/epd_images_{colocated,epd}.yaml (Qwen3-VL-30B-A3B, six 1080p images per
request, 4 req/s) with more requests, and the text-only E+PD example; best of ``repeat`` runs.
Reports wall time and process CPU time (the CPU time is the figure to compare on a shared machine).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from simulator.run import simulate
from simulator.scenario import parse_scenario

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for name in ("images_colocated", "images_epd", "text_epd"):
        data = yaml.safe_load((EXAMPLES / f"epd_{name}.yaml").read_text())
        data["workload"]["num_requests"] = args.requests
        scn = parse_scenario(data)
        best = cpu = float("inf")
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            res = simulate(scn)
            best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
        images = res.summary.get("encoder", {}).get("images", 0)
        print(
            f"{name:18s} {args.requests} requests, {images} images: wall {best:.2f} s, CPU {cpu:.2f} s, "
            f"{args.requests / cpu:,.0f} simulated requests per CPU second"
        )


if __name__ == "__main__":
    main()
