"""Timing primitives of the kernel microbenchmarks (``calibration/harness/kernels.py``).

``Timer`` times a callable: CUDA events around a loop on a GPU, ``time.perf_counter`` on the CPU;
a repeat runs ``inner`` back-to-back calls (about 2 ms) so tiny kernels are not lost in timer
resolution, and the median of the repeats is reported (seconds).

All-reduce: ``torch.distributed.all_reduce`` in ``world`` spawned processes: NCCL, one GPU per rank, or gloo on
127.0.0.1 for the CPU.  Each size is timed ``repeats`` times between barriers after two warm-up calls;
rank 0 writes the medians (seconds) and the bytes actually reduced.
"""

from __future__ import annotations

import datetime as _dt
import json
import multiprocessing as mp
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from calibration.harness.env import hardware

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


class Timer:
    def __init__(self, device: torch.device, repeats: int, target_s: float = 2e-3, budget_s: float = 1.5):
        self.device, self.repeats, self.target_s, self.budget_s = device, repeats, target_s, budget_s
        self.cuda = device.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def _loop(self, fn, inner: int) -> float:
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) * 1e-3 / inner
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        return (time.perf_counter() - t0) / inner

    def first_call(self, fn) -> float:
        """Warm-up call, timed (the max-call guard uses it)."""
        self.sync()
        t0 = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t0

    def measure(self, fn, first_s: float) -> dict:
        one = self._loop(fn, 1)  # second warm-up, already warm
        one = min(one, first_s)
        inner = max(1, min(1000, int(self.target_s / max(one, 1e-7))))
        samples, t_start = [], time.perf_counter()
        for i in range(self.repeats):
            samples.append(self._loop(fn, inner))
            if i >= 2 and time.perf_counter() - t_start > self.budget_s:
                break
        return {
            "seconds": statistics.median(samples),
            "seconds_min": min(samples),
            "samples": [float(f"{s:.6g}") for s in samples],
            "inner": inner,
        }


def pick_dtype(want: str, device: torch.device) -> tuple[str, str | None]:
    """The dtype to use: ``want`` if a small matmul and SDPA run in it, else fp32 (with the reason)."""
    try:
        a = torch.randn(8, 16, device=device, dtype=TORCH_DTYPES[want])
        F.linear(a, a)
        q = torch.randn(1, 1, 4, 16, device=device, dtype=TORCH_DTYPES[want])
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        return want, None
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        if want == "fp32":
            raise
        return "fp32", f"{want} matmul/SDPA unsupported on {device.type}: {exc}"[:300]


def device_info(device: torch.device) -> dict:
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {
            "type": "cuda",
            "name": p.name,
            "count": torch.cuda.device_count(),
            "memory_bytes": p.total_memory,
            "capability": f"{p.major}.{p.minor}",
            "cuda": torch.version.cuda,
        }
    return {
        "type": "cpu",
        "name": hardware()["cpu_model"],
        "threads": torch.get_num_threads(),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),
    }


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ar_worker(rank: int, world: int, port: int, backend: str, sizes: list, dtype: str, repeats: int, out: str) -> None:
    import torch.distributed as dist  # noqa: PLC0415 - only the spawned all-reduce workers set it up

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=_dt.timedelta(seconds=60))
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    tdt = TORCH_DTYPES[dtype] if backend == "nccl" else torch.float32  # gloo: fp32 sums only reliably
    res = []
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // (torch.finfo(tdt).bits // 8)), device=dev, dtype=tdt)
        for _ in range(2):
            dist.all_reduce(t)
        samples = []
        for _ in range(repeats):
            dist.barrier()
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            samples.append(time.perf_counter() - t0)
        res.append(
            {
                "bytes": t.numel() * t.element_size(),
                "seconds": statistics.median(samples),
                "seconds_min": min(samples),
                "samples": [float(f"{s:.6g}") for s in samples],
                "dtype": str(tdt),
            }
        )
    if rank == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def run_allreduce(backend: str, world: int, sizes: list, dtype: str, repeats: int, timeout_s: float) -> list:
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "ar.json")
        port = _free_port()
        procs = [
            ctx.Process(target=_ar_worker, args=(r, world, port, backend, sizes, dtype, repeats, out))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.kill()
            p.join(5)
        if hung:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s")
        bad = [p.exitcode for p in procs if p.exitcode != 0]
        if bad or not os.path.exists(out):
            raise RuntimeError(f"worker exit codes {[p.exitcode for p in procs]}")
        return json.loads(Path(out).read_text())
