"""Fit a calibration profile to a measurement bundle: ``epdsim calibrate fit BUNDLE [--out HWDB_DIR]``.

What is fitted
    The step-time parameters of :class:`simulator.stepmodel.StepModel` that a serving engine's own
    measurements can determine:

    ============================  ==========================================================
    ``compute_max_eff``           compute efficiency curve, ``eff(tokens) = max_eff * tokens / (tokens + half)``
    ``compute_half``              its half-saturation point (tokens); also the attention curve's
    ``attention_max_eff``         prefill-attention efficiency (the quadratic term of long prompts)
    ``memory_max_eff``            memory efficiency (weights, KV and activations streamed per step);
                                  its ``half`` (the per-kernel floor) stays at the GPU's default
    ``kv_max_eff``                decode attention's KV stream (``attention_decode_efficiency``): seen
                                  when decode sweeps run at several prompt lengths, else the memory curve
    ``step_overhead_s``           per-step host overhead (replaces the engine's launch and CPU defaults)
    ``prefill_overhead_s``        more overhead in a step that carries a prompt chunk than in a
                                  decode-only one (when the data resolve the two; else one overhead)
    ``per_seq_s``                 host time per sequence sampled in a step (engine ``cpu.per_sampled_seq_s``)
    ============================  ==========================================================

    ``per_seq_s`` only exists through the engine's CPU costs: when it is fitted, the host cost
    (``step_overhead_s`` + ``per_seq_s`` x sampled sequences) is written as a calibrated engine
    profile (``engines/<profile>.yaml``, not overlapped with the device time) and the profile's own
    ``step_overhead_s`` is left empty, because that field would zero the engine's CPU costs.

What it is fitted to
    * the **prefill sweep** (phase ``prefill``): lone requests with ``max_tokens=1``; the server's
      own ``time_to_first_token_ms`` (scheduled -> first token, i.e. the prefill steps) when the
      server ran with ``--enable-per-request-metrics``, else the client's TTFT;
    * the **decode sweeps** (phases ``decode_c<N>``): each request's server-side mean inter-token
      time (``mean_itl_ms``, i.e. its TPOT), else the client's ``(e2e - ttft) / (output - 1)``.
      The batch the engine really ran is taken from the phase's ``/metrics`` deltas
      (``(generation tokens - requests) / engine steps``), not from the client's concurrency: on a
      small host the front end cannot always keep N requests in the engine.  A fraction
      ``(batch - 1) / output`` of the decode steps also prefills another user's next prompt.

    The fit uses one point per prompt length and one per decode phase: the median of its requests
    (robust to the transient slowdowns of a shared host; every length and batch weighs the same).

    ``prefill_overhead_s`` is nested (:func:`calibration.fit.solver.fit_points`): one overhead for every
    step first, then the prompt steps' own, kept only when the data resolve it.

    The **front end** (the API server: a delay on the way in, the API server's event loop on the way out;
    :mod:`simulator.engine.frontend`) is fitted apart, from the client's and the server's timestamps
    (:mod:`calibration.fit.frontend`), and written into the calibrated engine.

How
    Every prediction comes from the simulator itself: a candidate :class:`hwdb.profiles.Profile`
    is put on the deployment (model, GPU, engine arguments read from the bundle) and
    :func:`simulator.step_build.build_step_model` builds the StepModel whose ``prefill_time`` and
    ``step_time`` are compared with the measurements.  ``scipy.optimize.least_squares`` (trf,
    bounded, ``soft_l1`` loss with a 25% scale against outliers of a noisy host) works on
    log-parameters and log-residuals ``log(predicted / measured)``, from several starting points.
    A parameter whose Jacobian column is negligible (the data cannot see it, e.g. the memory
    side on a host where compute and overhead always win), that ends at a bound, or that is poorly
    determined (1-sigma > 50%) and not needed (F-test of the fits with and without it, 5% level) is
    fixed and the fit repeated; the report says which and why.  Uncertainty: ``cov = inv(J^T J) * s^2`` with
    ``s^2 = sum(r^2) / (m - k)`` from a central-difference Jacobian of the raw residuals at the
    optimum; since the parameters are logs, ``sigma`` is a relative standard error.

Output
    ``HWDB_DIR/profiles/<gpu>_vllm-<version>_<model>.yaml`` (the profile, with the bundle's
    provenance), ``HWDB_DIR/models/<served name>/`` (the model's config.json and sidecar, so the
    folder is a self-contained ``--hwdb``), ``HWDB_DIR/fits/<profile>.json`` (parameters,
    uncertainty, correlation, every residual, the front end, the engine arguments) and
    ``HWDB_DIR/engines/<profile>.yaml`` (the engine with the fitted host costs and front end; scenarios
    name it as ``engine: {engine: <profile>}``).

Modules
    :mod:`calibration.fit.inputs` (the bundle: consistency checks, logged engine arguments, GPU,
    model), :mod:`calibration.fit.engine_setup` (the engine arguments the server ran with),
    :mod:`calibration.fit.points` (measurement points), :mod:`calibration.fit.predict` (predictions
    through the simulator), :mod:`calibration.fit.params` (the parameters, their bounds, a fit's
    result), :mod:`calibration.fit.solver` (least squares, uncertainty, identifiability),
    :mod:`calibration.fit.report` (profile, engine, fit report); this module puts
    them together (:func:`fit_bundle`) and holds the command (:func:`cmd_fit`).  Import a name from
    the module that defines it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from pathlib import Path

from rich.markup import escape
from rich.table import Table

import hwdb
from calibration.fit.engine_setup import EngineSetup, engine_setup
from calibration.fit.frontend import describe, fit_frontend
from calibration.fit.inputs import CPU_GPU, FitInputError, bundle_model, open_bundle, target_gpu
from calibration.fit.params import PARAMS
from calibration.fit.points import aggregate, measurement_points
from calibration.fit.report import final_profile, fmt_param, mixed_step_note, write_outputs
from calibration.fit.result import BundleFit
from calibration.fit.solver import fit_points
from calibration.harness.env import server_cores, with_server_cores

# ============================================================================ a bundle, end to end


def deployment(db: hwdb.HardwareDB, gpu: str, model: hwdb.ModelEntry, setup: EngineSetup):
    """The simulator's Deployment for a bundle's server (raises FitInputError on a bad setup)."""
    from simulator.scenario import EngineConfig, PoolConfig, ScenarioError, deployment_for  # noqa: PLC0415 - listed in tests/test_import_structure.py

    try:
        pool = PoolConfig(
            gpu=gpu, tp=setup.tp, pp=setup.pp, dtype=setup.dtype, engine=EngineConfig(**setup.engine_config())
        )
        dep = deployment_for(pool, model, db)
    except (ScenarioError, ValueError) as exc:
        raise FitInputError(f"the bundle's server configuration cannot be simulated: {exc}") from None
    return dataclasses.replace(dep, profile=None)


def fit_bundle(
    path: str | Path,
    *,
    gpu: str | None = None,
    model: str | None = None,
    hwdb_dirs: tuple[str, ...] = (),
    overrides: dict | None = None,
    free: tuple[str, ...] | None = None,
) -> BundleFit:
    """Fit a profile to a bundle's prefill and decode sweeps (nothing is written)."""
    b = open_bundle(path)
    try:
        db = hwdb.load(hwdb_dirs)
    except hwdb.HwdbError as exc:
        raise FitInputError(str(exc)) from None
    gname = target_gpu(b, gpu, db)
    g = db.gpu(gname)
    host = None
    if gname == CPU_GPU:  # the shipped entry describes one Xeon VM: derive another host's peaks
        from calibration.fit.host import host_check  # noqa: PLC0415 - listed in tests/test_import_structure.py

        # the peak counts the server's cores: under --pin both lists, not the harness's own CPU
        derived, host = host_check(with_server_cores(b.manifest), g, explicit_gpu=gpu is not None)
        host["cores"], host["cores_basis"] = server_cores(b.manifest)
        if derived is not None:
            db = dataclasses.replace(db, gpus={**db.gpus, CPU_GPU: derived})
            g = derived
    entry = bundle_model(b, model, db)
    setup = engine_setup(b, overrides)
    raw, notes = measurement_points(b)
    points = aggregate(raw)
    kinds = {p.kind for p in points}
    missing = [k for k in ("prefill", "decode") if k not in kinds]
    if missing:
        raise FitInputError(
            f"{b.path}: nothing to fit the {' and '.join(missing)} time to: the bundle has no "
            f"completed {' or '.join(missing)} sweep. Measure one with `epdsim calibrate run "
            f"--out {b.path} --resume` (if the plan has it) or into a new bundle with "
            f"`--phases prefill,decode`."
        )
    dep = deployment(db, gname, entry, setup)
    res = fit_points(points, dep, free=free)
    m = b.manifest
    version = (m.get("versions") or {}).get("vllm") or next(
        (ln.get("vllm_version") for ln in m.get("launches") or [] if ln.get("vllm_version")), None
    )
    served = (m.get("model") or {}).get("served_name") or entry.name
    created = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    prov = {
        "bundle": str(b.path.resolve()),
        "bundle_created": m.get("created"),
        "bundle_updated": m.get("updated"),
        "mode": m.get("mode"),
        "vllm": version,
        "model": served,
        "model_config_sha256": (m.get("model") or {}).get("config_sha256"),
        "server_hardware": (m.get("hardware") or {}).get("server"),
        "server_python": (m.get("versions") or {}).get("server_python"),
        "epdsim_measured_at": m.get("epdsim"),
        "seed": m.get("seed"),
        "phases": [p["name"] for p in m["plan"] if p["kind"] in ("prefill", "decode")],
        "fitted_at": created,
    }
    fe = fit_frontend(b)
    prov["host"] = host
    prof = final_profile(res, g, served, version, created, prov, setup, notes, fe)
    if host and host["warnings"]:
        host_notes = "\n".join([prof.notes or "", *("host: " + w for w in host["warnings"])])
        prof = prof.model_copy(update={"notes": host_notes})
    return BundleFit(b, g, entry, setup, points, notes, res, fe, prof, prov, dep, host)


# ============================================================================ CLI
def _short(why: str) -> str:
    """The first clause of a 'why fixed' message, for tables (the fit report has the whole text)."""
    return why.split(" (")[0].split(":")[0].split(";")[0]


def cmd_fit(a, con) -> int:
    overrides = {
        "max_num_seqs": a.max_num_seqs,
        "max_num_batched_tokens": a.max_num_batched_tokens,
        "block_size": a.block_size,
    }
    fit = fit_bundle(a.bundle, gpu=a.gpu, model=a.model, hwdb_dirs=tuple(a.hwdb), overrides=overrides)
    out = Path(a.out) if a.out else fit.bundle.path / "hwdb"
    for w in (fit.host or {}).get("warnings", []):
        con.print(f"[yellow]warning:[/] {escape(w)}")
    paths = write_outputs(fit, out)
    if any(ln.get("startup") for ln in fit.bundle.manifest.get("launches") or []):  # launched: cold start
        from calibration.fit.startup import fit_startup, write_startup  # noqa: PLC0415 - listed in tests/test_import_structure.py

        try:
            paths["coldstart"] = write_startup(fit_startup([fit.bundle.path], user_dirs=tuple(a.hwdb)), out)
        except ValueError as exc:  # StartupFitError, HwdbError, ConfigError: the step-time fit stands
            con.print(f"[yellow]cold start not fitted:[/] {exc}")
    r = fit.result
    t = Table(
        title=f"{fit.profile.name}: fitted to {r.n_points} points (residual s = {math.sqrt(r.s2):.1%} of a step time)"
    )
    for c in ("parameter", "value", "1-sigma", "95% interval", "status"):
        t.add_column(c)
    for n in PARAMS:
        if n in r.params:
            lo, hi = r.interval95(n) if n in r.sigma_rel else (math.nan, math.nan)
            s = r.sigma_rel.get(n)
            t.add_row(
                n,
                fmt_param(n, r.params[n]),
                f"{100 * s:.1f}%" if s is not None else "-",
                f"{fmt_param(n, lo)} .. {fmt_param(n, hi)}" if s is not None else "-",
                ("fitted" + (f" ({_short(r.remarks[n])})" if n in r.remarks else ""))
                if n in r.free
                else _short(r.fixed.get(n, "given")),
            )
        else:
            t.add_row(n, "-", "-", "-", _short(r.fixed.get(n, "not fitted")))
    con.print(t)
    q = Table(title="residuals |predicted/measured - 1|")
    for c in ("points", "n", "median", "p90"):
        q.add_column(c, justify="right")
    for k, v in r.quality.items():
        q.add_row(k, str(v.n_points), f"{v.median_abs_rel_error:.1%}", f"{v.p90_abs_rel_error:.1%}")
    con.print(q)
    for ph, d in fit.notes.get("decode_batch", {}).items():
        con.print(f"{ph}: engine batch {d['engine_batch']:.2f} (client concurrency {d['concurrency']})")
    con.print(escape(describe(fit.frontend)))
    con.print(escape(mixed_step_note(r)))
    con.print("wrote " + ", ".join(str(v) for v in paths.values()))
    con.print(f"scenarios: pools[].gpu: {fit.gpu.name}, pools[].engine.engine: {fit.engine_name}, --hwdb {out}")
    con.print(f"validate: epdsim calibrate validate BUNDLE --profile {out}")
    return 0
