"""Fit GEMM efficiency by rows and weight shape on measured kernel tables; write it into the profiles.

The profiles' ``compute_efficiency`` curves pool every GEMM shape of a table into one
``max_eff * M / (M + half)``.  The tables say more: at the same M, a small weight (a
tensor-parallel rank's slice, one MoE expert) reaches a much lower fraction of the peak
than a large one (fp8 on B200 at M >= 2048: ~0.08 for N*K ~ 2M, ~0.37 at 32M, ~0.50 at
100M+), so one pooled curve is too slow for a TP1 prefill and too fast for a TP8 one.

Model per kernel (seconds)::

    t = fixed_s + max(2 M N K / (peak * eff(M, N*K)), bytes / (BW * mem_eff))
    eff(M, S) = max_eff * M / (M + half_m) * S / (S + half_nk)

with the profile's own memory curve for ``mem_eff`` (weights, activations in and out), fitted
by robust least squares on relative time error.  Every fifth (N, K) pair is held out and
scored separately.  Run::

    python -m calibration.kernels.gemm_shape_fit [--kernels DIR] [--write]

``--write`` replaces the ``gemm_shape_efficiency`` block of each ``hwdb/data/profiles`` file
whose GPU has a table.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

import hwdb
from hwdb.schema import GemmShapeCurve

KERNELS = Path(__file__).resolve().parents[3] / "shared" / "data" / "kernels" / "aiconfigurator_vllm_0.24.0"
PROFILES = Path(__file__).resolve().parents[2] / "hwdb" / "data" / "profiles"
# Table dtype -> (hwdb compute dtype, bytes per stored weight).
# bf16 is left to the profile's pooled curve: its GEMMs barely depend on shape (half_nk ~0.7M
# elements, below any real rank slice) and the pooled curve scores better on Vidur's independent
# H100 Llama-2-70B timings (compute-bound median 14 % vs 15.3 % with this fit).
DTYPES = {"fp8": ("fp8", 1.0), "nvfp4": ("fp4", 0.5625)}
TABLE_GPUS = {"h100_sxm": "H100-SXM-80GB", "h200_sxm": "H200-SXM-141GB", "b200_sxm": "B200-SXM-180GB"}


def _model(p, m, s, flops, nbytes, peak, bw, meff):
    max_eff, half_m, half_nk, fixed_us = p
    eff = max_eff * m / (m + half_m) * s / (s + half_nk)
    t_mem = (nbytes + meff.half) / (bw * meff.max_eff)
    return fixed_us * 1e-6 + np.maximum(flops / (peak * eff), t_mem)


def fit_table(path: Path, gpu, meff, dtype: str) -> tuple[dict, dict]:
    """Fitted parameters and scores for one dtype of one GPU's GEMM table."""
    d = pd.read_parquet(path)
    d = d[(d.gemm_dtype == dtype) & (d.m >= 8) & (d.n * d.k >= 2**20)]
    cdt, wbytes = DTYPES[dtype]
    m, n, k = (d[c].to_numpy(float) for c in ("m", "n", "k"))
    t = d.latency.to_numpy(float) * 1e-3
    s = n * k
    args = (
        m,
        s,
        2 * m * n * k,
        n * k * wbytes + 2 * m * k + 2 * m * n,
        gpu.flops(cdt),
        gpu.memory_bandwidth_Bps.value,
        meff,
    )
    pair = pd.factorize(pd.Series(list(zip(d.n, d.k, strict=True))))[0]
    held = pair % 5 == 4

    def resid(p, sel):
        return (_model(p, *(a[sel] if isinstance(a, np.ndarray) else a for a in args)) - t[sel]) / t[sel]

    r = least_squares(
        lambda p: resid(p, ~held),
        [0.6, 128.0, 4e6, 5.0],
        bounds=([0.05, 0.0, 0.0, 0.0], [1.0, 5000.0, 1e9, 50.0]),
        loss="soft_l1",
        f_scale=0.1,
    )
    err_fit, err_held = np.abs(resid(r.x, ~held)), np.abs(resid(r.x, held))
    params = dict(zip(("max_eff", "half_m", "half_nk", "fixed_us"), (float(v) for v in r.x), strict=True))
    scores = {
        "points": int((~held).sum()),
        "held_out_points": int(held.sum()),
        "median": float(np.median(err_fit)),
        "p90": float(np.quantile(err_fit, 0.9)),
        "held_out_median": float(np.median(err_held)),
        "held_out_p90": float(np.quantile(err_held, 0.9)),
    }
    return params, scores


def curve_of(p: dict, q: dict, table: str) -> GemmShapeCurve:
    """The profile entry for one fitted dtype (coefficients rounded to 4 significant figures)."""
    return GemmShapeCurve(
        max_eff=round(p["max_eff"], 4),
        half_m=round(p["half_m"], 1),
        half_nk=float(f"{p['half_nk']:.4g}"),
        fixed_s=float(f"{p['fixed_us'] * 1e-6:.4g}"),
        empirical=True,
        source=(
            f"fit to {table} ({q['points']} GEMMs, M >= 8, N*K >= 2^20) by calibration/kernels/gemm_shape_fit.py: "
            f"median |rel err| {q['median']:.1%}, p90 {q['p90']:.1%}; held-out (N, K) pairs "
            f"({q['held_out_points']}): median {q['held_out_median']:.1%}, p90 {q['held_out_p90']:.1%}"
        ),
    )


def curves_for(root: Path, system: str, gpu, meff, verbose: bool = False) -> dict[str, GemmShapeCurve]:
    """Fitted shape curves of one table system (``h100_sxm``...), keyed by hwdb compute dtype."""
    path = Path(root) / system / "gemm" / "vllm" / "0.24.0" / "gemm_perf.parquet"
    present = set(pd.read_parquet(path, columns=["gemm_dtype"]).gemm_dtype.unique())
    table = f"{Path(root).name}/{system}/gemm/vllm/0.24.0/gemm_perf.parquet"
    out = {}
    for dtype in (x for x in DTYPES if x in present):
        p, q = fit_table(path, gpu, meff, dtype)
        out[DTYPES[dtype][0]] = curve_of(p, q, table)
        if verbose:
            print(
                f"{gpu.name} {dtype}: max_eff {p['max_eff']:.3f} half_m {p['half_m']:.0f} half_nk "
                f"{p['half_nk']:.3g} fixed {p['fixed_us']:.1f} us; median {q['median']:.1%} p90 {q['p90']:.1%}; "
                f"held-out median {q['held_out_median']:.1%} p90 {q['held_out_p90']:.1%}"
            )
    return out


def block(curves: dict[str, GemmShapeCurve]) -> str:
    """The profile YAML block for the fitted curves."""
    out = {k: c.model_dump(mode="json") for k, c in curves.items()}
    return yaml.safe_dump({"gemm_shape_efficiency": out}, sort_keys=True, width=200)


def write_block(profile: Path, text: str) -> None:
    """Replace (or append) the top-level ``gemm_shape_efficiency`` block, leaving the rest as written."""
    src = profile.read_text()
    src = re.sub(r"^gemm_shape_efficiency:\n(?:[ ].*\n)*", "", src, flags=re.M)
    profile.write_text(src.rstrip("\n") + "\n" + text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", type=Path, default=KERNELS)
    ap.add_argument("--write", action="store_true", help="write the fitted blocks into hwdb/data/profiles")
    args = ap.parse_args(argv)
    db = hwdb.load()
    for tname, gname in TABLE_GPUS.items():
        if not (args.kernels / tname / "gemm").is_dir():
            print(f"{tname}: no GEMM table under {args.kernels}")
            continue
        gpu, prof = db.gpu(gname), db.profile_for(gname)
        meff = prof.memory_efficiency if prof is not None and prof.memory_efficiency else gpu.memory_efficiency
        curves = curves_for(args.kernels, tname, gpu, meff, verbose=True)
        prof_path = PROFILES / f"{gname}_vllm-0.24.0.yaml"
        if args.write and prof_path.is_file():
            write_block(prof_path, block(curves))
            print(f"  wrote {prof_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
