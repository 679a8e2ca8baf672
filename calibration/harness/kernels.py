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
import torch.nn.functional as F

from calibration.harness.bundle import Bundle, BundleError, now_iso
from calibration.harness.env import git_commit, hardware
from calibration.harness.kernels_timing import TORCH_DTYPES, Timer, device_info, pick_dtype, run_allreduce

PHASES = ("gemm", "attn_prefill", "attn_decode", "membw", "allreduce")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# Grids (full, quick).
M_GRID = ([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], [1, 4, 16, 64, 256, 1024])
PREFILL_SEQ = ([128, 256, 512, 1024, 2048, 4096, 8192], [128, 256, 512])
DECODE_CTX = ([128, 512, 2048, 8192, 32768], [128, 1024])
DECODE_BATCH = ([1, 4, 16, 64, 256], [1, 8])
COPY_MIB = ([1, 4, 16, 64, 256, 1024], [1, 8, 64])
AR_BYTES = ([4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20], [4 << 10, 256 << 10, 4 << 20])


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


# =============================================================================== phases
class Runner:
    def __init__(self, b: Bundle, args, device: torch.device, dtype: str, shapes: dict):
        self.b, self.args, self.device, self.dtype, self.shapes = b, args, device, dtype, shapes
        self.tdt = TORCH_DTYPES[dtype]
        self.timer = Timer(device, args.repeats, budget_s=args.budget_s)
        self.g = 1 if args.quick else 0  # grid index
        self.n_new = 0

    def grid(self, pair):
        return pair[self.g]

    def _start(self, phase: str) -> bool:
        if self.b.phase_done(phase):
            print(f"[{phase}] already done, skipped", flush=True)
            return False
        self.b.append(phase, {"kind": "phase_start", "segment": self.b.next_segment(phase), "time": now_iso()})
        return True

    def _done(self, phase: str, **extra):
        self.b.append(phase, {"kind": "phase_done", "time": now_iso(), **extra})

    def _record(self, phase: str, rid: str, fn, info: dict) -> bool:
        """Time ``fn`` unless ``rid`` is recorded; False when the max-call guard stops the sweep."""
        if rid in self.done_ids:
            return True
        first = self.timer.first_call(fn)
        if first > self.args.max_call_s:
            self.b.append(
                phase,
                {
                    "kind": "note",
                    "id": rid,
                    "skipped": True,
                    "reason": f"one call took {first:.3g} s > --max-call-s {self.args.max_call_s}; "
                    f"larger shapes of this sweep skipped",
                },
            )
            return False
        r = self.timer.measure(fn, first)
        rec = {
            "kind": "request",
            "id": rid,
            "ok": True,
            "op": phase,
            "dtype": self.dtype,
            "device": self.device.type,
            **info,
            **r,
        }
        self.b.append(phase, rec)
        self.n_new += 1
        extra = ""
        if info.get("flops"):
            extra += f" {info['flops'] / r['seconds'] / 1e9:.1f} GFLOP/s"
        if info.get("bytes"):
            extra += f" {info['bytes'] / r['seconds'] / 1e9:.2f} GB/s"
        print(f"[{phase}] {rid}: {r['seconds'] * 1e6:.1f} us{extra}", flush=True)
        return True

    def _fits(self, nbytes: float) -> bool:
        return nbytes <= self.args.max_bytes

    # ------------------------------------------------------------------ gemm
    def gemm(self):
        ph = "gemm"
        if not self._start(ph):
            return
        self.done_ids = self.b.completed_ids(ph)
        eb = DTYPE_BYTES[self.dtype]
        for name, s in self.shapes["gemm"].items():
            n, k = s["n"], s["k"]
            w = torch.randn(n, k, device=self.device, dtype=self.tdt)
            for m in self.grid(M_GRID):
                if not self._fits((m * k + m * n + n * k) * eb):
                    break
                x = torch.randn(m, k, device=self.device, dtype=self.tdt)
                info = {
                    "layer": name,
                    "m": m,
                    "n": n,
                    "k": k,
                    "flops": 2.0 * m * n * k,
                    "bytes": float((m * k + m * n) * eb + n * k * eb),
                }
                if not self._record(ph, f"{name}:m={m}", lambda x=x, w=w: F.linear(x, w), info):
                    break
            del w
        self._done(ph)

    # ------------------------------------------------------------------ attention
    def attn_prefill(self):
        ph = "attn_prefill"
        if not self._start(ph):
            return
        self.done_ids = self.b.completed_ids(ph)
        h, d, eb = self.shapes["heads_per_rank"], self.shapes["head_dim"], DTYPE_BYTES[self.dtype]
        for s in self.grid(PREFILL_SEQ):
            if not self._fits(4 * h * s * d * eb + h * s * s * 4):  # q,k,v,o (+ a math-backend score matrix)
                break
            q, k, v = (torch.randn(1, h, s, d, device=self.device, dtype=self.tdt) for _ in range(3))
            info = {"batch_size": 1, "isl": s, "num_heads": h, "head_dim": d, "flops": 4.0 * (s * s / 2.0) * h * d}
            if not self._record(
                ph, f"b=1:s={s}", lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, is_causal=True), info
            ):
                break
        self._done(ph)

    def attn_decode(self):
        ph = "attn_decode"
        if not self._start(ph):
            return
        self.done_ids = self.b.completed_ids(ph)
        h, d, eb = self.shapes["heads_per_rank"], self.shapes["head_dim"], DTYPE_BYTES[self.dtype]
        for bsz in self.grid(DECODE_BATCH):
            for ctx in self.grid(DECODE_CTX):
                kv_bytes = 2.0 * bsz * h * ctx * d * eb
                if not self._fits(kv_bytes):
                    break
                q = torch.randn(bsz, h, 1, d, device=self.device, dtype=self.tdt)
                k, v = (torch.randn(bsz, h, ctx, d, device=self.device, dtype=self.tdt) for _ in range(2))
                info = {
                    "batch_size": bsz,
                    "ctx": ctx,
                    "num_heads": h,
                    "num_kv_heads_read": h,
                    "num_key_value_heads": self.shapes["kv_heads_per_rank"],
                    "head_dim": d,
                    "gqa": "expanded",
                    "kv_bytes_per_elem": eb,
                    "bytes": kv_bytes,
                }
                ok = self._record(
                    ph, f"b={bsz}:ctx={ctx}", lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v), info
                )
                del q, k, v
                if not ok:
                    break
        self._done(ph)

    # ------------------------------------------------------------------ memory bandwidth
    def membw(self):
        ph = "membw"
        if not self._start(ph):
            return
        self.done_ids = self.b.completed_ids(ph)
        for mib in self.grid(COPY_MIB):
            size = mib << 20
            if not self._fits(2 * size):
                break
            src = torch.empty(size, device=self.device, dtype=torch.uint8).fill_(1)
            dst = torch.empty_like(src)
            info = {"size_bytes": size, "bytes": 2.0 * size}
            ok = self._record(ph, f"copy:{mib}MiB", lambda src=src, dst=dst: dst.copy_(src), info)
            del src, dst
            if not ok:
                break
        self._done(ph)

    # ------------------------------------------------------------------ all-reduce
    def allreduce(self):
        ph = "allreduce"
        if not self._start(ph):
            return
        reason, backend, world = None, None, 0
        if not torch.distributed.is_available():
            reason = "torch.distributed is not available in this torch build"
        elif self.device.type == "cuda":
            world = torch.cuda.device_count()
            if world < 2:
                reason = f"only {world} CUDA device visible; all-reduce needs at least 2"
            elif not torch.distributed.is_nccl_available():
                reason = "NCCL is not available in this torch build"
            backend = "nccl"
        else:
            world, backend = 2, "gloo"
            if not torch.distributed.is_gloo_available():
                reason = "gloo is not available in this torch build"
        if self.args.no_allreduce:
            reason = "disabled with --no-allreduce"
        if reason is None:
            assert backend is not None  # every branch without a reason names one
            try:
                results = run_allreduce(
                    backend,
                    world,
                    self.grid(AR_BYTES),
                    self.dtype,
                    self.args.repeats,
                    timeout_s=self.args.allreduce_timeout_s,
                )
            except Exception as exc:  # noqa: BLE001 - any failure becomes a recorded skip
                reason = f"{backend} all-reduce with {world} processes failed: {exc!r}"[:500]
        if reason is not None:
            print(f"[{ph}] skipped: {reason}", flush=True)
            self.b.append(ph, {"kind": "note", "skipped": True, "reason": reason})
            self._done(ph, skipped=True, reason=reason)
            return
        done = self.b.completed_ids(ph)
        for r in results:
            rid = f"{backend}:w={world}:{r['bytes']}B"
            if rid in done:
                continue
            algbw = r["bytes"] / r["seconds"]
            rec = {
                "kind": "request",
                "id": rid,
                "ok": True,
                "op": ph,
                "backend": backend,
                "world_size": world,
                "dtype": self.dtype,
                "device": self.device.type,
                "message_bytes": r["bytes"],
                "seconds": r["seconds"],
                "seconds_min": r["seconds_min"],
                "samples": r["samples"],
                "algbw_Bps": algbw,
                "busbw_Bps": algbw * 2 * (world - 1) / world,
            }
            self.b.append(ph, rec)
            self.n_new += 1
            print(f"[{ph}] {rid}: {r['seconds'] * 1e6:.1f} us busbw {rec['busbw_Bps'] / 1e9:.2f} GB/s", flush=True)
        self._done(ph)


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
