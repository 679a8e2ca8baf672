"""Simulator speed: simulated requests per wall second of ``simulate()``, and per-step cost vs batch size.

Run on demand (not part of the tests):

    .venv/bin/python benchmarks/bench_sim.py [--scenarios colocated pd vidur steps] [--requests N]
                                             [--repeat 3] [--old DIR]

``--old DIR``: another checkout (``git worktree add /tmp/base main``) measured in the same run,
interleaved with this one (old, new, old, new, ...), so a busy machine slows both alike.  Every
measurement runs ``simulate()`` once in a fresh interpreter with that checkout first on
``sys.path`` (so it includes one hardware-database load, as a CLI run does) and reports its wall
time, engine steps and peak RSS; the median of ``--repeat`` is printed.

Scenarios (issue 21), with per-request records and the per-step log kept:

* ``colocated``: Llama-3.1-70B TP4 on H100 SXM, 8 instances, ShareGPT lengths (the Sarathi table in
  ../shared, else a lognormal fit of it), Poisson at 26.8 req/s (80% of the closed-loop saturation
  measured in docs/performance.md); 100,000 requests by default.
* ``pd``: Llama-3.1-70B, 2 prefill + 6 decode instances, H200 TP4 each, NIXL over InfiniBand NDR,
  the same lengths, Poisson at 13.0 req/s (94% of this layout's closed-loop throughput, 13.8 req/s
  measured with 20,000 requests and 6,144 users: a high-batch, heavily loaded case).
* ``vidur``: Vidur's low-batch case: Llama-2-70B on A100-80GB TP2 PP2, 4 instances, Poisson 2 req/s,
  conversation lengths (Azure LLM inference trace 2023, conversation: the lengths Splitwise and
  Vidur replay), chunk 512 (max_num_batched_tokens); 10,000 requests.
* ``steps``: the cost of one step at batch 8, 64 and 512 (a closed loop that keeps max_num_seqs
  sequences decoding; the wall-time difference of two output lengths over their step difference).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "traces"
SHAREGPT = SHARED / "sharegpt_lengths" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
AZURE_CONV = SHARED / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"

# Runs in the child interpreter: only the public API that every version has.
CHILD = """
import json, resource, sys, time
from simulator.run import simulate
from simulator.scenario import parse_scenario
out = []
for data in json.load(sys.stdin):
    scn = parse_scenario(data)
    t = time.perf_counter()
    res = simulate(scn)
    wall = time.perf_counter() - t
    out.append({"wall": wall, "steps": len(res.steps), "requests": len(res.requests),
                "mean_batch": res.summary["mean_batch_size"], "ttft_p50": res.summary["ttft_s"]["p50"],
                "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
print(json.dumps(out))
"""


def _sharegpt() -> dict:
    if SHAREGPT.exists():
        return {
            "lengths": {
                "kind": "pairs",
                "path": str(SHAREGPT),
                "input_column": "num_prefill_tokens",
                "output_column": "num_decode_tokens",
            }
        }
    # Lognormal with the same table's mean, coefficient of variation and range
    # (prompt mean 2,340, cv 0.89, 1..8,141; output mean 439, cv 0.61, 2..1,024).
    return {
        "input_length": {"kind": "lognormal", "mean": 2340, "cv": 0.89, "low": 1, "high": 8141},
        "output_length": {"kind": "lognormal", "mean": 439, "cv": 0.61, "low": 2, "high": 1024},
    }


def colocated(n: int, arrival: dict | None = None) -> dict:
    return {
        "name": "bench-70b-tp4-h100",
        "seed": 3,
        "model": "Llama-3.1-70B",
        "pools": [{"gpu": "H100", "tp": 4, "instances": 8}],
        "workload": {"arrival": arrival or {"kind": "poisson", "rate": 26.8}, "num_requests": n, **_sharegpt()},
    }


def pd(n: int, arrival: dict | None = None) -> dict:
    return {
        "name": "bench-pd-2p6d",
        "seed": 3,
        "model": "Llama-3.1-70B",
        "pools": [
            {"name": "prefill", "role": "prefill", "gpu": "H200", "tp": 4, "instances": 2},
            {"name": "decode", "role": "decode", "gpu": "H200", "tp": 4, "instances": 6},
        ],
        "kv_transfer": {"connector": "nixl", "fabric": "ib-ndr"},
        "workload": {"arrival": arrival or {"kind": "poisson", "rate": 13.0}, "num_requests": n, **_sharegpt()},
    }


def vidur(n: int, arrival: dict | None = None) -> dict:
    if AZURE_CONV.exists():
        lengths = {
            "lengths": {
                "kind": "pairs",
                "path": str(AZURE_CONV),
                "input_column": "ContextTokens",
                "output_column": "GeneratedTokens",
            }
        }
    else:  # lognormal with that table's means, coefficients of variation and ranges
        lengths = {
            "input_length": {"kind": "lognormal", "mean": 1155, "cv": 0.96, "low": 2, "high": 14050},
            "output_length": {"kind": "lognormal", "mean": 211, "cv": 0.77, "low": 7, "high": 1000},
        }
    return {
        "name": "bench-vidur-llama2-70b-a100",
        "seed": 3,
        "model": "Llama-2-70B",
        "pools": [{"gpu": "A100-80GB", "tp": 2, "pp": 2, "instances": 4, "engine": {"max_num_batched_tokens": 512}}],
        "workload": {"arrival": arrival or {"kind": "poisson", "rate": 2.0}, "num_requests": n, **lengths},
    }


def step_scenario(seqs: int, out: int) -> dict:
    return {
        "name": "bench-step",
        "seed": 1,
        "model": "Llama-3.1-8B",
        "pools": [{"gpu": "H200", "tp": 1, "instances": 1, "engine": {"max_num_seqs": seqs}}],
        "workload": {
            "arrival": {"kind": "closed", "concurrency": seqs},
            "num_requests": 10 * seqs,
            "input_length": {"kind": "fixed", "value": 64},
            "output_length": {"kind": "fixed", "value": out},
        },
    }


def run_child(tree: Path, scenarios: list[dict]) -> list[dict]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    r = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps(scenarios),
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(r.stdout)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--scenarios",
        nargs="+",
        default=["colocated", "pd", "vidur", "steps"],
        choices=["colocated", "pd", "vidur", "steps"],
    )
    ap.add_argument("--requests", type=int, help="requests per run (default 100,000; vidur 10,000)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--old", type=Path, help="checkout to measure beside this one")
    args = ap.parse_args(argv)
    trees = {"new": REPO} | ({"old": args.old.resolve()} if args.old else {})
    order = list(reversed(trees)) if args.old else list(trees)  # old first: it is the baseline
    builders = {"colocated": (colocated, 100_000), "pd": (pd, 100_000), "vidur": (vidur, 10_000)}
    for name in args.scenarios:
        if name == "steps":
            continue
        build, default_n = builders[name]
        n = args.requests or default_n
        runs: dict[str, list[dict]] = {k: [] for k in trees}
        for _ in range(args.repeat):
            for k in order:
                runs[k] += run_child(trees[k], [build(n)])
        for k in order:
            walls = [r["wall"] for r in runs[k]]
            r0 = runs[k][0]
            med = statistics.median(walls)
            print(
                f"{name} [{k}]: {n:,} requests, {r0['steps']:,} steps (mean batch {r0['mean_batch']:.1f}), "
                f"wall median {med:.2f} s of {[round(w, 2) for w in walls]} -> {n / med:,.0f} simulated "
                f"requests/s, {med / r0['steps'] * 1e6:.2f} us per step; peak RSS {r0['rss_mb']:.0f} MB",
                flush=True,
            )
    if "steps" in args.scenarios:
        # Two output lengths per batch size: (wall difference) / (step difference) cancels the
        # per-request work and leaves the cost of one step.  Several runs in one child, min of them.
        reps = max(args.repeat, 5)
        for seqs in (8, 64, 512):
            for k in order:
                data = [step_scenario(seqs, out) for out in (200, 1200) for _ in range(reps)]
                res = run_child(trees[k], data)
                short, long_ = res[:reps], res[reps:]
                dw = min(r["wall"] for r in long_) - min(r["wall"] for r in short)
                ds = long_[0]["steps"] - short[0]["steps"]
                print(
                    f"  step cost, batch {seqs:4d} [{k}]: {dw / ds * 1e6:.2f} us per step ({ds:,} extra steps)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
