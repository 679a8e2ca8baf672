"""Engine memory terms against the engines' own start-up logs (``python -m calibration.kernels.memory_fit``).

Two checks, both on the public logs collected in ``hwdb/data/validation/vllm_memory_logs.yaml`` and
``sglang_trtllm_memory.yaml`` (each point names its URL):

1. **vLLM's activation peak** (the profiling run): least squares of ``base + c_t x tokens x hidden x 2 B +
   c_s x seqs x vocab x 4 B + moe`` on the vLLM 0.19 logs of every other model (sorted by name) and the
   error on the rest, which the fit never saw.  The shipped terms are in ``hwdb/data/engines/vllm-v1.yaml``.
2. **KV capacity end to end**: every logged start-up whose model is in hwdb replayed through
   :func:`simulator.perf.plan_memory` with the logged settings, predicted against logged KV GiB/tokens.

``--markdown FILE`` writes both tables (docs/validation/memory.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import yaml

import hwdb
from simulator.memory import FitError, GiB
from simulator.perf import plan_memory
from simulator.scenario import EngineConfig, PoolConfig, ScenarioError, deployment_for

DATA = Path(__file__).resolve().parents[2] / "hwdb" / "data" / "validation"

# Logged GPU names -> hwdb names (H800 has H100's memory).
GPUS = {
    "H100": "H100-SXM-80GB",
    "H800": "H100-SXM-80GB",
    "H200": "H200-SXM-141GB",
    "B200": "B200-SXM-180GB",
    "A100": "A100-SXM-80GB",
}
# Logged model ids -> hwdb models of the same architecture (Llama-3.3-70B is Llama-3.1-70B's).
MODELS = {
    "Llama-3.1-8B": "Llama-3.1-8B",
    "Llama-3.3-70B": "Llama-3.1-70B",
    "Qwen2.5-7B": "Qwen2.5-7B",
    "Qwen2.5-72B": "Qwen2.5-72B",
    "Qwen3-30B-A3B": "Qwen3-30B-A3B",
    "gpt-oss-20b": "gpt-oss-20b",
    "gpt-oss-120b": "gpt-oss-120b",
    "Mixtral-8x7B": "Mixtral-8x7B",
    "Qwen3-32B": "Qwen3-32B",
    "Qwen3-235B-A22B": "Qwen3-235B-A22B",
    "DeepSeek-R1": "DeepSeek-R1",
    "Kimi-K2.5": "Kimi-K2.5",
}


def _model(name: str) -> str | None:
    tail = str(name).split("/")[-1].removeprefix("Meta-")
    return next((v for k, v in MODELS.items() if tail.startswith(k)), None)


def _gpu(name: str) -> str | None:
    return next((v for k, v in GPUS.items() if k in str(name)), None)


def _dtype(p: dict) -> str:
    text = f"{p.get('model', '')} {p.get('quantization') or ''} {p.get('dtype') or ''}".lower()
    if "gpt-oss" in text:
        return "fp4"
    return "fp8" if "fp8" in text or "w8a8" in text else "int4" if "w4a16" in text else "bf16"


# SGLang and TensorRT-LLM start-ups with every setting that sizes the cache stated (from
# hwdb/data/validation/sglang_trtllm_memory.yaml; the KV format as the logged bytes per token show).
OTHER: list[dict[str, Any]] = [
    {
        "url": "vllm-project/vllm#21348 (SGLang side)",
        "engine": "sglang",
        "version": "0.4.9",
        "model": "Qwen3-235B-A22B",
        "gpu": "H100-SXM-80GB",
        "tp": 4,
        "dtype": "fp8",
        "kv": "bf16",
        "engine_args": {"gpu_memory_utilization": 0.93},
        "settings": "mem_fraction_static 0.93",
        "tokens": 367404,
    },
    {
        "url": "NVIDIA SGLang DeepSeek-R1 B200 deployment guide (code index 9615030885)",
        "engine": "sglang",
        "version": "0.4.10",
        "model": "DeepSeek-R1",
        "gpu": "B200-SXM-180GB",
        "tp": 8,
        "ep": 8,
        "dtype": "fp8",
        "kv": "bf16",
        "engine_args": {"max_num_batched_tokens": 16384},
        "settings": "defaults, chunked prefill 16384",
        "tokens": 980344,
    },
    {
        "url": "NVIDIA/TensorRT-LLM#6294",
        "engine": "trtllm",
        "version": "0.20",
        "model": "Llama-3.1-8B",
        "gpu": "H100-SXM-80GB",
        "tp": 1,
        "dtype": "fp8",
        "kv": "fp8",
        "engine_args": {
            "gpu_memory_utilization": 0.8,
            "max_num_seqs": 4096,
            "max_num_batched_tokens": 23552,
            "block_size": 32,
        },
        "settings": "free fraction 0.8, batch 4096, 23552 tokens",
        "tokens": 860320,
    },
]


def _other_tokens(db, c: dict) -> int:
    pool = PoolConfig(
        gpu=c["gpu"],
        tp=c["tp"],
        ep=c.get("ep", 1),
        dtype=c["dtype"],
        kv_cache_dtype=c["kv"],
        engine=EngineConfig(engine=c["engine"], version=c["version"], **c["engine_args"]),
    )
    return plan_memory(deployment_for(pool, db.model(c["model"]), db)).kv_tokens


def vllm_points(db) -> list[dict]:
    """The vLLM log points expressible in hwdb, each with the replayed plan beside what was logged."""
    out = []
    for p in yaml.safe_load((DATA / "vllm_memory_logs.yaml").read_text())["points"]:
        model, gpu = _model(p.get("model")), _gpu(p.get("gpu"))
        if not (model and gpu and p.get("kv_cache_gib") and p.get("gpu_memory_utilization") and p.get("tp")):
            continue
        version = str(p.get("vllm_version", "")).split()[0]
        if not version[:1].isdigit() or version.startswith("0.6") or "float32" in str(p.get("dtype")):
            continue
        eng = {k: p[k] for k in ("max_num_seqs", "max_num_batched_tokens", "max_model_len") if p.get(k)}
        pool = PoolConfig(
            gpu=gpu,
            tp=int(p["tp"]),
            pp=int(p.get("pp") or 1),
            dtype=_dtype(p),
            kv_cache_dtype="fp8" if p.get("kv_cache_dtype") == "fp8" else "auto",
            engine=EngineConfig(
                engine="vllm-v1",
                version=version,
                enforce_eager=bool(p.get("enforce_eager")),
                gpu_memory_utilization=float(p["gpu_memory_utilization"]),
                **eng,
            ),
        )
        try:
            mem = plan_memory(deployment_for(pool, db.model(model), db))
        except (ScenarioError, FitError) as exc:
            out.append({**p, "hw": model, "pred_kv_gib": None, "why": str(exc)[:80]})
            continue
        out.append(
            {
                **p,
                "hw": model,
                "pred_kv_gib": mem.kv_bytes / GiB,
                "pred_act_gib": mem.activation_bytes / GiB,
                "pred_weights_gib": mem.weight_bytes / GiB,
                "why": "",
            }
        )
    return out


def activation_fit(points: list[dict], db) -> tuple[np.ndarray, list[tuple[str, float, float, bool]]]:
    """Coefficients fitted on every other model's 0.19 logs and (model, logged, predicted, held out) rows."""
    rows = []
    for p in points:
        if (
            str(p.get("vllm_version", "")).startswith("0.19")
            and p.get("activation_peak_gib")
            and int(p.get("pp") or 1) == 1
        ):
            a = db.model(p["hw"]).arch
            t, s = p.get("max_num_batched_tokens") or 8192, p.get("max_num_seqs") or 1024
            rows.append(
                (
                    p["hw"],
                    [1.0, t * a.hidden_size * 2 / GiB, s * a.vocab_size * 4 / GiB, float(a.is_moe)],
                    float(p["activation_peak_gib"]),
                )
            )
    names = sorted({r[0] for r in rows})
    held = set(names[1::2])
    fit = [r for r in rows if r[0] not in held]
    coef, *_ = np.linalg.lstsq(np.array([r[1] for r in fit]), np.array([r[2] for r in fit]), rcond=None)
    return coef, [(m, y, float(np.dot(coef, x)), m in held) for m, x, y in rows]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", type=Path, help="write the tables to this file")
    args = ap.parse_args(argv)
    db = hwdb.load()
    pts = vllm_points(db)
    coef, act = activation_fit(pts, db)
    lines = [
        "# Engine memory against start-up logs",
        "",
        "`python -m calibration.kernels.memory_fit --markdown docs/validation/memory_logs.md`; data and URLs in",
        "`hwdb/data/validation/vllm_memory_logs.yaml`.",
        "",
        "## vLLM 0.19 activation peak (GiB): fit on every other model, checked on the rest",
        "",
        f"Fitted: base {coef[0]:.3f} GiB, x{coef[1]:.2f} tokens x hidden x 2 B, x{coef[2]:.2f} seqs x vocab"
        f" x 4 B, MoE +{coef[3]:.3f} GiB.",
        "",
        "| model | logged | predicted | held out |",
        "|---|---|---|---|",
    ]
    lines += [f"| {m} | {y:.2f} | {p:.2f} | {'yes' if h else ''} |" for m, y, p, h in sorted(set(act))]
    err = [abs(p - y) for _, y, p, h in act if h]
    lines += [
        "",
        f"Held-out mean |error| {np.mean(err):.2f} GiB, max {max(err):.2f} GiB ({len(err)} logs).",
        "",
        "## KV cache end to end (vLLM, the shipped terms)",
        "",
        "| log | release | model | TP/PP | util | logged KV GiB | predicted | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    errs = []
    for p in pts:
        pred = p["pred_kv_gib"]
        e = "" if pred is None else f"{(pred - p['kv_cache_gib']) / p['kv_cache_gib'] * 100:+.1f} %"
        if pred is not None:
            errs.append(abs(pred - p["kv_cache_gib"]) / p["kv_cache_gib"])
        lines.append(
            f"| {p.get('id')} | {str(p.get('vllm_version')).split()[0]} | {p['hw']} | "
            f"{p['tp']}/{int(p.get('pp') or 1)} | {p['gpu_memory_utilization']} | {p['kv_cache_gib']:.2f} | "
            f"{'refused: ' + p['why'] if pred is None else f'{pred:.2f}'} | {e} |"
        )
    lines += [
        "",
        f"{len(errs)} logs: median |error| {np.median(errs) * 100:.1f} %, "
        f"mean {np.mean(errs) * 100:.1f} %, max {max(errs) * 100:.1f} %.",
    ]
    lines += [
        "",
        "## SGLang and TensorRT-LLM KV tokens",
        "",
        "| log | engine release | model | layout | settings | logged tokens | predicted | error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in OTHER:
        tokens = _other_tokens(db, case)
        lines.append(
            f"| {case['url']} | {case['engine']} {case['version']} | {case['model']} | "
            f"TP{case['tp']} EP{case.get('ep', 1)} {case['gpu']} | {case['settings']} | {case['tokens']:,} | "
            f"{tokens:,} | "
            f"{(tokens - case['tokens']) / case['tokens'] * 100:+.1f} % |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
