"""Fit efficiency curves to a kernel-microbenchmark bundle (``calibration/harness/kernels.py``).

The forms are those of ``calibration/kernels/tables.py`` / ``simulator/perf.py``::

    linear layer   t = max(2mnk / (P * ce(m)),  B / (BW * me(B))),  B = (mk + mn)*a + kn*w
    prefill attn   t = 4 * b * (s^2/2) * H * d / (P * pe(b*s))
    decode attn    t = B_kv / (BW * de(B_kv))      (B_kv = bytes the kernel read)

with ``a = w`` = bytes of the measured dtype (bf16: 2; fp32 where the device lacked bf16), P the
device's peak for that dtype and BW its memory bandwidth from the hwdb entry named by ``--gpu``
(``CPU-host`` for a CPU).  Fitted with ``calibration.kernels.fit.fit_curves`` (bounded least squares on
log-latency residuals).  ``python -m calibration.kernels.bench_fit BUNDLE --gpu NAME --out HWDB_DIR``
writes ``HWDB_DIR/profiles/<name>.yaml``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import numpy as np
import pandas as pd
import yaml

import hwdb
from calibration.harness.bundle import Bundle, BundleError
from calibration.kernels.fit import fit_curves, fit_quality, round_sig
from calibration.kernels.profile import fmt_pct
from calibration.kernels.tables import Curve, decode_attention_time, efficiency_at, prefill_attention_time
from hwdb.profiles import Profile
from hwdb.schema import EfficiencyCurve
from simulator.console import print_notes

ELEM_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0}


def bench_gemm_time(m, n, k, elem_bytes: float, peak_flops: float, mem_bw: float, compute: Curve, memory: Curve):
    """``calibration.kernels.tables.gemm_time`` with activations and weights both ``elem_bytes`` wide."""
    m, n, k = (np.asarray(v, dtype=float) for v in (m, n, k))
    t_c = 2.0 * m * n * k / (peak_flops * efficiency_at(m, compute))
    b = (m * k + m * n) * elem_bytes + k * n * elem_bytes
    return np.maximum(t_c, b / (mem_bw * efficiency_at(b, memory)))


def load_bundle(path: str | Path) -> tuple[Bundle, dict[str, pd.DataFrame]]:
    b = Bundle.open(path)
    if b.manifest.get("mode") != "kernels":
        raise BundleError(
            f"{path} is not a kernel-benchmark bundle (mode {b.manifest.get('mode')!r}); "
            f"write one with `python -m calibration.harness.kernels`"
        )
    frames = {ph: pd.DataFrame(b.requests(ph)) for ph in ("gemm", "attn_prefill", "attn_decode", "membw", "allreduce")}
    return b, frames


class Peaks(TypedDict):
    """What a fit takes from the GPU's hwdb entry."""

    gpu: str  # the entry's name
    flops: float  # peak FLOP/s at the measured dtype
    mem_bw: float  # memory bandwidth, B/s


def peaks_for(gpu_name: str, dtype: str, hwdb_dirs: Sequence[str] = ()) -> Peaks:
    g = hwdb.load(hwdb_dirs).gpu(gpu_name)
    if dtype not in g.peak_flops:
        raise BundleError(f"{g.name} has no {dtype} peak in its hwdb entry (has {sorted(g.peak_flops)})")
    return {"gpu": g.name, "flops": g.peak_flops[dtype].value, "mem_bw": g.memory_bandwidth_Bps.value}


STATS = ("median", "min")


def _use_stat(frames: dict[str, pd.DataFrame], stat: str) -> dict[str, pd.DataFrame]:
    """``seconds`` is the median of the repeats; ``min`` uses the fastest repeat (a shared, busy CPU)."""
    if stat == "median":
        return frames
    if stat != "min":
        raise ValueError(f"stat must be one of {STATS}")
    return {k: (f.assign(seconds=f["seconds_min"]) if len(f) and "seconds_min" in f else f) for k, f in frames.items()}


def fit_bundle(frames: dict[str, pd.DataFrame], dtype: str, peaks: Peaks, stat: str = "median") -> dict:
    """Fitted curves and their quality: keys compute, memory, prefill, decode (missing if no data)."""
    frames = _use_stat(frames, stat)
    P, BW, eb = peaks["flops"], peaks["mem_bw"], ELEM_BYTES[dtype]
    out: dict = {"quality": {}, "residuals": {}}
    g = frames.get("gemm")
    if g is not None and len(g):
        m, n, k, y = (g[c].to_numpy(dtype=float) for c in ("m", "n", "k", "seconds"))
        comp, mem = fit_curves(lambda c: bench_gemm_time(m, n, k, eb, P, BW, c[0], c[1]), y, scales=(64.0, 1e6))
        comp, mem = (round_sig(comp[0]), round_sig(comp[1])), (round_sig(mem[0]), round_sig(mem[1]))
        pred = bench_gemm_time(m, n, k, eb, P, BW, comp, mem)
        cb = 2.0 * m * n * k / (P * efficiency_at(m, comp)) >= pred
        out.update(compute=comp, memory=mem)
        out["quality"]["gemm"] = fit_quality(pred, y)
        for key, part in (("compute_efficiency", cb), ("memory_efficiency", ~cb)):
            # a curve whose bound never wins on the grid is still written, scored on all GEMM rows
            out["quality"][key] = fit_quality(pred[part], y[part]) if part.sum() >= 2 else out["quality"]["gemm"]
        out["residuals"]["gemm"] = {
            f"{lay}:m={int(mm)}": round(float(p / t - 1), 4)
            for lay, mm, p, t in zip(g["layer"], m, pred, y, strict=True)
        }  # one per row
    p = frames.get("attn_prefill")
    if p is not None and len(p):
        b_, s, h, d, y = (p[c].to_numpy(dtype=float) for c in ("batch_size", "isl", "num_heads", "head_dim", "seconds"))
        (pc,) = fit_curves(lambda c: prefill_attention_time(b_, s, h, d, P, c[0]), y, scales=(512.0,))
        pc = (round_sig(pc[0]), round_sig(pc[1]))
        pred = prefill_attention_time(b_, s, h, d, P, pc)
        out["prefill"] = pc
        out["quality"]["attention_prefill_efficiency"] = fit_quality(pred, y)
        out["residuals"]["attn_prefill"] = {
            f"s={int(si)}": round(float(pp / t - 1), 4) for si, pp, t in zip(s, pred, y, strict=True)
        }
    dd = frames.get("attn_decode")
    if dd is not None and len(dd):
        b_, c_, h, d, w, y = (
            dd[c].to_numpy(dtype=float)
            for c in ("batch_size", "ctx", "num_kv_heads_read", "head_dim", "kv_bytes_per_elem", "seconds")
        )
        (dc,) = fit_curves(lambda c: decode_attention_time(b_, c_, h, d, w, BW, c[0]), y, scales=(1e6,))
        dc = (round_sig(dc[0]), round_sig(dc[1]))
        pred = decode_attention_time(b_, c_, h, d, w, BW, dc)
        out["decode"] = dc
        out["quality"]["attention_decode_efficiency"] = fit_quality(pred, y)
        out["residuals"]["attn_decode"] = {
            f"b={int(bb)}:ctx={int(cc)}": round(float(pp / t - 1), 4)
            for bb, cc, pp, t in zip(b_, c_, pred, y, strict=True)
        }
    mb = frames.get("membw")
    if mb is not None and len(mb):
        out["copy_Bps_max"] = float((mb["bytes"] / mb["seconds"]).max())
        big = mb.loc[mb["size_bytes"].idxmax()]
        out["copy_Bps_largest"] = float(big["bytes"] / big["seconds"])
    ar = frames.get("allreduce")
    if ar is not None and len(ar):
        out["allreduce_busbw_Bps_max"] = float(ar["busbw_Bps"].max())
    return out


def to_profile(
    b: Bundle,
    fit: dict,
    peaks: Peaks,
    dtype: str,
    engine: str,
    engine_version: str | None,
    created: str | None = None,
    stat: str = "median",
) -> Profile:
    mf = b.manifest
    dev = mf.get("device", {})
    tv = mf.get("versions", {}).get("torch", "?")
    ev = engine_version or f"kernels-torch-{tv}"
    src_tail = (
        f"kernel microbenchmarks (calibration/harness/kernels.py) on {dev.get('type')} '{dev.get('name')}', "
        f"torch {tv}, dtype {dtype}, model {mf['model'].get('served_name')} tp "
        f"{mf.get('kernels', {}).get('tp')}; bundle {b.path}, created {mf.get('created')}; "
        f"time per shape = {stat} of the repeats"
    )
    q = fit["quality"]

    def curve(key: str, c: Curve | None, what: str) -> EfficiencyCurve | None:
        if c is None or key not in q:
            return None
        fq = q[key]
        return EfficiencyCurve(
            max_eff=c[0],
            half=c[1],
            empirical=True,
            source=(
                f"fit to {what}; {fq.n_points} points, median |rel err| "
                f"{fmt_pct(fq.median_abs_rel_error)}, p90 {fmt_pct(fq.p90_abs_rel_error)} "
                f"(calibration/kernels/bench_fit.py)"
            ),
        )

    notes = [
        f"Peaks used ({peaks['gpu']} hwdb entry): {dtype} {peaks['flops']:.4g} FLOP/s, memory "
        f"{peaks['mem_bw']:.4g} B/s; efficiencies are fractions of these."
    ]
    if "copy_Bps_largest" in fit:
        notes.append(
            f"Measured copy bandwidth (2 x size / time): largest tensor {fit['copy_Bps_largest'] / 1e9:.3g} "
            f"GB/s, best {fit['copy_Bps_max'] / 1e9:.3g} GB/s (small sizes may sit in cache)."
        )
    if "allreduce_busbw_Bps_max" in fit:
        notes.append(f"All-reduce bus bandwidth (best size): {fit['allreduce_busbw_Bps_max'] / 1e9:.3g} GB/s.")
    if dev.get("type") == "cpu":
        notes.append(
            "CPU: small GEMM weights and KV tensors stay in cache across repeats, so the memory curves "
            "can exceed DRAM bandwidth at small sizes (max_eff is bounded at 1)."
        )
    for ph, res in fit["residuals"].items():
        worst = sorted(res.items(), key=lambda kv: -abs(kv[1]))[:3]
        notes.append(f"{ph} largest residuals (pred/meas - 1): " + ", ".join(f"{k} {v:+.1%}" for k, v in worst))
    if mf.get("kernels", {}).get("dtype_note"):
        notes.append(mf["kernels"]["dtype_note"])
    quality = dict(q)
    return Profile(
        name=f"{peaks['gpu']}_{engine}-{ev}",
        gpu=peaks["gpu"],
        engine=engine,
        engine_version=ev,
        created=created or _dt.date.today().isoformat(),
        source=src_tail,
        method=(
            "scipy.optimize.least_squares (bounded 0<max_eff<=1, half>=0, soft_l1 f_scale=0.1) on log-latency "
            "residuals via calibration.kernels.fit.fit_curves: linear t=max(2mnk/(P*ce(m)), B/(BW*me(B))), "
            "B=(mk+mn+kn)*dtype bytes, compute and memory fitted jointly over all layers and m; prefill "
            "attention t=4b(s^2/2)Hd/(P*pe(b*s)) (SDPA causal); decode attention t=B_kv/(BW*de(B_kv)) with "
            "B_kv the bytes SDPA read (KV heads expanded to the query heads). No shapes held out."
        ),
        compute_efficiency=curve(
            "compute_efficiency", fit.get("compute"), "GEMM rows where the compute bound wins, x = tokens (m)"
        ),
        memory_efficiency=curve(
            "memory_efficiency", fit.get("memory"), "GEMM rows where the memory bound wins, x = bytes moved"
        ),
        attention_prefill_efficiency=curve(
            "attention_prefill_efficiency", fit.get("prefill"), "SDPA prefill, x = batch*seq tokens"
        ),
        attention_decode_efficiency=curve(
            "attention_decode_efficiency", fit.get("decode"), "SDPA decode, x = KV bytes read"
        ),
        quality=quality,
        notes="\n".join(notes),
    )


def write_profile(profile: Profile, path: Path | str) -> Path:
    """Profile YAML with a provenance header (as ``calibration.kernels.fit.write_profile``, naming this module)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = (
        f"# Calibration profile for {profile.gpu} from kernel microbenchmarks.\n"
        f"# Generated by `python -m calibration.kernels.bench_fit`; re-run it rather than editing by hand.\n"
    )
    path.write_text(
        header
        + yaml.safe_dump(
            profile.model_dump(mode="json"), sort_keys=True, default_flow_style=False, allow_unicode=True, width=100
        )
    )
    return path


def fit_to_profile(
    bundle: str | Path,
    gpu: str,
    engine: str = "vllm",
    engine_version: str | None = None,
    hwdb_dirs: Sequence[str] = (),
    created: str | None = None,
    stat: str = "median",
) -> tuple[Profile, dict]:
    b, frames = load_bundle(bundle)
    dtype = b.manifest.get("kernels", {}).get("dtype", "bf16")
    peaks = peaks_for(gpu, dtype, hwdb_dirs)
    fit = fit_bundle(frames, dtype, peaks, stat)
    return to_profile(b, fit, peaks, dtype, engine, engine_version, created, stat), fit


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.kernels.bench_fit", description=__doc__.split("\n")[0])
    ap.add_argument("bundle", type=Path, help="folder written by python -m calibration.harness.kernels")
    ap.add_argument("--gpu", required=True, help="hwdb GPU whose peaks the efficiencies refer to (CPU-host on a CPU)")
    ap.add_argument("--out", required=True, type=Path, help="hwdb folder; the profile goes to OUT/profiles/")
    ap.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder(s) to find --gpu in")
    ap.add_argument("--engine", default="vllm", help="engine the profile applies to (default vllm)")
    ap.add_argument("--engine-version", default=None, help="default kernels-torch-<torch version>")
    ap.add_argument("--created", default=None)
    ap.add_argument(
        "--stat",
        choices=STATS,
        default="median",
        help="time per shape: median of the repeats (default) or the fastest (busy shared CPU)",
    )
    args = ap.parse_args(argv)
    try:
        print_notes(hwdb.load(args.hwdb).notes)  # a user folder that replaces shipped hardware changes the fit
        prof, fit = fit_to_profile(
            args.bundle, args.gpu, args.engine, args.engine_version, args.hwdb, args.created, args.stat
        )
    except (BundleError, hwdb.HwdbError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = write_profile(prof, args.out / "profiles" / f"{prof.name}.yaml")
    for key, c in (
        ("compute", prof.compute_efficiency),
        ("memory", prof.memory_efficiency),
        ("attention prefill", prof.attention_prefill_efficiency),
        ("attention decode", prof.attention_decode_efficiency),
    ):
        if c is not None:
            print(f"  {key:<18} max_eff={c.max_eff:<8.4g} half={c.half:<10.4g} {c.source.split(';', 1)[1].strip()}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
