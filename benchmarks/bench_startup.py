"""Start-up time of the command line: `epdsim --help` and a small `epdsim simulate`, wall seconds.

    .venv/bin/python benchmarks/bench_startup.py [--old DIR] [--repeat 5]

``--old DIR``: another checkout (e.g. ``git worktree add /tmp/base main``) timed in the same run,
interleaved with this one, so a busy machine slows both alike.  Each command runs in a fresh
interpreter (``python -m simulator.cli``) with that checkout first on ``sys.path``; the median of
``--repeat`` runs is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {
    "epdsim --help": ["--help"],
    "epdsim simulate (default scenario, 200 requests)": ["simulate", "--num-requests", "200"],
}


def wall(tree: Path, args: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    t = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "simulator.cli", *args],
        cwd=tree,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", type=Path, help="checkout to time beside this one")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    trees = {"new": REPO} | ({"old": args.old.resolve()} if args.old else {})
    for label, cmd in COMMANDS.items():
        times: dict[str, list[float]] = {k: [] for k in trees}
        for _ in range(args.repeat):
            for k, tree in trees.items():
                times[k].append(wall(tree, cmd))
        print(
            f"{label}: "
            + ", ".join(f"{k} median {statistics.median(v):.2f} s (min {min(v):.2f})" for k, v in times.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
