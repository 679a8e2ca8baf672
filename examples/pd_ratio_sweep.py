"""Sweep prefill:decode instance ratios for one workload and SLO; report goodput per GPU.

    .venv/bin/python examples/pd_ratio_sweep.py

Llama-3.1-8B on H100 SXM (TP1), 4 instances split between prefill and decode, NIXL over
InfiniBand NDR. Two workloads: chat-like (short prompts, long answers) and summarisation-like
(long prompts, short answers). SLO: P90 of requests with TTFT <= 1 s and TPOT <= 40 ms.
"""

from __future__ import annotations

import hwdb
from simulator.goodput import find_goodput
from simulator.scenario import parse_scenario

WORKLOADS = {
    "chat (512 in / 512 out)": (
        {"kind": "uniform", "low": 256, "high": 768},
        {"kind": "uniform", "low": 256, "high": 768},
    ),
    "summarise (4096 in / 128 out)": (
        {"kind": "uniform", "low": 3072, "high": 5120},
        {"kind": "uniform", "low": 64, "high": 192},
    ),
}
RATIOS = [(1, 3), (2, 2), (3, 1)]


def scenario(n_p: int, n_d: int, inp: dict, out: dict, duration_s: float = 30.0):
    return parse_scenario(
        {
            "name": f"pd-{n_p}p{n_d}d",
            "seed": 5,
            "model": "Llama-3.1-8B",
            "pools": [
                {"name": "prefill", "role": "prefill", "gpu": "H100", "tp": 1, "instances": n_p},
                {"name": "decode", "role": "decode", "gpu": "H100", "tp": 1, "instances": n_d},
            ],
            "kv_transfer": {"connector": "nixl", "fabric": "ib-ndr"},
            # A fixed 30 s of arrivals, so an overloaded rate shows as growing queues, not a short burst.
            "workload": {
                "arrival": {"kind": "poisson", "rate": 1.0},
                "input_length": inp,
                "output_length": out,
                "duration_s": duration_s,
            },
            "slo": {"ttft_s": 1.0, "tpot_s": 0.04, "attainment": 0.9},
        }
    )


def sweep(duration_s: float = 30.0, iterations: int = 10) -> dict[str, dict[tuple[int, int], float]]:
    """Goodput per GPU (requests/s/GPU) per workload and (prefill, decode) instance count."""
    out = {}
    db = None  # the hardware database, loaded once for every probe of every ratio
    for name, (inp, outl) in WORKLOADS.items():
        db = db or hwdb.load(scenario(1, 1, inp, outl, duration_s).hwdb)
        out[name] = {
            (p, d): find_goodput(scenario(p, d, inp, outl, duration_s), rate_hi=400.0, iterations=iterations, db=db)
            / (p + d)
            for p, d in RATIOS
        }
    return out


if __name__ == "__main__":
    for name, row in sweep().items():
        best = max(row, key=row.get)
        cells = ", ".join(f"{p}P:{d}D {g:.2f}" for (p, d), g in row.items())
        print(f"{name}: goodput per GPU (req/s) {cells} -> best {best[0]}P:{best[1]}D")
