"""Wall time of epdsim's own regression suite (.ci/regress/suite.yaml), serially and across processes.

Run on demand (not part of the tests):

    .venv/bin/python benchmarks/bench_regress.py [--jobs 1 2] [--repeat 1]

.ci/run runs this suite after the tests; its CI budget is about 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from simulator.regress import load_suite, run_suite

SUITE = Path(__file__).resolve().parents[1] / ".ci" / "regress" / "suite.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    loaded = load_suite(SUITE)
    n = sum(len(e.tolerances) for e in loaded.entries)
    for jobs in args.jobs:
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            run_suite(loaded, jobs=jobs)
            print(f"jobs={jobs}: {len(loaded.entries)} entries, {n} figures in {time.perf_counter() - t0:.1f} s wall")


if __name__ == "__main__":
    main()
