"""Fit the Gated-DeltaNet kernel curves (:class:`hwdb.gdn.GdnCurve`) to measured linear-attention latencies.

Data: the ``linear_attention/<engine>/<version>/gdn_perf.parquet`` tables of aiconfigurator-core 0.12.0
(github ai-dynamo/aiconfigurator, Apache-2.0), ``../shared/data/kernels/aiconfigurator_0.12.0``: each
kernel of a Qwen3.5 linear-attention layer timed alone (ms) by batch, new tokens per sequence and the
key/value heads on one GPU, for eight Qwen3.5 models (0.8B to 397B-A17B) split over 1-16 GPUs, on
H100/H200/B200/B300/GB200/GB300 under vLLM, SGLang and TensorRT-LLM.

Per (GPU, engine, phase) the two kernels of a phase are summed at each measured point (a layer runs both)
and the phase's coefficients fitted by non-negative least squares on relative residuals (every point
weighs by its own size, so a 2 us decode and a 14 ms prefill count alike).  Models are the unit held out:
each model's points are predicted by a fit to the other seven, and the curve shipped is the fit to all
eight.  Run::

    python -m calibration.kernels.gdn_fit [--kernels DIR] [--write] [--markdown FILE]

``--write`` writes ``hwdb/data/gdn_kernels/<GPU>_<engine>.yaml``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from calibration.kernels import cli as kernel_cli
from calibration.kernels.moe_fit import SYSTEMS, version_key
from hwdb.gdn import GdnCurve, GdnPhase
from hwdb.profiles import FitQuality

OUT = Path(__file__).resolve().parents[2] / "hwdb" / "data" / "gdn_kernels"
ENGINES = ("vllm", "sglang", "trtllm")
# Regressors of each phase (hwdb/gdn.py's form), in the order of GdnPhase's fields they fit.
TERMS = {
    "context": ("fixed_s", "seq_s", "seq_head_s", "tok_head_s", "tok_key_head_s"),
    "generation": ("fixed_s", "seq_head_s", "seq_key_head_s"),
}


def phase_points(df: pd.DataFrame, phase: str) -> pd.DataFrame:
    """One row per measured point of ``phase`` with the latency (s) of both its kernels summed; points
    where either kernel is missing are dropped."""
    rows = df[df.phase == phase]
    keys = ["model_name", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim", "batch_size", "seq_len"]
    per = rows.groupby(keys + ["kernel_source"]).latency.median().unstack("kernel_source").dropna()
    return per.sum(axis=1).mul(1e-3).rename("latency").reset_index()


def design(pts: pd.DataFrame, phase: str) -> np.ndarray:
    """The regressors of ``phase`` at every point (columns in :data:`TERMS` order)."""
    b = pts.batch_size.to_numpy(float)
    s = pts.seq_len.to_numpy(float)
    scale = pts.head_k_dim.to_numpy(float) * pts.head_v_dim.to_numpy(float) / (128 * 128)
    hv = pts.num_v_heads.to_numpy(float) * scale
    hk = pts.num_k_heads.to_numpy(float)
    one = np.ones_like(b)
    if phase == "context":
        return np.column_stack([one, s, b * hv, b * s * hv, b * s * hk])
    return np.column_stack([one, b * hv, b * hk])


def _solve(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    a = x / y[:, None]
    norm = a.max(axis=0)
    norm[norm == 0] = 1.0
    coef, _ = nnls(a / norm, np.ones_like(y))
    return coef / norm


def fit_phase(pts: pd.DataFrame, phase: str) -> tuple[dict, FitQuality, dict]:
    """Coefficients of one phase fitted to all points, their quality, and the held-out diagnostics."""
    x, y = design(pts, phase), pts.latency.to_numpy(float)
    coef = _solve(x, y)
    err = np.abs(x @ coef / y - 1.0)
    held = np.empty_like(y)
    models = pts.model_name.to_numpy()
    for m in np.unique(models):
        sel = models == m
        c = _solve(x[~sel], y[~sel])
        held[sel] = np.abs(x[sel] @ c / y[sel] - 1.0)
    q = FitQuality(
        n_points=len(y),
        median_abs_rel_error=round(float(np.median(err)), 4),
        p90_abs_rel_error=round(float(np.quantile(err, 0.9)), 4),
        held_out_median_abs_rel_error=round(float(np.median(held)), 4),
    )
    values = {n: float(f"{v:.4g}") for n, v in zip(TERMS[phase], coef, strict=True)}  # one per design column
    return values, q, {"held_out_p90": float(np.quantile(held, 0.9)), "models": len(np.unique(models))}


def fit_system(root: Path, system: str, engine: str) -> GdnCurve | None:
    """One engine's curve on one system from its newest table (None: no table there)."""
    tables = sorted(
        ((p.parent.name, p) for p in (Path(root) / system / "linear_attention" / engine).glob("*/gdn_perf.parquet")),
        key=lambda vp: version_key(vp[0]),
        reverse=True,
    )
    if not tables:
        return None
    version, path = tables[0]
    df = pd.read_parquet(path)
    phases, notes = {}, []
    for phase in ("context", "generation"):
        pts = phase_points(df, phase)
        values, q, diag = fit_phase(pts, phase)
        phases[phase] = GdnPhase(**values, quality=q)
        notes.append(
            f"{phase}: {q.n_points} points, median |rel err| {q.median_abs_rel_error:.1%}, p90 "
            f"{q.p90_abs_rel_error:.1%}; each of {diag['models']} models held out in turn: median "
            f"{q.held_out_median_abs_rel_error:.1%}, p90 {diag['held_out_p90']:.1%}"
        )
    gpu = SYSTEMS[system]
    table = f"aiconfigurator_0.12.0/data/{system}/linear_attention/{engine}/{version}/gdn_perf.parquet"
    return GdnCurve(
        name=f"{gpu}_{engine}",
        gpu=gpu,
        engine=engine,
        engine_version=version,
        kernels=", ".join(sorted(df.kernel_source.unique())),
        source=(
            f"{table} (aiconfigurator-core 0.12.0, github ai-dynamo/aiconfigurator, Apache-2.0); "
            f"non-negative least squares on relative residuals by calibration/kernels/gdn_fit.py; " + "; ".join(notes)
        ),
        **phases,
    )


def markdown(db) -> str:
    """The table of every shipped curve's fit and held-out error (docs/validation/gdn_kernels.md)."""
    out = [
        "# Gated-DeltaNet kernel curves: fit and held-out error",
        "",
        "Generated by `python -m calibration.kernels.gdn_fit --markdown docs/validation/gdn_kernels.md` "
        "from the shipped",
        "`hwdb/data/gdn_kernels/*.yaml` (the form: `hwdb/gdn.py`; the method: `calibration/kernels/gdn_fit.py`).",
        "Errors are |predicted / measured - 1| per measured point, both kernels of a phase summed; held out:",
        "each of the eight Qwen3.5 models predicted by a fit to the other seven.",
        "",
        "| GPU | engine | phase | points | median | p90 | held-out median |",
        "|---|---|---|---|---|---|---|",
    ]
    n = ok = 0
    for c in sorted(db.gdn_kernels.values(), key=lambda c: (c.gpu, c.engine)):
        for phase in ("context", "generation"):
            q = getattr(c, phase).quality
            n += 1
            ok += q.held_out_median_abs_rel_error <= 0.15
            out.append(
                f"| {c.gpu} | {c.engine} {c.engine_version} | {phase} | {q.n_points} | "
                f"{q.median_abs_rel_error:.1%} | {q.p90_abs_rel_error:.1%} | "
                f"{q.held_out_median_abs_rel_error:.1%} |"
            )
    return "\n".join(out) + f"\n\n{ok} of {n} phase curves within 15 % median |error| on held-out models.\n"


def summary(c: GdnCurve) -> list[str]:
    """One line per phase: the fit and held-out errors."""
    return [
        f"{c.name:26s} {phase:10s} n={q.n_points:5d} median {q.median_abs_rel_error:6.1%} p90 "
        f"{q.p90_abs_rel_error:6.1%} held-out median {q.held_out_median_abs_rel_error:6.1%}"
        for phase, q in (("context", c.context.quality), ("generation", c.generation.quality))
    ]


def main(argv=None) -> int:
    return kernel_cli.run(
        argv, __doc__.split("\n")[0], "calibration.kernels.gdn_fit", OUT, ENGINES, fit_system, summary, markdown
    )


if __name__ == "__main__":
    raise SystemExit(main())
