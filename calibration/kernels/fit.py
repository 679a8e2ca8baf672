"""Fit the step-time model's efficiency curves to measured vLLM kernel latencies.

Data: aiconfigurator-core 0.12.0 (github ai-dynamo/aiconfigurator, Apache-2.0)
kernel tables collected under vLLM 0.24.0 on H100 SXM, H200 SXM and B200 SXM,
kept in ``../shared/data/kernels/aiconfigurator_vllm_0.24.0``.  Latencies in
the tables are milliseconds; everything here is SI (seconds, bytes, FLOP/s).

Loading, selection and the kernel-time forms live in ``calibration/kernels/tables.py``.
The forms are exactly those of ``simulator/perf.py`` (see ``docs/kernel_fit.md``)::

    eff(x)         = max_eff * x / (x + half)                 (hwdb EfficiencyCurve)
    linear layer   t = max(2mnk / (P[dtype] * ce(m)),  B_lin / (BW * me(B_lin)))
                   B_lin = (m*k + m*n)*2 + k*n*w,  w = 2 (bf16) or 1 (fp8 weights)
    prefill attn   t = 4 * b * (s^2/2) * H * d / (P_bf16 * pe(b*s))
    decode attn    t = B_kv / (BW * de(B_kv)),  B_kv = b * ctx * 2 * H_kv * d * kv_bytes

Each curve is fitted with ``scipy.optimize.least_squares`` (bounded: 0 < max_eff
<= 1, half >= 0) on log-latency residuals.  Shapes of real model layers are held
out of the fit and scored separately.  ``python -m calibration.kernels.fit
--data DIR --out hwdb/data/profiles`` writes one Profile YAML per GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

import hwdb
from calibration.kernels.comm_fit import curve_for as allreduce_curve
from calibration.kernels.gemm_shape_fit import curves_for
from calibration.kernels.profile import SIG as _SIG
from calibration.kernels.profile import FitResult, fit_summary, profile_filename, result_to_profile, write_profile
from calibration.kernels.tables import (
    DATASET,
    HOLDOUTS,
    SYSTEMS,
    WEIGHT_BYTES,
    Curve,
    attn_common,
    decode_attention_time,
    efficiency_at,
    gemm_time,
    holdout_mask_attn,
    holdout_mask_gemm,
    load_peaks,
    load_tables,
    prefill_attention_flops,
    prefill_attention_time,
    select_decode,
    select_gemm,
    select_prefill,
)
from hwdb.profiles import FitQuality, Profile

_LOSS = "soft_l1"  # robust to the odd slow kernel choice in the tables
_F_SCALE = 0.1  # residuals (log units) beyond ~10 % are down-weighted


# --------------------------------------------------------------------------- fitting


def fit_curves(
    predict: Callable[[list[Curve]], np.ndarray],
    y_s: np.ndarray,
    scales: Sequence[float],
    x0: Sequence[tuple[float, float]] | None = None,
) -> list[Curve]:
    """Least-squares fit of ``len(scales)`` curves on log-latency residuals.

    ``predict`` maps a list of (max_eff, half) to predicted seconds; ``scales``
    gives the natural size of each curve's ``half`` (for conditioning).
    """
    ncur = len(scales)
    sc = np.repeat(np.asarray(scales, dtype=float), 2)
    sc[0::2] = 1.0
    start = np.array([v for c in (x0 or [(0.6, s) for s in scales]) for v in c], dtype=float) / sc
    ly = np.log(y_s)

    def unpack(z):
        p = z * sc
        return [(p[2 * i], p[2 * i + 1]) for i in range(ncur)]

    def resid(z):
        return np.log(predict(unpack(z))) - ly

    lo = np.tile([1e-4, 0.0], ncur)
    hi = np.tile([1.0, np.inf], ncur)
    start = np.clip(start, lo + 1e-9, np.minimum(hi, 1e12))
    res = least_squares(
        resid,
        start,
        bounds=(lo, hi),
        loss=_LOSS,
        f_scale=_F_SCALE,
        x_scale="jac",
        xtol=1e-12,
        ftol=1e-12,
        gtol=1e-12,
        max_nfev=2000,
    )
    return unpack(res.x)


def _rel_err(pred, y):
    return np.abs(np.asarray(pred) / np.asarray(y) - 1.0)


def fit_quality(pred_tr, y_tr, pred_ho=None, y_ho=None) -> FitQuality:
    e = _rel_err(pred_tr, y_tr)
    ho = None
    if pred_ho is not None and len(y_ho):
        ho = round(float(np.median(_rel_err(pred_ho, y_ho))), 4)
    return FitQuality(
        n_points=int(len(e)),
        median_abs_rel_error=round(float(np.median(e)), 4),
        p90_abs_rel_error=round(float(np.quantile(e, 0.9)), 4),
        held_out_median_abs_rel_error=ho,
    )


def _p90(pred, y) -> float:
    return float(np.quantile(_rel_err(pred, y), 0.9)) if len(y) else float("nan")


def round_sig(x: float, n: int = _SIG) -> float:
    return float(f"{x:.{n}g}")


def fit_gemm(df: pd.DataFrame, peaks: dict[str, float]) -> tuple[Curve, Curve, Curve]:
    """Fit (compute_bf16, memory) on bf16 rows, then compute_fp8 on fp8 rows with memory fixed.

    ``df`` needs columns m, n, k, dtype ('bf16'/'fp8') and t (seconds).
    """
    bw = peaks["mem_bw"]
    b = df[df.dtype == "bf16"]
    mb, nb, kb, yb = b.m.to_numpy(), b.n.to_numpy(), b.k.to_numpy(), b.t.to_numpy()
    comp, mem = fit_curves(
        lambda c: gemm_time(mb, nb, kb, WEIGHT_BYTES["bf16"], peaks["bf16"], bw, c[0], c[1]), yb, scales=(64.0, 1e7)
    )
    f = df[df.dtype == "fp8"]
    comp8 = comp
    if len(f):
        mf, nf, kf, yf = f.m.to_numpy(), f.n.to_numpy(), f.k.to_numpy(), f.t.to_numpy()
        (comp8,) = fit_curves(
            lambda c: gemm_time(mf, nf, kf, WEIGHT_BYTES["fp8"], peaks["fp8"], bw, c[0], mem), yf, scales=(64.0,)
        )
    return comp, comp8, mem


def fit_gemm_fp8_own_memory(df: pd.DataFrame, peaks: dict[str, float]) -> tuple[Curve, Curve]:
    """Diagnostic: fp8 compute and memory curves fitted together (not the perf.py form)."""
    f = df[df.dtype == "fp8"]
    mf, nf, kf, yf = f.m.to_numpy(), f.n.to_numpy(), f.k.to_numpy(), f.t.to_numpy()
    c, m = fit_curves(
        lambda c: gemm_time(mf, nf, kf, WEIGHT_BYTES["fp8"], peaks["fp8"], peaks["mem_bw"], c[0], c[1]),
        yf,
        scales=(64.0, 1e7),
    )
    return c, m


def fit_prefill(df: pd.DataFrame, peak_bf16: float) -> Curve:
    """Fit the prefill-attention curve; ``df`` has batch_size, isl, num_heads, head_dim, t."""
    b, s, h, d = (df[c].to_numpy() for c in ("batch_size", "isl", "num_heads", "head_dim"))
    (c,) = fit_curves(lambda c: prefill_attention_time(b, s, h, d, peak_bf16, c[0]), df.t.to_numpy(), scales=(2048.0,))
    return c


def _prefill_alt_time(b, s, h, d, peak, curve, floor_s):
    """Diagnostic form: efficiency of the per-sequence length plus a constant floor."""
    s = np.asarray(s, dtype=float)
    return prefill_attention_flops(b, s, h, d) / (peak * efficiency_at(s, curve)) + floor_s


def fit_prefill_alt(df: pd.DataFrame, peak_bf16: float) -> tuple[Curve, float]:
    b, s, h, d = (df[c].to_numpy() for c in ("batch_size", "isl", "num_heads", "head_dim"))
    # the floor rides as a second "curve" whose half is the floor in microseconds
    c, fl = fit_curves(
        lambda c: _prefill_alt_time(b, s, h, d, peak_bf16, c[0], c[1][1] * 1e-6), df.t.to_numpy(), scales=(1024.0, 10.0)
    )
    return c, fl[1] * 1e-6


def fit_decode(df: pd.DataFrame, mem_bw: float) -> Curve:
    """Fit the decode-attention curve; ``df`` has batch_size, ctx, num_key_value_heads, head_dim,
    kv_bytes_per_elem and t."""
    b, c_, h, d, w = (
        df[c].to_numpy() for c in ("batch_size", "ctx", "num_key_value_heads", "head_dim", "kv_bytes_per_elem")
    )
    (c,) = fit_curves(lambda c: decode_attention_time(b, c_, h, d, w, mem_bw, c[0]), df.t.to_numpy(), scales=(3e7,))
    return c


def _decode_per_sequence_cost(gen: pd.DataFrame) -> dict[str, float]:
    """Diagnostic: decode time per extra sequence at the shortest KV length (outside the fit range).

    Slope of latency from batch 256 to the largest batch at ctx = 2, per head configuration;
    the KV read there is negligible, so this is a per-sequence kernel cost the form lacks.
    """
    g = attn_common(gen)
    g = g[(g.kv_cache_dtype == "bfloat16") & (g.step + g.isl == 2)]
    if g.batch_size.max() <= 256:
        return {}
    slopes = []
    for _, grp in g.groupby(["num_heads", "num_key_value_heads", "head_dim"]):
        t = grp.set_index("batch_size").latency * 1e-3
        if 256 in t.index and t.index.max() > 256:
            bmax = t.index.max()
            slopes.append((t[bmax] - t[256]) / (bmax - 256))
    if not slopes:
        return {}
    sl = np.asarray(slopes)
    return {
        "decode_per_seq_s_median": round_sig(float(np.median(sl))),
        "decode_per_seq_s_max": round_sig(float(sl.max())),
        "decode_per_seq_s_min": round_sig(float(sl.min())),
    }


def _round_curve(c: Curve) -> Curve:
    return (round_sig(c[0]), round_sig(c[1]))


def fit_tables(
    tables: dict[str, pd.DataFrame], peaks: dict[str, float], holdout: str = "models", system: str = "?"
) -> FitResult:
    """Fit all curves of one system from its raw tables (see :func:`load_tables`)."""
    if holdout not in HOLDOUTS:
        raise ValueError(f"holdout must be one of {HOLDOUTS}, got {holdout!r}")
    bw = peaks["mem_bw"]
    quality: dict[str, FitQuality] = {}
    ho_p90: dict[str, float] = {}
    counts: dict[str, int] = {}
    diag: dict[str, float] = {}

    # ---- GEMM
    g = select_gemm(tables["gemm"])
    gho = holdout_mask_gemm(g, holdout)
    comp, comp8, mem = (_round_curve(c) for c in fit_gemm(g[~gho], peaks))
    for dt, cc in (("bf16", comp), ("fp8", comp8)):
        sel = (g.dtype == dt).to_numpy()
        d = g[sel]
        pred = gemm_time(d.m, d.n, d.k, WEIGHT_BYTES[dt], peaks[dt], bw, cc, mem)
        y, ho = d.t.to_numpy(), gho[sel]
        quality[f"gemm_{dt}"] = fit_quality(pred[~ho], y[~ho], pred[ho], y[ho])
        ho_p90[f"gemm_{dt}"] = _p90(pred[ho], y[ho])
        counts[f"gemm_{dt}_held_out"] = int(ho.sum())
        if dt == "bf16":
            # per-curve split: rows where the compute bound wins vs the memory bound
            t_c = 2.0 * d.m * d.n * d.k / (peaks[dt] * efficiency_at(d.m.to_numpy(dtype=float), comp))
            cb = t_c.to_numpy() >= pred
            for key, part in (("compute_efficiency", cb), ("memory_efficiency", ~cb)):
                quality[key] = fit_quality(pred[~ho & part], y[~ho & part], pred[ho & part], y[ho & part])
                ho_p90[key] = _p90(pred[ho & part], y[ho & part])
    c_own, m_own = fit_gemm_fp8_own_memory(g[~gho], peaks)
    f = g[g.dtype == "fp8"]
    fho = gho[(g.dtype == "fp8").to_numpy()]
    pred_own = gemm_time(f.m, f.n, f.k, 1.0, peaks["fp8"], bw, c_own, m_own)
    diag.update(
        {
            "fp8_own_memory_compute_max_eff": round_sig(c_own[0]),
            "fp8_own_memory_compute_half": round_sig(c_own[1]),
            "fp8_own_memory_memory_max_eff": round_sig(m_own[0]),
            "fp8_own_memory_memory_half": round_sig(m_own[1]),
            "fp8_own_memory_held_out_median": round(float(np.median(_rel_err(pred_own[fho], f.t.to_numpy()[fho]))), 4),
            "gemm_floor_s": round_sig(mem[1] / (bw * mem[0])),
            "gemm_observed_min_s": round_sig(float(g.t.min())),
        }
    )

    # ---- prefill attention
    p = select_prefill(tables["context_attention"])
    pho = holdout_mask_attn(p, holdout)
    pc = _round_curve(fit_prefill(p[~pho], peaks["bf16"]))
    pred = prefill_attention_time(p.batch_size, p.isl, p.num_heads, p.head_dim, peaks["bf16"], pc)
    y = p.t.to_numpy()
    quality["attention_prefill_efficiency"] = fit_quality(pred[~pho], y[~pho], pred[pho], y[pho])
    ho_p90["attention_prefill_efficiency"] = _p90(pred[pho], y[pho])
    counts["attention_prefill_held_out"] = int(pho.sum())
    alt_c, alt_floor = fit_prefill_alt(p[~pho], peaks["bf16"])
    pred_alt = _prefill_alt_time(p.batch_size, p.isl, p.num_heads, p.head_dim, peaks["bf16"], alt_c, alt_floor)
    diag.update(
        {
            "prefill_alt_max_eff": round_sig(alt_c[0]),
            "prefill_alt_half_isl": round_sig(alt_c[1]),
            "prefill_alt_floor_s": round_sig(alt_floor),
            "prefill_alt_median": round(float(np.median(_rel_err(pred_alt[~pho], y[~pho]))), 4),
            "prefill_alt_held_out_median": round(float(np.median(_rel_err(pred_alt[pho], y[pho]))), 4),
        }
    )

    # ---- decode attention
    dd = select_decode(tables["generation_attention"], "bfloat16")
    dho = holdout_mask_attn(dd, holdout)
    dc = _round_curve(fit_decode(dd[~dho], bw))
    for kv, key in (("bfloat16", "attention_decode_efficiency"), ("fp8", "attention_decode_fp8_kv")):
        d = dd if kv == "bfloat16" else select_decode(tables["generation_attention"], "fp8")
        ho = dho if kv == "bfloat16" else holdout_mask_attn(d, holdout)
        if not len(d):
            continue
        pred = decode_attention_time(
            d.batch_size, d.ctx, d.num_key_value_heads, d.head_dim, d.kv_bytes_per_elem, bw, dc
        )
        y = d.t.to_numpy()
        quality[key] = fit_quality(pred[~ho], y[~ho], pred[ho], y[ho])
        ho_p90[key] = _p90(pred[ho], y[ho])
    counts["attention_decode_held_out"] = int(dho.sum())
    diag["decode_floor_s"] = round_sig(dc[1] / (bw * dc[0]))
    diag.update(_decode_per_sequence_cost(tables["generation_attention"]))

    return FitResult(
        system=system,
        peaks=peaks,
        compute_bf16=comp,
        compute_fp8=comp8,
        memory=mem,
        prefill=pc,
        decode=dc,
        quality=quality,
        held_out_p90=ho_p90,
        counts=counts,
        diagnostics=diag,
    )


def fit_system(root: Path | str, system: str, holdout: str = "models", created: str | None = None) -> Profile:
    """Load one system's tables, fit every curve and return the calibration Profile."""
    root = Path(root)
    r = fit_tables(load_tables(root, system), load_peaks(root, system), holdout=holdout, system=system)
    return with_shape_curves(result_to_profile(r, root, holdout=holdout, created=created), root, system)


def with_shape_curves(prof: Profile, root: Path, system: str) -> Profile:
    """The profile with its fp8/fp4 GEMM-by-shape curves (calibration/kernels/gemm_shape_fit.py) fitted on the
    same table, and the system's measured all-reduce (calibration/kernels/comm_fit.py)."""
    gpu = hwdb.load().gpu(prof.gpu)
    return prof.model_copy(
        update={
            "gemm_shape_efficiency": curves_for(root, system, gpu, prof.memory_efficiency),
            "allreduce": allreduce_curve(root, system),
        }
    )


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.kernels.fit", description=__doc__.split("\n")[0])
    ap.add_argument(
        "--data", required=True, type=Path, help=f"folder holding {DATASET} (the system YAMLs and <system>/ tables)"
    )
    ap.add_argument("--out", required=True, type=Path, help="folder to write <GPU>_vllm-0.24.0.yaml into")
    ap.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    ap.add_argument("--holdout", default="models", choices=HOLDOUTS)
    ap.add_argument("--created", default=None, help="ISO date to stamp (default: today)")
    args = ap.parse_args(argv)
    if not args.data.is_dir():
        print(f"error: --data {args.data} is not a folder", file=sys.stderr)
        return 2
    t_all = time.perf_counter()
    for system in args.systems:
        t0 = time.perf_counter()
        r = fit_tables(
            load_tables(args.data, system), load_peaks(args.data, system), holdout=args.holdout, system=system
        )
        prof = with_shape_curves(
            result_to_profile(r, args.data, holdout=args.holdout, created=args.created), args.data, system
        )
        out = write_profile(prof, args.out / profile_filename(prof))
        print(fit_summary(prof, r, time.perf_counter() - t0))
        print(f"  wrote {out}")
    print(f"total fit time {time.perf_counter() - t_all:.1f} s")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
