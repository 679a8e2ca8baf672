"""The phases of the kernel microbenchmarks (``python -m calibration.harness.kernels``): their shape grids
and the :class:`Runner` that sweeps each phase and appends one record per shape to the bundle.

A record holds the shape, the time of one call (``seconds``: the median over the repeats, from
:class:`~calibration.harness.kernels_timing.Timer`) and the work it does (``flops``, and ``bytes`` moved at
``DTYPE_BYTES`` bytes per element); an all-reduce record holds the message size (bytes) and the algorithm
and bus bandwidths (bytes/s).  Each grid is a pair (full, ``--quick``); a sweep along a grid goes no further
once a shape exceeds ``--max-bytes`` or one call takes longer than ``--max-call-s``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from calibration.harness.bundle import Bundle, now_iso
from calibration.harness.kernels_timing import TORCH_DTYPES, Timer, run_allreduce

PHASES = ("gemm", "attn_prefill", "attn_decode", "membw", "allreduce")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

# Grids (full, quick).
M_GRID = ([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096], [1, 4, 16, 64, 256, 1024])
PREFILL_SEQ = ([128, 256, 512, 1024, 2048, 4096, 8192], [128, 256, 512])
DECODE_CTX = ([128, 512, 2048, 8192, 32768], [128, 1024])
DECODE_BATCH = ([1, 4, 16, 64, 256], [1, 8])
COPY_MIB = ([1, 4, 16, 64, 256, 1024], [1, 8, 64])
AR_BYTES = ([4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20], [4 << 10, 256 << 10, 4 << 20])


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
