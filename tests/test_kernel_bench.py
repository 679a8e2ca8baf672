"""Kernel microbenchmarks (calibration/harness/kernels.py) and their fit (calibration/kernels/bench_fit.py)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from calibration.harness.bundle import Bundle
from calibration.kernels import bench_fit as kbf
from calibration.kernels.tables import decode_attention_time, prefill_attention_time
from hwdb.profiles import Profile

REPO = Path(__file__).resolve().parents[1]
VLLM_PY = REPO / ".venv-vllm" / "bin" / "python"
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 2048,
    "num_hidden_layers": 4,
    "max_position_embeddings": 4096,
}

# H200-like peaks and the curves the synthetic bundle is generated with
PEAKS = {"gpu": "H200-SXM-141GB", "flops": 989e12, "mem_bw": 4.8e12}
TRUE = {"compute": (0.7, 80.0), "memory": (0.8, 3e6), "prefill": (0.55, 3000.0), "decode": (0.75, 2e7)}


def _synthetic_bundle(path: Path, noise: float = 0.03, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    b = Bundle.create(
        path,
        {
            "mode": "kernels",
            "model": {"served_name": "synthetic"},
            "plan": [{"name": p, "kind": "kernel"} for p in ("gemm", "attn_prefill", "attn_decode")],
            "device": {"type": "cuda", "name": "synthetic"},
            "versions": {"torch": "x"},
            "kernels": {"dtype": "bf16", "tp": 1},
        },
    )

    def jitter(t):
        return float(t * (1 + noise * rng.standard_normal()))

    layers = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
    for name, (n, k) in layers.items():
        for m in [2**i for i in range(13)]:
            t = kbf.bench_gemm_time(m, n, k, 2.0, PEAKS["flops"], PEAKS["mem_bw"], TRUE["compute"], TRUE["memory"])
            b.append(
                "gemm",
                {
                    "kind": "request",
                    "id": f"{name}:m={m}",
                    "ok": True,
                    "layer": name,
                    "m": m,
                    "n": n,
                    "k": k,
                    "seconds": jitter(float(t)),
                },
            )
    for s in (128, 256, 512, 1024, 2048, 4096, 8192, 16384):
        t = prefill_attention_time(1, s, 32, 128, PEAKS["flops"], TRUE["prefill"])
        b.append(
            "attn_prefill",
            {
                "kind": "request",
                "id": f"s={s}",
                "ok": True,
                "batch_size": 1,
                "isl": s,
                "num_heads": 32,
                "head_dim": 128,
                "seconds": jitter(float(t)),
            },
        )
    for bs in (1, 4, 16, 64, 256):
        for ctx in (128, 512, 2048, 8192, 32768):
            t = decode_attention_time(bs, ctx, 32, 128, 2.0, PEAKS["mem_bw"], TRUE["decode"])
            b.append(
                "attn_decode",
                {
                    "kind": "request",
                    "id": f"b={bs}:ctx={ctx}",
                    "ok": True,
                    "batch_size": bs,
                    "ctx": ctx,
                    "num_kv_heads_read": 32,
                    "head_dim": 128,
                    "kv_bytes_per_elem": 2,
                    "seconds": jitter(float(t)),
                },
            )
    return path


def test_fit_recovers_synthetic_curves(tmp_path):
    b, frames = kbf.load_bundle(_synthetic_bundle(tmp_path / "b"))
    fit = kbf.fit_bundle(frames, "bf16", PEAKS)
    for key, (mx, half) in TRUE.items():
        got_mx, got_half = fit[key]
        assert got_mx == pytest.approx(mx, rel=0.06), key
        assert got_half == pytest.approx(half, rel=0.3), key
    assert fit["quality"]["gemm"].median_abs_rel_error < 0.05
    prof = kbf.to_profile(b, fit, PEAKS, "bf16", "vllm", None, created="2026-01-01")
    assert prof.compute_efficiency.max_eff == pytest.approx(0.7, rel=0.06)
    out = kbf.write_profile(prof, tmp_path / "hw" / "profiles" / f"{prof.name}.yaml")
    assert Profile.model_validate(yaml.safe_load(out.read_text())) == prof


def test_fit_refuses_an_engine_bundle(tmp_path):
    Bundle.create(tmp_path / "e", {"mode": "launch", "model": {"served_name": "m"}, "plan": []})
    with pytest.raises(kbf.BundleError, match="not a kernel-benchmark bundle"):
        kbf.load_bundle(tmp_path / "e")


def _torch_python() -> str | None:
    if not VLLM_PY.exists():
        return None
    r = subprocess.run([str(VLLM_PY), "-c", "import torch, numpy"], capture_output=True, timeout=120)
    return str(VLLM_PY) if r.returncode == 0 else None


def test_kernels_quick_on_real_torch(tmp_path):
    py = _torch_python()
    if py is None:
        pytest.skip(f"{VLLM_PY} is missing or lacks torch/numpy (the torch environment of the calibration harness)")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    out = tmp_path / "bundle"
    cmd = [
        py,
        "-m",
        "calibration.harness.kernels",
        "--model-config",
        str(cfg),
        "--tp",
        "1",
        "--out",
        str(out),
        "--quick",
        "--threads",
        "1",
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    b = Bundle.open(out)
    assert b.manifest["mode"] == "kernels" and b.manifest["versions"]["torch"]
    for ph in ("gemm", "attn_prefill", "attn_decode", "membw"):
        assert b.requests(ph), ph
        assert b.phase_done(ph), ph
    ar = b.requests("allreduce")
    skips = [n for n in b.records("allreduce", "note") if n.get("skipped")]
    assert ar or (skips and skips[0]["reason"]), "all-reduce has neither records nor a skip reason"
    # GEMM time grows with m at large m (summed over the layers: robust to one noisy shape)
    g = b.requests("gemm")
    by_m: dict[int, float] = {}
    for rec in g:
        assert rec["seconds"] > 0 and rec["dtype"] in ("bf16", "fp32")
        by_m[rec["m"]] = by_m.get(rec["m"], 0.0) + rec["seconds_min"]  # fastest repeat: robust on a busy CPU
    ms = sorted(by_m)
    assert by_m[ms[-1]] > by_m[ms[-3]], by_m
    # resuming adds nothing; with the last GEMM record (and phase_done) torn off it re-measures just that one
    r2 = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert r2.returncode == 0 and "\n0 new records" in r2.stdout, r2.stdout[-1000:]
    f = out / "records" / "gemm.jsonl"
    lines = f.read_text().splitlines()
    assert json.loads(lines[-1])["kind"] == "phase_done" and json.loads(lines[-2])["kind"] == "request"
    last_id = json.loads(lines[-2])["id"]
    f.write_text("\n".join(lines[:-2]) + "\n")
    r3 = subprocess.run(cmd + ["--phases", "gemm"], cwd=REPO, capture_output=True, text=True, timeout=180)
    assert r3.returncode == 0 and "\n1 new records" in r3.stdout and last_id in r3.stdout, r3.stdout[-1000:]
    assert Bundle.open(out).phase_done("gemm")
    # the fit gives a sane profile against the CPU-host peaks (or the GPU's when run on one)
    gpu = "CPU-host" if b.manifest["device"]["type"] == "cpu" else "H100-SXM-80GB"
    prof, fit = kbf.fit_to_profile(out, gpu, created="2026-01-01")
    for c in (
        prof.compute_efficiency,
        prof.memory_efficiency,
        prof.attention_prefill_efficiency,
        prof.attention_decode_efficiency,
    ):
        assert c is not None and 0 < c.max_eff <= 1 and c.half >= 0
    assert prof.gpu == gpu and "kernels.py" in prof.source
    # and the CLI writes it
    rc = kbf.main([str(out), "--gpu", gpu, "--out", str(tmp_path / "hw")])
    assert rc == 0 and list((tmp_path / "hw" / "profiles").glob("*.yaml"))
