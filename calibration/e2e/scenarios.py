"""A measured serving run (:class:`calibration.e2e.rows.Row`) as an epdsim scenario.

:func:`why_not` says in one short phrase why the simulator cannot express a row ('' when it can: the
reasons are counted, never dropped silently); :func:`to_scenario` turns a row it can express into a
scenario dict: the row's GPU, layout, weight and KV-cache formats and engine release, and a closed-loop
client at the row's concurrency with the benchmark's random lengths (disaggregated rows as a prefill
and a decode pool).
"""

from __future__ import annotations

import re

from calibration.e2e.rows import ENGINES, QUANT, RANGE_RATIO, SYSTEMS, Row
from simulator.kv_rule import release_key


def _layout_why(tp: int, dp: int, moe_tp: int, moe_ep: int, arch, gpu, where: str = "") -> str:
    if arch.is_moe and tp * dp != moe_tp * moe_ep:
        return f"layout inconsistent{where}: attention tp x dp differs from MoE tp x ep"
    if tp > gpu.gpus_per_node:
        return f"tensor parallelism across nodes{where} (tp={tp} on {gpu.gpus_per_node}-GPU nodes) not modelled"
    return ""


def why_not(row: Row, db) -> str:
    """'' when epdsim can express ``row``, else the missing feature in a few words."""
    if row.disagg and not row.sides:
        return "disaggregated run without its worker counts in the table"
    if row.system not in SYSTEMS:
        return f"GPU {row.system} not in hwdb"
    if row.backend not in ENGINES:
        return f"engine {row.backend} not modelled"
    try:
        db.engine(ENGINES[row.backend])
    except Exception:  # noqa: BLE001 - whatever the hwdb raises for an engine it lacks, the row is reported, not fatal
        return f"engine {row.backend} has no profile in hwdb"
    if row.quant not in QUANT and row.precision not in QUANT:
        return f"weight format {row.quant} not modelled"
    try:
        arch = db.model(row.model).arch
    except Exception:  # noqa: BLE001 - whatever the hwdb raises for a model it lacks, the row is reported, not fatal
        return f"model {row.model.split('/')[-1]} not in hwdb"
    gpu = db.gpu(SYSTEMS[row.system])
    for where, (_, tp, dp, moe_tp, moe_ep) in (
        zip((" (prefill)", " (decode)"), row.sides, strict=True)
        if row.disagg
        else [("", (1, row.tp, row.dp, row.moe_tp, row.moe_ep))]
    ):
        why = _layout_why(tp, dp, moe_tp, moe_ep, arch, gpu, where)
        if why:
            return why
    dtype = dtype_of(row, db)
    if dtype == "fp8" and dtype not in gpu.peak_flops:
        return f"{dtype} on {row.system} (no {dtype} tensor cores)"
    if not (row.concurrency >= 1 and row.isl >= 1 and row.osl >= 2):
        return "degenerate row (concurrency or lengths)"
    if not (row.ttft_s > 0 and row.tpot_s > 0):
        return "no measured TTFT/TPOT"
    return ""


def dtype_of(row: Row, db) -> str:
    """The pool dtype of a row: 4-bit floating-point weights on a GPU without fp4 tensor cores run as
    weight-only 4-bit (gpt-oss MXFP4 on Hopper goes through vLLM's Marlin/Triton W4A16 kernels)."""
    dtype = QUANT[row.quant] if isinstance(row.quant, str) and row.quant in QUANT else QUANT.get(row.precision, "")
    if dtype == "fp4" and "fp4" not in db.gpu(SYSTEMS[row.system]).peak_flops:
        return "int4"
    return dtype


def _spread(length: int, ratio: float) -> dict:
    """The random dataset's lengths: uniform on [ratio x L, L] (InferenceX's benchmark_serving fork)."""
    if ratio >= 1.0:
        return {"kind": "fixed", "value": length}
    return {"kind": "uniform", "low": max(1, int(ratio * length)), "high": length}


# How a row's KV-cache format is chosen (the table does not state it): "quantised-fp8", an fp8 cache for
# every fp8/fp4 run (what the table's quantised campaigns fit: docs/validation/e2e.md lists both modes per
# subset); "rule", the engine release's own --kv-cache-dtype auto for the checkpoint (simulator/kv_rule.py).
KV_MODES = ("quantised-fp8", "rule")


def engine_of(row: Row) -> dict:
    """The pool's engine block: the row's engine and, where the table names a numbered release, that release."""
    engine = {"engine": ENGINES[row.backend], "max_model_len": row.isl + row.osl + 16}
    if row.backend == "sglang":
        # InferenceX's SGLang launch scripts pass --disable-radix-cache (36 of its 38 fixed-length single-node
        # scripts, SemiAnalysisAI/InferenceX benchmarks/single_node/fixed_seq_len): random prompts share nothing,
        # and for a linear-attention model it sets how many requests the state pool runs and keeps the overlap
        # scheduler on (simulator/memory.py linear_state_pool).
        engine["enable_prefix_caching"] = False
    if re.fullmatch(r"[0-9][0-9A-Za-z.+-]{0,39}", row.version):
        engine["version"] = row.version
    recv = sglang_recv_interval(row)
    if recv > 1:
        engine["scheduler_recv_interval"] = recv
    engine.update(sglang_launch_knobs(row))
    if marlin_mxfp4(row):
        engine["moe_backend"] = "marlin"
    return engine


def marlin_mxfp4(row: Row) -> bool:
    """Whether InferenceX ran a colocated vLLM gpt-oss row's MXFP4 experts on Marlin (VLLM_MXFP4_USE_MARLIN=1).

    SemiAnalysisAI/InferenceX PR #327 (2026-01-02: "Update vLLM version to v0.13.0 for NVIDIA configs", "Fix
    H100/H200 perf regression") added the variable to the gpt-oss H100 and H200 vLLM scripts together with the
    move to v0.13.0, and the scripts kept it through their deprecation (July 2026); campaigns of earlier
    releases (0.11) and rows that state none ran vLLM's default, OpenAI's Triton kernel."""
    return (
        row.backend == "vllm"
        and row.system in ("h100_sxm", "h200_sxm")
        and row.model.split("/")[-1].startswith("gpt-oss")
        and re.fullmatch(r"[0-9][0-9A-Za-z.+-]{0,39}", row.version) is not None
        and release_key(row.version) >= release_key("0.13")
    )


def sglang_recv_interval(row: Row) -> int:
    """The ``--scheduler-recv-interval`` InferenceX launched a colocated SGLang run on B200/B300 with (1: none).

    SemiAnalysisAI/InferenceX benchmarks/single_node/fixed_seq_len, the scripts in force when the campaigns ran
    (September 2025 to April 2026): dsr1_fp8_b200/b300 30 at TP8 with 16 or more users, else 10, and 10 at TP4;
    dsr1_fp4_b200/b300, qwen3.5_fp8_b200, qwen3.5_fp4_b200/b300 30 with 16 or more users, else 10 (1 with
    attention DP); qwen3.5_fp8_b300 and glm5_fp4_b200/b300 10; glm5_fp8 and every H100/H200 script none.
    """
    if row.backend != "sglang" or row.disagg or row.dp > 1 or row.system not in ("b200_sxm", "b300_sxm"):
        return 1
    name, quant = row.model.split("/")[-1], row.quant if row.quant in QUANT else row.precision
    busy = 30 if row.concurrency >= 16 else 10
    if name.startswith("GLM-5"):
        return 10 if quant == "nvfp4" else 1
    if name.startswith("Qwen3.5"):
        return 10 if quant == "fp8" and row.system == "b300_sxm" else busy
    if name.startswith("DeepSeek"):
        return 10 if quant == "fp8" and row.tp == 4 else busy
    return 1


def sglang_launch_knobs(row: Row) -> dict:
    """The memory and batch flags InferenceX launched a colocated SGLang run on B200/B300/H200 with, as engine fields
    (``{}`` where the script is not known or sets none): ``--chunked-prefill-size`` (max_num_batched_tokens),
    ``--mem-fraction-static`` (gpu_memory_utilization), ``--max-running-requests`` (max_num_seqs) and
    ``--cuda-graph-max-bs`` (max_cudagraph_capture_size).  Without them SGLang takes its per-GPU defaults
    (``memory_tiers`` of hwdb/data/engines/sglang.yaml), under which DeepSeek-R1 in fp8 does not fit 4 B200s.

    SemiAnalysisAI/InferenceX benchmarks/single_node/fixed_seq_len (and their earlier benchmarks/ paths), the
    scripts in force when the campaigns ran (September 2025 to April 2026): dsr1_fp8_b200/b300 at TP8 32768,
    0.82, 128, 128 and at TP4 (8k/1k only) 8192, 0.95, 32, 32; dsr1_fp4_b200/b300 16384, 0.85, 256, 256;
    qwen3.5_fp8_b200 and qwen3.5_bf16_b200/b300 32768, 0.82, 128, the users; qwen3.5_fp4_b200 32768, 0.85,
    128, the users, qwen3.5_fp4_b300 the same at 0.8; qwen3.5_fp8_b300 16384, 0.8, the users, the users;
    glm5_fp8_b200/b300 32768, 0.85, the users, the users; glm5_fp4_b200/b300 32768, 0.9, SGLang's default,
    256.  On H200 (the scripts in force for the 2026-03-25 campaign): dsr1_fp8_h200 32768, 0.82, and 512, 512
    at 1k/1k or 256, 256 otherwise (unchanged since September 2025); qwen3.5_fp8_h200 16384, 0.8, 128, the
    users; glm5_fp8_h200 only --mem-fraction-static 0.85."""
    if row.backend != "sglang" or row.disagg or row.dp > 1 or row.system not in ("b200_sxm", "b300_sxm", "h200_sxm"):
        return {}
    name, quant = row.model.split("/")[-1], QUANT.get(row.quant) or QUANT.get(row.precision, row.precision)
    users, b300 = row.concurrency, row.system == "b300_sxm"
    family = next((f for f in ("DeepSeek", "Qwen3.5", "GLM-5") if name.startswith(f)), "")
    if row.system == "h200_sxm":
        short = row.isl == 1024 and row.osl == 1024  # the script's own test
        h200: dict[tuple[str, str], dict] = {
            ("DeepSeek", "fp8"): {
                "max_num_batched_tokens": 32768,
                "gpu_memory_utilization": 0.82,
                "max_num_seqs": 512 if short else 256,
                "max_cudagraph_capture_size": 512 if short else 256,
            },
            ("Qwen3.5", "fp8"): {
                "max_num_batched_tokens": 16384,
                "gpu_memory_utilization": 0.8,
                "max_num_seqs": 128,
                "max_cudagraph_capture_size": users,
            },
            ("GLM-5", "fp8"): {"gpu_memory_utilization": 0.85},
        }
        return h200.get((family, quant), {})
    table: dict[tuple[str, str], tuple[int, float, int | None, int]] = {
        ("DeepSeek", "fp8"): (32768, 0.82, 128, 128) if row.tp >= 8 else (8192, 0.95, 32, 32),
        ("DeepSeek", "fp4"): (16384, 0.85, 256, 256),
        ("Qwen3.5", "fp8"): (16384, 0.8, users, users) if b300 else (32768, 0.82, 128, users),
        ("Qwen3.5", "bf16"): (32768, 0.82, 128, users),
        ("Qwen3.5", "fp4"): (32768, 0.8 if b300 else 0.85, 128, users),
        ("GLM-5", "fp8"): (32768, 0.85, users, users),
        ("GLM-5", "fp4"): (32768, 0.9, None, 256),
    }
    knobs = table.get((family, quant))
    if knobs is None:
        return {}
    tokens, fraction, seqs, graphs = knobs
    out = {"max_num_batched_tokens": tokens, "gpu_memory_utilization": fraction, "max_cudagraph_capture_size": graphs}
    return out | ({"max_num_seqs": seqs} if seqs else {})


def to_scenario(
    row: Row,
    db,
    requests_per_client: int,
    client: dict,
    range_ratio: float = RANGE_RATIO,
    kv_mode: str = "quantised-fp8",
) -> dict:
    """A scenario dict that replays ``row`` (only call when :func:`why_not` is '')."""
    dtype = dtype_of(row, db)
    # "quantised-fp8": the capacity-bound Llama-3.1-70B fp8 TP1 fitting rows (C=64, 9k-token requests) fit
    # only with an fp8 cache (TTFT 0.38 s and 7.8 s measured, 0.49 s and 3.8 s simulated with fp8 KV, 10 s
    # and 42 s with bf16 KV); the rule gives them fp8 too, from the checkpoint's ModelOpt directive.
    kv = "auto" if kv_mode == "rule" else ("fp8" if dtype in ("fp8", "fp4") else "bf16")
    n = max(row.concurrency * requests_per_client, row.concurrency + 8)
    if row.disagg:
        return _pd_scenario(row, db, dtype, kv, n, client, range_ratio)
    return {
        "name": row.id,
        "model": row.model,
        "pools": [
            {
                "name": "main",
                "gpu": SYSTEMS[row.system],
                "tp": row.tp,
                "pp": row.pp,
                "dp": row.dp,
                "ep": row.moe_ep if db.model(row.model).arch.is_moe else 1,
                "dtype": dtype,
                "kv_cache_dtype": kv,
                "engine": engine_of(row),
            }
        ],
        "workload": {
            "arrival": {"kind": "closed", "concurrency": row.concurrency, **client},
            "input_length": _spread(row.isl, range_ratio),
            "output_length": _spread(row.osl, range_ratio),
            "num_requests": n,
        },
    }


def _pd_scenario(row: Row, db, dtype: str, kv: str, n: int, client: dict, range_ratio: float) -> dict:
    """A disaggregated row as a PD scenario: one prefill and one decode pool with the row's workers and
    layouts, KV over NVLink when both sides fit one NVLink domain (GB200/GB300 NVL72 racks), else the
    GPU's scale-out fabric; SGLang's own PD flow for SGLang rows (Dynamo's NIXL connector for all)."""
    gpu = db.gpu(SYSTEMS[row.system])
    moe = db.model(row.model).arch.is_moe
    pools, total = [], 0
    for role, (workers, tp, dp, _, moe_ep) in zip(("prefill", "decode"), row.sides, strict=True):
        pools.append(
            {
                "name": role,
                "role": role,
                "gpu": SYSTEMS[row.system],
                "tp": tp,
                "dp": dp,
                "ep": moe_ep if moe else 1,
                "instances": workers,
                "dtype": dtype,
                "kv_cache_dtype": kv,
                "engine": engine_of(row),
            }
        )
        total += workers * tp * dp
    return {
        "name": row.id,
        "model": row.model,
        "pools": pools,
        "kv_transfer": {
            "connector": "nixl",
            "flow": "sglang" if row.backend == "sglang" else "vllm",
            "same_node": total <= gpu.gpus_per_node,
        },
        "workload": {
            "arrival": {"kind": "closed", "concurrency": row.concurrency, **client},
            "input_length": _spread(row.isl, range_ratio),
            "output_length": _spread(row.osl, range_ratio),
            "num_requests": n,
        },
    }
