"""Calibration bundles in the app: overview, fit and validation as tables (no Streamlit).

A bundle is the folder ``epdsim calibrate run`` writes; the fit and the validation are the code
paths of ``epdsim calibrate fit|validate`` (calibration/fit/command.py, calibration/validation/command.py).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

import hwdb
from app.services import bundles
from app.services.scenarios import InputError
from calibration.fit.command import fit_bundle
from calibration.fit.inputs import open_bundle
from calibration.fit.report import write_outputs
from calibration.harness.bundle import BundleError
from calibration.harness.show import bundle_summary
from calibration.validation.command import validate


def _errors():
    return (BundleError, hwdb.HwdbError, ValueError, FileNotFoundError)


BUNDLE_ROOTS_ENV = "EPDSIM_BUNDLE_ROOTS"


SAMPLE_BUNDLE = Path(__file__).resolve().parents[2] / "examples" / "calibration_sample"


def bundle_roots(extra: tuple[Path, ...] = ()) -> list[Path]:
    """Folders the app may read bundles from: those listed in ``EPDSIM_BUNDLE_ROOTS``
    (os.pathsep-separated), the shipped sample and ``extra`` (the session's upload folder); never the
    rest of the server's files.  The folder the app was started in is not one: started from ``/`` or
    ``$HOME``, that would open the whole tree."""
    env = [Path(p) for p in os.environ.get(BUNDLE_ROOTS_ENV, "").split(os.pathsep) if p.strip()]
    return [r.resolve() for r in (*env, SAMPLE_BUNDLE, *extra)]


def _inside_roots(p: Path, extra: tuple[Path, ...] = ()) -> Path:
    """``p`` resolved, once it lies in :func:`bundle_roots`; the refusal names only the user's own
    value (the server's folders are not for the browser to see)."""
    real = p.resolve()
    roots = bundle_roots(extra)
    if not any(real == r or r in real.parents for r in roots):
        raise InputError(
            f"bundle folder '{p}' is outside the folders this app reads bundles from (the bundles "
            f"uploaded in this session, the shipped sample and the folders its operator named in "
            f"{BUNDLE_ROOTS_ENV}); upload the bundle as a .zip, or ask whoever runs the app to start "
            f"it with {BUNDLE_ROOTS_ENV} naming the bundle's parent folder"
        )
    return real


def overview(path: str | Path, extra_roots: tuple[Path, ...] = ()) -> dict:
    """What a bundle holds: model, vLLM version, mode, phases (a DataFrame).  ``extra_roots``: folders
    besides :func:`bundle_roots` it may lie in (the session's uploads)."""
    p = Path(str(path).strip())
    if not str(path).strip():
        raise InputError("bundle folder: empty; give the folder `epdsim calibrate run --out DIR` wrote")
    p = _inside_roots(p, tuple(extra_roots))
    if not p.is_dir():
        raise InputError(
            f"bundle folder '{p}' does not exist on the app's machine; give the folder that "
            f"`epdsim calibrate run --out DIR` wrote (it holds manifest.json)"
        )
    try:
        s = bundle_summary(open_bundle(p))
    except _errors() as exc:
        raise InputError(str(exc)) from None
    phases = pd.DataFrame(
        [
            {
                k: ph.get(k)
                for k in ("phase", "done", "ok", "planned", "failed", "ttft_p50", "itl_p50", "throughput_tok_s")
            }
            for ph in s["phases"]
        ]
    )
    return {"model": s["model"], "vllm": s["vllm"], "mode": s["mode"], "created": s["created"], "phases": phases}


def fit(path: str | Path, hwdb_dirs: tuple[str, ...] = ()) -> dict:
    """Fit a profile to the bundle's prefill and decode sweeps (nothing written).

    Returns {"fit": BundleFit, "params": DataFrame(parameter, value, sigma_rel, status),
    "residuals": DataFrame(kind, phase, measured_s, predicted_s, rel_error), "quality": DataFrame}.
    """
    try:
        # The page admits ``path`` through overview() first (bundle roots checked in the app's process;
        # a job worker started earlier may not see the environment the roots come from).
        f = fit_bundle(Path(str(path).strip()), hwdb_dirs=hwdb_dirs)
    except _errors() as exc:
        raise InputError(str(exc)) from None
    r = f.result
    params = pd.DataFrame(
        [
            {
                "parameter": n,
                "value": v,
                "sigma_rel": r.sigma_rel.get(n, math.nan),
                "status": "fitted" if n in r.free else r.fixed.get(n, "given"),
            }
            for n, v in r.params.items()
        ]
    )
    resid = pd.DataFrame(r.residuals)
    quality = pd.DataFrame(
        [
            {
                "points": k,
                "n": q.n_points,
                "median_abs_rel_error": q.median_abs_rel_error,
                "p90_abs_rel_error": q.p90_abs_rel_error,
            }
            for k, q in r.quality.items()
        ]
    )
    return {"fit": f, "params": params, "residuals": resid, "quality": quality, "profile": f.profile.name}


def fit_and_validate(
    path: str | Path, out: str | Path, hwdb_dirs: tuple[str, ...] = (), tolerance: float = 0.25, progress=None
) -> dict:
    """Fit, write the profile into ``out``/hwdb, and validate it on the bundle's load tests
    (the report files go to ``out``/validation).  Returns the fit dict (without the BundleFit
    object, so that it crosses processes as plain data) plus "validation"."""
    if progress:
        progress(0, 2, "fitting")
    res = fit(path, hwdb_dirs)
    hw = Path(out) / "hwdb"
    try:
        write_outputs(res.pop("fit"), hw)
        if progress:
            progress(1, 2, "validating")
        res["validation"] = validate(
            Path(str(path).strip()), hw, tolerance=tolerance, out=Path(out) / "validation", hwdb_dirs=hwdb_dirs
        )
    except _errors() as exc:
        raise InputError(str(exc)) from None
    res["files"] = bundles.fitted_files(hw)  # to download, or to save into the user's hardware folder
    model = res["validation"].get("model") or res["profile"]
    try:
        res["scenario"] = bundles.replay_scenario(Path(out) / "validation", str(model))
    except (InputError, KeyError, ValueError, OSError) as exc:
        res["scenario"], res["scenario_error"] = None, str(exc)
    return res


def checks_frame(data: dict) -> pd.DataFrame:
    """One row per validation check: phase, metric, stat, source, measured_s, predicted_s, rel_error, verdict."""
    rows = []
    for ph in data["phases"]:
        for r in ph["rows"]:
            verdict = "info" if not r.get("check") else ("pass" if r.get("passed") else "FAIL")
            rows.append(
                {
                    "phase": ph["phase"],
                    "metric": r["metric"],
                    "stat": r["stat"],
                    "source": r["source"],
                    "measured_s": r["measured_s"],
                    "predicted_s": r["predicted_s"],
                    "rel_error": r["rel_error"],
                    "verdict": verdict,
                }
            )
    return pd.DataFrame(rows)


def series_frame(data: dict, metric: str) -> pd.DataFrame:
    """Per request of every load test: measured and predicted ``metric`` (ttft, tpot, e2e) in seconds."""
    rows = []
    for ph in data["phases"]:
        s = ph["series"]
        # strict=False: a file given to the app may hold series of unequal length; pair what there is
        for m, p in zip(s[f"measured_{metric}_s"], s[f"predicted_{metric}_s"], strict=False):
            if m is not None and p is not None and math.isfinite(m) and math.isfinite(p):
                rows.append({"phase": ph["phase"], "measured": m, "predicted": p})
    return pd.DataFrame(rows, columns=["phase", "measured", "predicted"])
