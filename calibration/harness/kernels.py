"""Kernel microbenchmarks: GEMM, attention, memory bandwidth and all-reduce timed with torch.

Calibrates the simulator's efficiency curves where engine runs are unavailable.  Runs on CUDA when
torch sees a GPU, on the CPU otherwise (``--device`` overrides)::

    python -m calibration.harness.kernels --model-config PATH --tp 1 --out DIR [--quick]

Needs only torch, numpy and the standard library (run it in the vLLM / torch environment, e.g.
``.venv-vllm/bin/python``); it never imports the simulator.  Phases (one JSONL file each):

- ``gemm``: ``torch.nn.functional.linear`` at the model's linear layers per TP rank (qkv, o,
  gate_up, down; n = output, k = input features) for m tokens on a log grid.
- ``attn_prefill``: ``scaled_dot_product_attention``, causal, batch 1, heads/TP, seq on a grid.
- ``attn_decode``: SDPA with one query token, KV length x batch grid, KV heads expanded to the
  query heads (GQA expanded before timing, so the kernel reads heads/TP KV heads).
- ``membw``: ``dst.copy_(src)`` of large tensors; bytes moved = 2 x size.
- ``allreduce``: ``torch.distributed.all_reduce``: NCCL over all local GPUs (>1 needed), or gloo
  with 2 processes on 127.0.0.1 on the CPU; skipped with a recorded reason where it cannot run.

Each measurement is the median of a few repeats after a warm-up; a repeat times ``inner`` back-to-back
calls (enough for ~2 ms) so that tiny kernels are not lost in timer resolution.  CUDA timing uses
events around the loop; CPU timing ``time.perf_counter``.  The bundle (see ``bundle.py``) is
resumable: a second run into the same ``--out`` skips shapes already recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from calibration.harness.bundle import Bundle, BundleError, now_iso
from calibration.harness.env import git_commit, hardware
from calibration.harness.kernels_phases import PHASES, Runner
from calibration.harness.kernels_timing import TORCH_DTYPES, device_info, pick_dtype


# =============================================================================== shapes
def load_config(path: str | Path) -> tuple[dict, Path]:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    cfg = json.loads(p.read_text())
    if not isinstance(cfg, dict):
        raise ValueError(f"{p}: config.json must hold a JSON object")
    return cfg, p


def model_shapes(cfg: dict, tp: int) -> dict:
    """Layer shapes per TP rank from a Hugging Face config (dense decoder; MoE uses its expert size)."""
    t = {**cfg, **(cfg.get("text_config") or {})}

    def get(*keys, default=None):
        for k in keys:
            if t.get(k) is not None:
                return t[k]
        if default is None:
            raise ValueError(f"config lacks {keys[0]!r}")
        return default

    hidden = int(get("hidden_size", "d_model", "n_embd"))
    heads = int(get("num_attention_heads", "n_head"))
    kv_heads = int(get("num_key_value_heads", default=heads))
    head_dim = int(get("head_dim", default=hidden // heads))
    inter = int(
        get("moe_intermediate_size", "intermediate_size", "ffn_dim")
        if (t.get("num_local_experts") or t.get("n_routed_experts") or t.get("num_experts"))
        else get("intermediate_size", "ffn_dim")
    )
    vocab = int(get("vocab_size"))
    if heads % tp or inter % tp:
        raise ValueError(f"--tp {tp} does not divide heads={heads} / intermediate={inter}")
    h_tp = heads // tp
    kv_tp = max(1, kv_heads // tp)  # KV heads are replicated when tp > kv_heads
    layers = {
        "qkv": ((h_tp + 2 * kv_tp) * head_dim, hidden),
        "o": (hidden, h_tp * head_dim),
        "gate_up": (2 * inter // tp, hidden),
        "down": (hidden, inter // tp),
    }
    return {
        "hidden": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate": inter,
        "vocab": vocab,
        "tp": tp,
        "heads_per_rank": h_tp,
        "kv_heads_per_rank": kv_tp,
        "gemm": {k: {"n": n, "k": kk} for k, (n, kk) in layers.items()},
    }


# =============================================================================== main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.harness.kernels", description=__doc__.split("\n")[0])
    ap.add_argument("--model-config", required=True, help="Hugging Face config.json (or the model folder)")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree: shapes are per rank")
    ap.add_argument("--out", required=True, type=Path, help="bundle folder (resumed if it holds one)")
    ap.add_argument("--quick", action="store_true", help="small grids (seconds on a CPU)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--dtype", choices=tuple(TORCH_DTYPES), default="bf16")
    ap.add_argument("--phases", nargs="+", choices=PHASES, default=list(PHASES))
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per shape (default 5, quick 3)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument(
        "--max-call-s",
        type=float,
        default=None,
        help="stop a sweep when one call takes longer (default 2 s on CPU, 1 s on CUDA)",
    )
    ap.add_argument(
        "--max-bytes",
        type=float,
        default=None,
        help="largest working set per shape (default 1 GiB on CPU, 25%% of GPU memory)",
    )
    ap.add_argument("--budget-s", type=float, default=1.5, help="time budget for the repeats of one shape")
    ap.add_argument("--allreduce-timeout-s", type=float, default=120.0)
    ap.add_argument("--no-allreduce", action="store_true", help="record all-reduce as skipped")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            print("error: --device cuda but torch sees no CUDA device", file=sys.stderr)
            return 2
    args.repeats = args.repeats or (3 if args.quick else 5)
    if args.max_call_s is None:
        args.max_call_s = 1.0 if device.type == "cuda" else 2.0
    if args.max_bytes is None:
        args.max_bytes = (
            torch.cuda.get_device_properties(device).total_memory / 4 if device.type == "cuda" else float(1 << 30)
        )
    cfg, cfg_path = load_config(args.model_config)
    shapes = model_shapes(cfg, args.tp)
    dtype, dtype_note = pick_dtype(args.dtype, device)
    sha = hashlib.sha256(cfg_path.read_bytes()).hexdigest()
    name = cfg.get("_name_or_path") or cfg_path.resolve().parent.name
    run = {
        "started": now_iso(),
        "argv": sys.argv if argv is None else list(argv),
        "quick": args.quick,
        "repeats": args.repeats,
        "phases": args.phases,
    }

    ident = {"device_type": device.type, "dtype": dtype, "tp": args.tp}
    if (args.out / "manifest.json").exists():
        b = Bundle.open(args.out)
        m = b.manifest
        if m.get("mode") != "kernels":
            raise BundleError(f"{args.out} is a {m.get('mode')!r} bundle, not a kernel-benchmark bundle")
        old = {k: m.get("kernels", {}).get(k) for k in ident}
        if old != ident or m["model"].get("config_sha256") != sha:
            raise BundleError(
                f"{args.out} was measured with {old} / config {m['model'].get('config_sha256')}; "
                f"now {ident} / {sha}: use another --out"
            )
        print(f"resuming {args.out}", flush=True)
    else:
        manifest = {
            "mode": "kernels",
            "model": {"served_name": str(name), "config_path": str(cfg_path.resolve()), "config_sha256": sha},
            "plan": [{"name": p, "kind": "kernel"} for p in args.phases],
            "hardware": hardware(),
            "device": device_info(device),
            "versions": {
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "numpy": np.__version__,
                "torch_cuda": torch.version.cuda,
            },
            "epdsim": git_commit(),
            "kernels": {
                **ident,
                "requested_dtype": args.dtype,
                "dtype_note": dtype_note,
                "shapes": shapes,
                "timing": ("cuda events" if device.type == "cuda" else "time.perf_counter")
                + "; median of repeats, each repeat = inner back-to-back calls / inner",
            },
        }
        b = Bundle.create(args.out, manifest)
    b.manifest.setdefault("runs", []).append(run)
    b.write_manifest()

    print(
        f"device {device.type} ({device_info(device)['name']}), dtype {dtype}"
        + (f" ({dtype_note})" if dtype_note else "")
        + f", tp {args.tp}",
        flush=True,
    )
    r = Runner(b, args, device, dtype, shapes)
    t0 = time.perf_counter()
    for ph in PHASES:
        if ph in args.phases:
            getattr(r, ph)()
    run["finished"] = now_iso()
    run["seconds"] = round(time.perf_counter() - t0, 2)
    run["new_records"] = r.n_new
    b.write_manifest()
    print(f"{r.n_new} new records in {run['seconds']} s -> {args.out}", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
