"""The solver: bounded least squares on log-parameters through the simulator's step model, with
uncertainty (``cov = inv(J^T J) s^2``) and identifiability (parameters the data cannot see, at a bound, or
poorly determined and not needed are fixed and the fit repeated).  See :mod:`calibration.fit.command`."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import numpy as np

import hwdb
from calibration.fit.inputs import FitInputError
from calibration.fit.params import BOUNDS, OPTIONAL, PARAMS, FitResult
from calibration.fit.points import Point
from calibration.fit.predict import candidate_deployment, predict
from hwdb.profiles import FitQuality
from simulator.step_build import build_step_model

#: a parameter is "not identified" when an e-fold change of it moves the predictions by less
#: than this (RMS of log-residual changes)
SENSITIVITY_FLOOR = 0.01
SOFT_L1_SCALE = 0.25
#: a parameter whose relative standard error exceeds this (95% range wider than a factor 2.7) is fixed at its default
MAX_SIGMA_REL = 0.5


# ============================================================================ the fit
def _initial(gpu: hwdb.GPU, points: list[Point]) -> dict[str, float]:
    dec = [p.measured_s for p in points if p.kind == "decode"]
    pre = [p.measured_s for p in points if p.kind == "prefill"]
    guess = 0.5 * min(dec or pre or [1e-3])
    return {
        "compute_max_eff": gpu.compute_efficiency.max_eff,
        "compute_half": max(gpu.compute_efficiency.half, 1.0),
        "attention_max_eff": gpu.compute_efficiency.max_eff,
        "memory_max_eff": gpu.memory_efficiency.max_eff,
        "kv_max_eff": gpu.memory_efficiency.max_eff,
        "step_overhead_s": guess,
        "prefill_overhead_s": 0.2 * guess,
        "per_seq_s": 0.01 * guess,
    }


def _quality(points: list[Point], pred: np.ndarray) -> dict[str, FitQuality]:
    rel = np.abs(pred / np.array([p.measured_s for p in points]) - 1.0)
    out = {}
    for kind in ("prefill", "decode"):
        mask = np.array([p.kind == kind for p in points])
        if mask.any():
            out[kind] = FitQuality(
                n_points=int(mask.sum()),
                median_abs_rel_error=round(float(np.median(rel[mask])), 4),
                p90_abs_rel_error=round(float(np.percentile(rel[mask], 90)), 4),
            )
    out["all"] = FitQuality(
        n_points=len(points),
        median_abs_rel_error=round(float(np.median(rel)), 4),
        p90_abs_rel_error=round(float(np.percentile(rel, 90)), 4),
    )
    return out


def fit_points(
    points: list[Point],
    dep,
    *,
    free: tuple[str, ...] | None = None,
    init: dict[str, float] | None = None,
    multistart: bool = True,
) -> FitResult:
    """Fit the StepModel parameters of deployment ``dep`` to ``points`` (see the module docstring).

    ``dep`` is a :class:`simulator.perf.Deployment` (its profile is replaced by each candidate).
    ``free``: parameters to fit (default all of :data:`PARAMS`); ``init``: starting values.

    The overhead of steps that carry a prompt chunk (``prefill_overhead_s``) is nested: the fit runs
    with one overhead for every step first, then again from there with the prefill steps' own; the
    second is kept only when that parameter survives its checks (identified, not at a bound, determined
    or needed by the F-test) and the F-test of the two fits says it is needed.  Otherwise the first
    stands and ``fixed["prefill_overhead_s"]`` says why.

    The KV stream's efficiency (``kv_max_eff``) is fitted only when the decode points have two or more
    prompt lengths: at one, its cost grows with the batch exactly as the per-sequence costs do."""
    free_l = [n for n in (free or PARAMS) if n in PARAMS]
    if len({p.prompt for p in points if p.kind == "decode"}) < 2 and "kv_max_eff" in free_l:
        free_l.remove("kv_max_eff")
        res = fit_points(points, dep, free=tuple(free_l), init=init, multistart=multistart)
        res.fixed["kv_max_eff"] = (
            "decode sweeps at one prompt length: the KV stream's cost is not told from the "
            "per-sequence costs (run them at two, e.g. --decode-prompt 64,1024); the memory "
            "curve is kept"
        )
        return res
    if "prefill_overhead_s" not in free_l:
        return _fit(points, dep, free=tuple(free_l), init=init, multistart=multistart)
    one = _fit(
        points, dep, free=tuple(n for n in free_l if n != "prefill_overhead_s"), init=init, multistart=multistart
    )
    one.fixed.pop("prefill_overhead_s", None)
    start = {**(init or {}), **one.params, "prefill_overhead_s": 0.1 * one.params["step_overhead_s"]}
    two = _fit(
        points,
        dep,
        free=tuple(n for n in free_l if n in one.free or n == "prefill_overhead_s"),
        init=start,
        multistart=False,
    )
    if "prefill_overhead_s" not in two.free:
        one.fixed["prefill_overhead_s"] = two.fixed.get("prefill_overhead_s", "not fitted")
        return one
    from scipy.stats import f as f_dist  # noqa: PLC0415 - scipy.stats is slow to import; only this F-test needs it

    dof = max(two.n_points - len(two.free), 1)
    F = (2 * one.cost - 2 * two.cost) / max(2 * two.cost / dof, 1e-300)
    crit = float(f_dist.ppf(0.95, 1, dof))
    if F <= crit:
        one.fixed["prefill_overhead_s"] = (
            f"not needed: with it the fit is no better (F = {F:.1f} < {crit:.1f}), "
            f"{two.params['prefill_overhead_s'] * 1e3:.3g} ms +- "
            f"{two.sigma_rel['prefill_overhead_s']:.0%}"
        )
        return one
    two.fixed.update({n: why for n, why in one.fixed.items() if n not in two.free})
    two.remarks.setdefault("prefill_overhead_s", f"needed: without it the residuals grow (F = {F:.1f} > {crit:.1f})")
    two.starts += one.starts
    return two


def _fit(
    points: list[Point],
    dep,
    *,
    free: tuple[str, ...] | None = None,
    init: dict[str, float] | None = None,
    multistart: bool = True,
) -> FitResult:
    """One fit of the parameters ``free`` (see :func:`fit_points`)."""
    from scipy.optimize import least_squares  # noqa: PLC0415 - scipy loads when a fit runs, not with the module

    if not points:
        raise FitInputError("no measurements to fit")
    gpu = dep.gpu
    chunk = dep.knobs.max_num_batched_tokens if dep.knobs.enable_chunked_prefill else 0
    meas = np.array([p.measured_s for p in points], dtype=float)
    wts = np.array([p.weight for p in points], dtype=float)
    if not np.all(meas > 0):
        raise FitInputError("measurements must be positive times")
    values = _initial(gpu, points)
    values.update(init or {})
    start_values = dict(values)
    free_l = [n for n in (free or PARAMS) if n in PARAMS]
    fixed: dict[str, str] = {}
    for n in PARAMS:
        if n not in free_l:
            fixed[n] = "not fitted (given)"
            if n in OPTIONAL and n not in (init or {}):
                values.pop(n)  # the simulator's default (see OPTIONAL)

    def vals_of(x, names):
        v = dict(values)
        for n, xi in zip(names, x, strict=True):  # x: one log-value per name
            lo, hi = BOUNDS[n]
            v[n] = min(max(math.exp(xi), lo), hi)
        return v

    def predictions(v: dict) -> np.ndarray:
        sm = build_step_model(candidate_deployment(dep, v))
        return np.array([predict(sm, p, chunk) for p in points])

    def resid(x, names):
        return wts * np.log(predictions(vals_of(x, names)) / meas)

    starts_used = 0

    def solve(names: list[str], start: dict[str, float]):
        """Multi-start bounded least squares over ``names``; returns (result, values)."""
        nonlocal starts_used
        start = dict(start)  # it may be ``values`` itself, which is cleared below
        lo = np.log([BOUNDS[n][0] for n in names])
        hi = np.log([BOUNDS[n][1] for n in names])
        x0 = np.clip(np.log([start[n] for n in names]), lo + 1e-9, hi - 1e-9)
        starts = [x0]
        if multistart:
            for dce, dov, dps in (
                (-2.3, 0.0, 0.0),
                (2.3, 0.0, 0.0),
                (0.0, -1.6, 0.0),
                (-2.3, -1.6, 0.0),
                (1.2, -0.7, 0.0),
                (0.0, -0.5, 3.0),
            ):
                xs = x0.copy()
                for i, n in enumerate(names):
                    xs[i] += {
                        "compute_max_eff": dce,
                        "attention_max_eff": dce,
                        "kv_max_eff": dce,
                        "step_overhead_s": dov,
                        "per_seq_s": dps,
                    }.get(n, 0.0)
                starts.append(np.clip(xs, lo + 1e-9, hi - 1e-9))
        saved = dict(values)
        values.clear()
        values.update(start)
        try:
            best = None
            for xs in starts:
                r = least_squares(
                    resid,
                    xs,
                    args=(names,),
                    bounds=(lo, hi),
                    method="trf",
                    loss="soft_l1",
                    f_scale=SOFT_L1_SCALE,
                    x_scale=1.0,
                    max_nfev=400 * len(names),
                )
                starts_used += 1
                if best is None or r.cost < best.cost - 1e-12:
                    best = r
        finally:
            values.clear()
            values.update(saved)
        assert best is not None  # starts holds x0 at least
        out = dict(start)
        for n, xi in zip(names, best.x, strict=True):
            out[n] = float(min(max(math.exp(xi), BOUNDS[n][0]), BOUNDS[n][1]))
        return best, out, lo, hi

    remarks: dict[str, str] = {}
    keep: set[str] = set()
    m = len(points)
    names = [n for n in free_l if n not in fixed]
    best, sol, lo, hi = solve(names, values) if names else (None, values, None, None)
    while names:
        assert best is not None and lo is not None and hi is not None  # names left: solve() ran on them
        values.clear()
        values.update(sol)
        # Identifiability, from the raw-residual Jacobian (central differences) at the optimum.
        J = _jacobian(partial(resid, names=names), best.x)
        sens = np.abs(J).max(axis=0)  # largest change of any log-prediction per e-fold change
        rr = resid(best.x, names)
        cov = np.linalg.pinv(J.T @ J) * float((rr**2).sum() / max(m - len(names), 1))
        sd = np.sqrt(np.clip(np.diag(cov), 0, None))
        problems = []
        for i, n in enumerate(names):
            if sens[i] < SENSITIVITY_FLOOR:
                problems.append(
                    (
                        0,
                        sens[i],
                        n,
                        f"not identified by these measurements (an e-fold change moves "
                        f"no prediction by more than {sens[i]:.1%})",
                        True,
                    )
                )
            elif best.x[i] <= lo[i] + 1e-6 and n in OPTIONAL:
                problems.append((1, 0.0, n, f"ended at its lower bound {values[n]:.3g}", True))
            elif best.x[i] <= lo[i] + 1e-6 or best.x[i] >= hi[i] - 1e-6:
                problems.append((1, 0.0, n, f"ended at its bound {values[n]:.3g}: fixed there", False))
            elif sd[i] > MAX_SIGMA_REL and n not in keep:
                problems.append(
                    (
                        2,
                        -sd[i],
                        n,
                        f"poorly determined (1-sigma {sd[i]:.0%}, collinear with the "
                        f"other parameters on these measurements)",
                        True,
                    )
                )
        if not problems:
            break
        kind, _, worst, why, to_default = min(problems)  # the least visible first, then refit the rest
        trial = dict(values)
        if to_default:
            if worst in OPTIONAL:
                trial.pop(worst, None)  # the simulator's default (see OPTIONAL)
            else:
                trial[worst] = start_values[worst]
        rest = [n for n in names if n != worst]
        best2, sol2, lo2, hi2 = solve(rest, trial) if rest else (None, trial, None, None)
        if kind == 2 and best2 is not None:
            # Poorly determined, but does the fit need it?  F-test of the nested fits (5% level).
            from scipy.stats import f as f_dist  # noqa: PLC0415 - slow to import; only this F-test needs it

            dof = max(m - len(names), 1)
            c1, c0 = 2 * best.cost, 2 * best2.cost
            F = (c0 - c1) / max(c1 / dof, 1e-300)
            crit = float(f_dist.ppf(0.95, 1, dof))
            if F > crit:
                keep.add(worst)
                remarks[worst] = (
                    f"poorly determined (1-sigma {sd[names.index(worst)]:.0%}) but needed: without it "
                    f"the residuals grow significantly (F = {F:.1f} > {crit:.1f})"
                )
                continue
            why += f"; without it the fit is as good (F = {F:.1f} < {crit:.1f})"
        fixed[worst] = why + ("; the default is kept" if to_default else "")
        names, best, sol, lo, hi = rest, best2, sol2, lo2, hi2
        if not names:
            values.clear()
            values.update(sol)
    names = [n for n in free_l if n not in fixed]
    vfin = vals_of(np.log([values[n] for n in names]) if names else [], names)
    pred = predictions(vfin)
    r = wts * np.log(pred / meas)
    k = len(names)
    s2 = float((r**2).sum() / max(m - k, 1))
    sig: dict[str, float] = {}
    corr: list[list[float | None]] = []
    if k:
        J = _jacobian(lambda x: resid(x, names), np.log([values[n] for n in names]))
        cov = np.linalg.pinv(J.T @ J) * s2
        sd = np.sqrt(np.clip(np.diag(cov), 0, None))
        sig = {n: float(sd[i]) for i, n in enumerate(names)}
        with np.errstate(invalid="ignore", divide="ignore"):
            c = cov / np.outer(sd, sd)
        corr = [[round(float(x), 3) if np.isfinite(x) else None for x in row] for row in c]
    residuals = [
        {
            "kind": p.kind,
            "phase": p.phase,
            "request": p.request,
            "prompt": p.prompt,
            "output": p.output,
            "batch": round(p.batch, 3),
            "source": p.source,
            "n": p.n,
            "spread": round(p.spread, 4),
            "measured_s": p.measured_s,
            "predicted_s": float(q),
            "rel_error": float(q / p.measured_s - 1.0),
        }
        for p, q in zip(points, pred, strict=True)
    ]  # one prediction per point
    return FitResult(
        params=vfin,
        free=names,
        fixed=dict(fixed),
        sigma_rel=sig,
        correlation=corr,
        residuals=residuals,
        quality=_quality(points, pred),
        cost=float(0.5 * (r**2).sum()),
        s2=s2,
        n_points=m,
        starts=starts_used,
        remarks=remarks,
    )


def _jacobian(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray, h: float = 1e-4) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    f0 = f(x)
    J = np.empty((len(f0), len(x)))
    for i in range(len(x)):
        e = np.zeros_like(x)
        e[i] = h
        J[:, i] = (f(x + e) - f(x - e)) / (2 * h)
    return J
