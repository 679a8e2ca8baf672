"""Snapshot every example's per-request and per-step tables, or compare two snapshots.

Speed work must not change results.  Take a snapshot with the old code, change the code, take
another, and compare:

    .venv/bin/python benchmarks/check_outputs.py snapshot /tmp/old [--scripts]
    .venv/bin/python benchmarks/check_outputs.py snapshot /tmp/new [--scripts]
    .venv/bin/python benchmarks/check_outputs.py compare /tmp/old /tmp/new

The tables are written by pandas' own CSV writer with shortest round-trip floats, not by
``Results.write``, so a change of output writer does not hide (or fake) a change of values.
``--scripts`` also records the standard output of the example scripts (``examples/*.py``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

from simulator.run import simulate
from simulator.scenario import load_scenario

REPO = Path(__file__).resolve().parents[1]


def _scenarios() -> list[Path]:
    out = []
    for p in sorted((REPO / "examples").glob("*.yaml")):
        data = yaml.safe_load(p.read_text())
        if "pools" in data:  # plan requests list GPU offers instead of pools
            out.append(p)
    return out


def snapshot(dest: Path, scripts: bool) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for path in _scenarios():
        res = simulate(load_scenario(path))
        d = dest / path.stem
        d.mkdir(exist_ok=True)
        res.requests.to_csv(d / "requests.csv", index=False)
        res.steps.to_csv(d / "steps.csv", index=False)
        if res.links is not None:
            res.links.to_csv(d / "links.csv", index=False)
        (d / "summary.json").write_text(json.dumps(res.summary, indent=1, sort_keys=True, default=str))
        print(f"{path.stem}: {len(res.requests)} requests, {len(res.steps)} steps", flush=True)
    if scripts:
        for path in sorted((REPO / "examples").glob("*.py")):
            run = subprocess.run([sys.executable, str(path)], cwd=REPO, capture_output=True, text=True, check=True)
            (dest / f"{path.stem}.stdout").write_text(run.stdout)
            print(f"{path.stem}: {len(run.stdout.splitlines())} lines of output", flush=True)


def compare(old: Path, new: Path) -> int:
    names = sorted(
        {p.relative_to(old) for p in old.rglob("*") if p.is_file()}
        | {p.relative_to(new) for p in new.rglob("*") if p.is_file()}
    )
    bad = 0
    for rel in names:
        a, b = old / rel, new / rel
        if not a.exists() or not b.exists():
            print(f"MISSING {rel} ({'old' if not a.exists() else 'new'} lacks it)")
            bad += 1
        elif a.read_bytes() != b.read_bytes():
            la, lb = a.read_text().splitlines(), b.read_text().splitlines()
            first = next((i for i, (x, y) in enumerate(zip(la, lb, strict=False)) if x != y), min(len(la), len(lb)))
            print(f"DIFFERS {rel}: {len(la)} vs {len(lb)} lines, first difference at line {first + 1}")
            bad += 1
    print(f"{len(names) - bad} of {len(names)} files identical")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("snapshot")
    s.add_argument("dest", type=Path)
    s.add_argument("--scripts", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "snapshot":
        snapshot(args.dest, args.scripts)
        return 0
    return compare(args.old, args.new)


if __name__ == "__main__":
    sys.exit(main())
