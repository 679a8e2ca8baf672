"""Fit the engines' end-to-end terms on the fitting part of the measured serving runs.

Two terms per engine (``hwdb/data/engines/*.yaml``), both physical and both
invisible to kernel tables:

* ``layer_overhead_s``: GPU time per decoder layer per step beyond the
  roofline (kernel floors, the gaps between a layer's small kernels).  Fitted
  on TPOT: with the term at 0, TPOT_pred = TPOT_sim + L x (steps' share) x;
  the share is 1 for decode steps, so a least-squares fit of relative errors
  on ``TPOT_sim + L * x`` gives x in closed form.
* ``frontend_s`` + ``frontend_s_per_token`` x prompt: the client-visible time
  before the engine sees a request and after the first token leaves it.
  Fitted on TTFT after the layer term is in: TTFT_pred = TTFT_sim + a + b x isl.

Both fits use a robust loss (soft L1 on relative errors) over the rows of
:func:`calibration.e2e.score.split` == 'fit' only; the held-out rows never enter.
Run: ``python -m calibration.e2e.fit [--engine vllm]``; it prints the YAML
lines to put in the engine file and the before/after scores.
"""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

import hwdb
from calibration.e2e import score as e2e
from calibration.e2e.rows import ENGINES, SYSTEMS, load_rows
from calibration.e2e.scenarios import why_not

TERMS = ("layer_overhead_s", "moe_layer_overhead_s", "frontend_s", "frontend_s_per_token")


def _robust(fun, x0, bounds):
    return least_squares(fun, x0, bounds=bounds, loss="soft_l1", f_scale=0.1).x


# A GPU's scale is kept only where its rows determine it: its standard error (from the fit's Jacobian and the
# residuals' variance) at most this share of it, and off the bounds; a GPU whose scale is not kept takes the
# reference GPU's terms, as a GPU without fitting rows does.  The calibration harness fixes a parameter whose
# sigma passes the same 50 % (calibration/fit/solver.py MAX_SIGMA_REL; e2e imports nothing of the harness).
MAX_SCALE_SIGMA = 0.5
SCALE_BOUNDS = (0.2, 5.0)


def gpu_scale(sim: np.ndarray, per_layer: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    """(the per-layer scale that fits ``measured`` TPOT best, its relative standard error; inf at a bound)."""

    def fun(p):
        return (sim + per_layer * p[0] - measured) / measured

    fit = least_squares(fun, [1.0], bounds=([SCALE_BOUNDS[0]], [SCALE_BOUNDS[1]]), loss="soft_l1", f_scale=0.1)
    sc = float(fit.x[0])
    if not SCALE_BOUNDS[0] * 1.001 < sc < SCALE_BOUNDS[1] * 0.999:
        return sc, math.inf
    res = fun(fit.x)
    jtj = float(fit.jac[:, 0] @ fit.jac[:, 0])
    var = float(res @ res) / max(len(res) - 1, 1)
    return sc, math.sqrt(var / jtj) / sc if jtj > 0 else math.inf


def fit_engine(backend: str, rows, workers: int | None = None) -> tuple[dict, pd.DataFrame]:
    """Fitted terms for ``backend`` (table name: vllm, sglang, trtllm) and the final predictions.

    The per-layer terms are fitted on the GPU with the most fitting rows (the reference, scale 1);
    every other GPU with at least 10 fitting rows gets a scale on both terms, fitted on its rows.
    """
    engine = ENGINES[backend]
    db = hwdb.load()
    # Attention data-parallel rows are scored with these terms but do not fit them: their measured figures
    # follow the single-rank TP engine at the same total concurrency (docs/validation/e2e.md), which no
    # per-layer or front-end term should be bent to.
    fit_rows = [r for r in rows if r.backend == backend and e2e.split(r) == "fit" and r.dp == 1 and not why_not(r, db)]
    if len(fit_rows) < 10:
        raise SystemExit(f"{backend}: only {len(fit_rows)} expressible fitting rows; need >= 10")
    archs = [db.model(r.model).arch for r in fit_rows]
    layers = np.array([a.num_layers for a in archs], dtype=float)
    moe = np.array([a.moe_layers for a in archs], dtype=float)
    gpus = np.array([SYSTEMS[r.system] for r in fit_rows])
    zero: dict[str, dict[str, object]] = {engine: dict.fromkeys(TERMS, 0.0) | {"layer_overhead_scale": {}}}
    base = e2e.predict(fit_rows, workers=workers, terms=zero)
    m, sim = base["tpot_s"].to_numpy(), base["tpot_pred_s"].to_numpy()
    # runs whose own figures their settings or the hardware cannot produce never fit a term
    plausible = (base["excluded"].fillna("") == "").to_numpy() if "excluded" in base else np.ones(len(base), bool)
    ok = np.isfinite(sim) & plausible
    counts = pd.Series(gpus[ok]).value_counts()
    ref = counts.index[0]
    on = ok & (gpus == ref)
    if (moe[on] == 0).any() and (moe[on] > 0).any():
        x, y = _robust(
            lambda p: (sim[on] + layers[on] * p[0] + moe[on] * p[1] - m[on]) / m[on],
            [1e-5, 1e-5],
            ([0.0, 0.0], [1e-3, 1e-3]),
        )
    elif (moe[on] > 0).all():  # MoE rows only: every layer's overhead is carried by the MoE term
        x, (y,) = 0.0, _robust(lambda p: (sim[on] + moe[on] * p[0] - m[on]) / m[on], [1e-5], ([0.0], [2e-3]))
    else:
        (x,), y = _robust(lambda p: (sim[on] + layers[on] * p[0] - m[on]) / m[on], [1e-5], ([0.0], [1e-3])), 0.0
    per_layer = layers * x + moe * y
    scales, loose = {}, {}
    for g, n in counts.items():
        sel = ok & (gpus == g)
        if g == ref or n < 10:
            continue
        sc, rel = gpu_scale(sim[sel], per_layer[sel], m[sel])
        if rel <= MAX_SCALE_SIGMA:
            scales[g] = round(sc, 3)
        else:
            loose[g] = f"{g} ({n} rows: {sc:.2f}, " + ("at a bound)" if math.isinf(rel) else f"sigma {rel:.0%})")
    terms = {
        engine: {
            "layer_overhead_s": float(x),
            "moe_layer_overhead_s": float(y),
            "frontend_s": 0.0,
            "frontend_s_per_token": 0.0,
            "layer_overhead_scale": scales,
        }
    }
    mid = e2e.predict(fit_rows, workers=workers, terms=terms)
    m, sim = mid["ttft_s"].to_numpy(), mid["ttft_pred_s"].to_numpy()
    isl = np.array([r.isl for r in fit_rows], dtype=float) * 0.9  # the random dataset's mean prompt
    ok = np.isfinite(sim) & plausible
    a, b = _robust(lambda p: (sim[ok] + p[0] + p[1] * isl[ok] - m[ok]) / m[ok], [0.01, 1e-6], ([0.0, 0.0], [1.0, 1e-4]))
    terms[engine].update(frontend_s=float(a), frontend_s_per_token=float(b))
    final = e2e.predict(fit_rows, workers=workers, terms=terms)
    return (
        {**terms[engine], "reference_gpu": ref, "undetermined_scales": sorted(loose.values())},
        pd.concat([base.assign(stage="before"), final.assign(stage="after")]),
    )


ENGINE_FILES = Path(__file__).resolve().parents[2] / "hwdb" / "data" / "engines"
# GPUs without fitting rows that take another GPU's fitted scale, and why.
SAME_DIE = {
    "H100-SXM-80GB": (
        "H200-SXM-141GB",
        "as H200: the same GH100 die and clocks, only the HBM differs "
        "(NVIDIA H200 datasheet); kernel floors follow the die; no H100 fitting rows",
    )
}
# Engines with no measured rows of their own that carry another engine's terms.
FOLLOWERS = {
    "vllm-v1": (
        "vllm-v0",
        "as vllm-v1 (the same GPU kernels and OpenAI front end; no measured V0 runs "
        "to fit on): see hwdb/data/engines/vllm-v1.yaml",
    )
}


def yaml_lines(terms: dict, source: str) -> dict[str, str]:
    """One flow-style YAML line per fitted term of an engine file, each with its source."""

    def fig(v: float, src: str) -> str:
        v = 0.0 if abs(v) < 1e-12 else v  # a bound the robust fit sits on, not a measurement
        return f'{{value: {v:.4g}, source: "{src}", empirical: true}}'

    out = {k: f"{k}: {fig(terms[k], source)}" for k in TERMS}
    scales = {
        g: fig(v, f"fitted on that GPU's fit rows (calibration/e2e/fit.py); {source}")
        for g, v in sorted(terms["layer_overhead_scale"].items())
    }
    for gpu, (ref, why) in SAME_DIE.items():
        if gpu not in scales and ref in terms["layer_overhead_scale"]:
            scales[gpu] = fig(terms["layer_overhead_scale"][ref], why)
    out["layer_overhead_scale"] = "layer_overhead_scale: {" + ", ".join(f"{g}: {f}" for g, f in scales.items()) + "}"
    return out


def _verbatim(text: str):
    """A ``re.sub`` replacement that puts ``text`` in as it is (no backslash escapes)."""
    return lambda _: text


def write_terms(path: Path, lines: dict[str, str]) -> None:
    """Replace the fitted terms' lines of an engine file, leaving every other line as written."""
    src = path.read_text()
    for key, line in lines.items():
        src, n = re.subn(rf"^{key}: .*$", _verbatim(line), src, flags=re.M)
        if not n:
            src = src.rstrip("\n") + "\n" + line + "\n"
    path.write_text(src)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", action="append", choices=sorted(ENGINES), help="table backend(s) to fit")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--write", action="store_true", help="write the fitted terms into hwdb/data/engines/<engine>.yaml")
    args = ap.parse_args(argv)
    rows = load_rows()
    for backend in args.engine or ["vllm"]:
        terms, df = fit_engine(backend, rows, args.workers)
        n = int((df["stage"] == "after").sum())
        fams = sorted({r.model.split("/")[-1] for r in rows if r.backend == backend and e2e.split(r) == "fit"})
        source = (
            f"end-to-end fit (python -m calibration.e2e.fit --engine {backend}) on {n} distinct rows of the "
            f"'fit' families of ../shared/data/e2e/serving_measurements.csv ({', '.join(fams)}); per-layer "
            f"terms on the {terms['reference_gpu']} rows, other GPUs' scales on their own"
            + (
                "; scales their rows do not determine (sigma over 50 %) left at the reference's: "
                + ", ".join(terms["undetermined_scales"])
                if terms["undetermined_scales"]
                else ""
            )
            + "; docs/validation/e2e.md"
        )
        lines = yaml_lines(terms, source)
        print(f"# {ENGINES[backend]}: fitted on {n} rows of the 'fit' split (calibration/e2e/fit.py)")
        for line in lines.values():
            print(line)
        if args.write:
            path = ENGINE_FILES / f"{ENGINES[backend]}.yaml"
            write_terms(path, lines)
            print(f"  wrote {path}")
            if ENGINES[backend] in FOLLOWERS:
                name, why = FOLLOWERS[ENGINES[backend]]
                write_terms(ENGINE_FILES / f"{name}.yaml", yaml_lines(terms, why))
                print(f"  wrote {ENGINE_FILES / f'{name}.yaml'} ({why})")
        # the rows validate-e2e scores: runs left out (speculative, beyond the hardware, admission anomalies) neither
        # fit a term nor count here
        scored = df[df["excluded"].fillna("") == ""] if "excluded" in df else df
        for stage, g in scored.groupby("stage"):
            print(
                f"  {stage} ({len(g)} scored rows): TTFT MAPE {g['ttft_err'].abs().mean():.1%} bias "
                f"{g['ttft_err'].mean():+.1%}; TPOT MAPE {g['tpot_err'].abs().mean():.1%} "
                f"bias {g['tpot_err'].mean():+.1%}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
