"""Legacy vLLM (V0) vs vLLM V1 vs SGLang on the same deployment and workloads.

    .venv/bin/python examples/engine_generations.py

Llama-3.1-70B on one TP4 H100 SXM instance. "short": 256 concurrent clients with 64-token prompts
and 32-token answers, where the CPU side of each step dominates; "long": 2 clients with 8,000-token
prompts and 256-token answers, where the GPU dominates. Engine profiles are data in hwdb/data/engines.
"""

from __future__ import annotations

from simulator.run import simulate
from simulator.scenario import parse_scenario

ENGINES = ("vllm-v0", "vllm-v1", "sglang")
WORKLOADS = {
    "short (256 clients, 64 in / 32 out)": {
        "arrival": {"kind": "closed", "concurrency": 256},
        "input_length": {"kind": "fixed", "value": 64},
        "output_length": {"kind": "fixed", "value": 32},
        "num_requests": 4096,
    },
    "long (2 clients, 8000 in / 256 out)": {
        "arrival": {"kind": "closed", "concurrency": 2},
        "input_length": {"kind": "fixed", "value": 8000},
        "output_length": {"kind": "fixed", "value": 256},
        "num_requests": 16,
    },
}


def run(engine: str, workload: dict, hwdb: tuple[str, ...] = ()) -> dict:
    scn = parse_scenario(
        {
            "name": f"{engine}",
            "seed": 1,
            "model": "Llama-3.1-70B",
            "hwdb": list(hwdb),
            "pools": [
                {
                    "gpu": "H100",
                    "tp": 4,
                    "instances": 1,
                    "engine": {"engine": engine, "max_num_seqs": 256, "max_model_len": 16384},
                }
            ],
            "workload": workload,
        }
    )
    return simulate(scn).summary


if __name__ == "__main__":
    for name, wl in WORKLOADS.items():
        print(name)
        for eng in ENGINES:
            s = run(eng, wl)
            print(
                f"  {eng:8s} {s['output_tokens_per_s']:9,.0f} output tok/s"
                f"   TTFT p50 {s['ttft_s']['p50'] * 1e3:7.1f} ms"
                f"   TPOT p50 {s['tpot_s']['p50'] * 1e3:6.2f} ms"
            )
