"""What ``calibrate fit`` writes: the calibration profile (with its provenance, uncertainties and
notes), the calibrated engine profile when a per-sequence host cost was fitted, the model folder and
the fit report ``fits/<profile>.json``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import yaml

import hwdb
from calibration.fit.engine_setup import EngineSetup
from calibration.fit.frontend import FrontEndFit, describe
from calibration.fit.inputs import CPU_GPU, FitInputError
from calibration.fit.params import PARAMS, UNITS, FitResult
from calibration.fit.predict import calibrated_engine
from calibration.fit.result import BundleFit
from hwdb.profiles import Profile
from hwdb.schema import EfficiencyCurve


def profile_name(gpu: str, version: str | None, model: str) -> str:
    raw = f"{gpu}_vllm-{version or 'unknown'}_{model}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw)


def fmt_param(n: str, v: float) -> str:
    if n in ("step_overhead_s", "prefill_overhead_s"):
        return f"{v * 1e3:.3g} ms"
    return f"{v:.4g}" + (f" {UNITS[n]}" if UNITS[n] else "")


def final_profile(
    res: FitResult,
    g: hwdb.GPU,
    served: str,
    version,
    created: str,
    prov: dict,
    setup: EngineSetup,
    notes: dict,
    fe: FrontEndFit,
) -> Profile:
    q = res.quality
    bundle = prov["bundle"]

    def unc(n):
        s = res.sigma_rel.get(n)
        return f" +- {100 * s:.1f}% (1 sigma)" if s is not None else f" (fixed: {res.fixed.get(n, 'given')})"

    src_base = (
        f"epdsim calibrate fit of bundle {bundle} (vLLM {version}, model {served}, measured "
        f"{prov.get('bundle_created')}): "
    )
    p = res.params
    ce = EfficiencyCurve(
        max_eff=round(min(p["compute_max_eff"], 1.0), 6),
        half=round(p["compute_half"], 4),
        empirical=True,
        source=src_base + f"compute max_eff{unc('compute_max_eff')}, half{unc('compute_half')}",
    )
    att = (
        EfficiencyCurve(
            max_eff=round(min(p["attention_max_eff"], 1.0), 6),
            half=ce.half,
            empirical=True,
            source=src_base + f"prefill attention max_eff{unc('attention_max_eff')}, half tied to the compute curve",
        )
        if "attention_max_eff" in p
        else None
    )
    me = (
        EfficiencyCurve(
            max_eff=round(min(p["memory_max_eff"], 1.0), 6),
            half=g.memory_efficiency.half,
            empirical=True,
            source=src_base + f"memory max_eff{unc('memory_max_eff')}; half "
            f"(per-kernel floor) kept at {g.name}'s default",
        )
        if "memory_max_eff" in p
        else None
    )
    kv = (
        EfficiencyCurve(
            max_eff=round(min(p["kv_max_eff"], 1.0), 6),
            half=g.memory_efficiency.half,
            empirical=True,
            source=src_base + f"decode attention's KV stream max_eff{unc('kv_max_eff')} "
            f"(decode sweeps at several prompt lengths)",
        )
        if "kv_max_eff" in p
        else None
    )
    lines = [
        f"{n} = {fmt_param(n, p[n])}{unc(n)}" + (f" [{res.remarks[n]}]" if n in res.remarks else "")
        for n in PARAMS
        if n in p
    ]
    lines += [f"{n}: {why}" for n, why in res.fixed.items() if n not in p]
    lines.append(mixed_step_note(res))
    lines.append(
        describe(fe)
        + (
            f"; in the calibrated engine engines/{profile_name(g.name, version, served)}.yaml"
            if fe.frontend_s is not None
            else ""
        )
    )
    for ph, d in notes.get("decode_batch", {}).items():
        lines.append(
            f"{ph}: engine batch {d['engine_batch']:.2f} for client concurrency {d['concurrency']} ({d['how']})"
        )
    lines.append("engine arguments: " + ", ".join(f"{k}={v}" for k, v in setup.engine_config().items()))
    per_seq = "per_seq_s" in p
    if per_seq:
        lines.append(
            f"the host cost (step_overhead_s + per_seq_s x sequences sampled) is in the calibrated engine "
            f"profile engines/{profile_name(g.name, version, served)}.yaml: scenarios use it with "
            f"engine: {{engine: {profile_name(g.name, version, served)}}} (a profile's single "
            f"step_overhead_s would replace the engine's CPU costs)"
        )
    method = (
        "scipy.optimize.least_squares (trf, bounded, soft_l1 loss f_scale=0.25, 7 starts) on log-parameters "
        "and log(predicted/measured) residuals of medians (one point per prompt length of the prefill sweep "
        "and per decode phase); predictions from simulator.step_build.build_step_model with the "
        "candidate profile on the bundle's deployment: prefill sweep = StepModel.prefill_time(prompt, "
        "max_num_batched_tokens) vs the server's time_to_first_token_ms; decode sweeps = StepModel.step_time of "
        "the engine's batch (from /metrics deltas) at the mean context, mixed with a prefill of another "
        "request in (batch-1)/output of the steps, vs the server's mean_itl_ms. Uncertainty from the "
        "central-difference Jacobian: cov = inv(J^T J) s^2. Parameters the data cannot see, that end at a "
        "bound, or that are poorly determined (1-sigma > 50%) and not needed (F-test of the nested fits, 5%) "
        "are fixed."
    )
    # ``model``: a harness fit measured this model end to end; lookup never applies it to another.
    return Profile(
        name=profile_name(g.name, version, served),
        gpu=g.name,
        engine="vllm",
        engine_version=str(version or "unknown"),
        model=served,
        created=created,
        source=f"epdsim calibrate fit {bundle} (bundle created {prov.get('bundle_created')}, "
        f"{prov.get('mode')} mode, vLLM {version}, model {served})",
        method=method,
        compute_efficiency=ce,
        attention_prefill_efficiency=att,
        memory_efficiency=me,
        attention_decode_efficiency=kv,
        step_overhead_s=None if per_seq else round(p["step_overhead_s"], 9),
        prefill_step_overhead_s=(round(p["prefill_overhead_s"], 9) if "prefill_overhead_s" in p else None),
        quality=q,
        notes="\n".join(lines),
    )


def mixed_step_note(res: FitResult) -> str:
    """Whether the fit told steps that carry a prompt chunk from decode-only ones, in words."""
    p = res.params
    if "prefill_overhead_s" in p:
        extra, base = (
            fmt_param("prefill_overhead_s", p["prefill_overhead_s"]),
            fmt_param("step_overhead_s", p["step_overhead_s"]),
        )
        return (
            f"mixed steps: a step that carries a prompt chunk costs {extra} more than a decode-only step "
            f"(step_overhead_s {base}); fitted separately (profile prefill_step_overhead_s)"
        )
    why = res.fixed.get("prefill_overhead_s", "not fitted")
    return (
        f"mixed steps: one overhead for every step (step_overhead_s); the data do not resolve steps that carry a "
        f"prompt chunk from decode-only ones: {why}"
    )


def final_engine(fit: BundleFit):
    """The calibrated engine profile ``engines/<profile>.yaml``, written by every fit.

    With a fitted ``per_seq_s`` it carries the host cost (``step_overhead_s`` + ``per_seq_s`` x sampled
    sequences) and the profile has no ``step_overhead_s``.  Without one it carries the fitted
    ``step_overhead_s`` and no per-sequence term; the profile keeps its own ``step_overhead_s`` too,
    which replaces the engine's host costs wherever the profile applies, so naming this engine changes
    no prediction.  Writing it always gives scenarios (and the documented PD replay) one engine name
    per fit, whatever the data could resolve."""
    p = fit.result.params
    base = fit.deployment.engine
    src = f"epdsim calibrate fit {fit.provenance['bundle']}"
    per_seq = p.get("per_seq_s", 0.0)
    unc = {n: fit.result.sigma_rel.get(n) for n in ("step_overhead_s", "per_seq_s") if n in p}
    why = "" if "per_seq_s" in p else f"; per_sampled_seq_s 0: {fit.result.fixed.get('per_seq_s', 'not fitted')}"
    eng = calibrated_engine(
        base,
        round(p["step_overhead_s"], 9),
        round(per_seq, 9),
        name=fit.profile.name,
        version=str(fit.provenance.get("vllm") or base.version),
        source=src
        + " (1-sigma "
        + ", ".join(f"{k} {100 * v:.1f}%" for k, v in unc.items() if v is not None)
        + ")"
        + why,
        cpu_defaults=fit.gpu.name == CPU_GPU,
        frontend=fit.frontend,
    )
    texts = frontend_sources(fit.frontend, str(fit.provenance["bundle"]))
    return eng.model_copy(
        update={
            k: getattr(eng, k).model_copy(update={"source": t})
            for k, t in texts.items()
            if getattr(eng, k, None) is not None
        }
    )


def frontend_sources(fe: FrontEndFit, bundle: str) -> dict[str, str]:
    """The source of each front-end figure of the calibrated engine: fitted (by which command, on which
    bundle, from which requests), or 0 and why it was not fitted.  Empty when the fit found no front end."""
    if fe.frontend_s is None:
        return {}
    by = f"`epdsim calibrate fit {bundle}`"
    fitted, zero = f"fitted by {by} on bundle {bundle}", f"0, not fitted, by {by} on bundle {bundle}"
    lone = f"{fe.lone_requests} lone requests of its prefill sweep"
    loaded = f"{fe.loaded_requests} requests of {', '.join(fe.phases) or 'no phase'}"
    out = {
        "frontend_s": f"{fitted}: the way in, a fixed delay per request (client - server TTFT of {lone}"
        + (")" if fe.stream_why else ", less the API server loop's share)"),
        "frontend_serial_s_per_token": (
            f"{fitted}: the way in's serial part per prompt token, one request at a time (slope of the client "
            f"- server TTFT of {lone} against their prompt lengths)"
            if fe.serial_s_per_token
            else f"{zero}: the client - server TTFT of {lone} does not grow with the prompt length"
        ),
        "frontend_stream_s_per_output": (
            f"{zero}: the API server's loop per engine output; where each chunk carries one token it cannot be "
            f"told from the cost per chunk (calibration/fit/frontend.py)"
        ),
    }
    for key, what in (
        ("frontend_stream_s_per_chunk", "per SSE chunk streamed (a chunk carries every token waiting)"),
        ("frontend_stream_s_per_request", "more for a request's first chunk"),
    ):
        out[key] = (
            f"{zero}: no API server loop kept ({fe.stream_why})"
            if fe.stream_why
            else f"{fitted}: the API server's loop, {what}, from {loaded} (client TTFT and E2E against the "
            f"server's token times)"
            + ("" if getattr(fe, key.replace("frontend_", "")) else "; at the fit's floor, read as 0")
        )
    return out


def write_outputs(fit: BundleFit, out: str | Path) -> dict[str, Path]:
    """Write the profile, the model (config.json + sidecar) and the fit report into hwdb folder ``out``."""
    out = Path(out)
    prof = fit.profile
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    ppath = out / "profiles" / f"{prof.name}.yaml"
    head = (
        f"# Calibration profile for {prof.gpu} under vLLM {prof.engine_version}, model {fit.provenance['model']}.\n"
        f"# Generated by `epdsim calibrate fit {fit.provenance['bundle']}` on {prof.created};\n"
        f"# re-run it rather than editing by hand. Full report: fits/{prof.name}.json\n"
    )
    ppath.write_text(
        head + yaml.safe_dump(prof.model_dump(exclude_none=True), sort_keys=False, width=100, allow_unicode=True)
    )
    paths = {"profile": ppath}
    served = fit.provenance["model"]
    mdir = out / "models" / re.sub(r"[^A-Za-z0-9._-]+", "-", served)
    mdir.mkdir(parents=True, exist_ok=True)
    (mdir / "config.json").write_text(json.dumps(fit.model.config, indent=2) + "\n")
    side = {
        "name": served,
        "source": f"config.json of the model served in bundle {fit.provenance['bundle']} "
        f"(SHA-256 {fit.provenance.get('model_config_sha256')})",
    }
    (mdir / "epdsim.yaml").write_text(yaml.safe_dump(side, sort_keys=False))
    paths["model"] = mdir
    eng = final_engine(fit)
    (out / "engines").mkdir(parents=True, exist_ok=True)
    epath = out / "engines" / f"{eng.name}.yaml"
    epath.write_text(
        f"# Engine with the host costs fitted by `epdsim calibrate fit` (see profiles/{prof.name}.yaml)\n"
        + yaml.safe_dump(eng.model_dump(exclude_none=True), sort_keys=False, width=100)
    )
    paths["engine"] = epath
    if fit.derived_gpu:  # the profile's efficiencies are relative to these peaks: they travel together
        (out / "gpus").mkdir(parents=True, exist_ok=True)
        gpath = out / "gpus" / f"{fit.gpu.name}.yaml"
        gpath.write_text(
            f"# {fit.gpu.name} derived from the host of bundle {fit.provenance['bundle']} by `epdsim "
            f"calibrate fit` (calibration/fit/host.py); the shipped entry describes another CPU\n"
            + yaml.safe_dump(fit.gpu.model_dump(mode="json", exclude_none=True), sort_keys=False, width=100)
        )
        paths["gpu"] = gpath
    (out / "fits").mkdir(parents=True, exist_ok=True)
    rpath = out / "fits" / f"{prof.name}.json"
    rpath.write_text(json.dumps(fit_report(fit), indent=2, default=str) + "\n")
    paths["report"] = rpath
    try:  # the folder must load as a user hwdb
        hwdb.load([out])
    except hwdb.HwdbError as exc:  # pragma: no cover - a bug in this module
        raise FitInputError(f"the written hwdb folder {out} does not load: {exc}") from None
    return paths


def fit_report(fit: BundleFit) -> dict:
    r = fit.result
    return {
        "profile": fit.profile.name,
        "engine_name": fit.engine_name,
        "gpu": fit.gpu.name,
        "model": fit.provenance["model"],
        "provenance": fit.provenance,
        "engine": fit.setup.as_dict(),
        "params": {
            n: {
                "value": r.params[n],
                "sigma_rel": r.sigma_rel.get(n),
                "interval95": list(r.interval95(n)) if n in r.sigma_rel else None,
                "fitted": n in r.free,
                "why_fixed": r.fixed.get(n),
                "remark": r.remarks.get(n),
            }
            for n in r.params
        },
        "not_in_profile": {n: why for n, why in r.fixed.items() if n not in r.params},
        "free": r.free,
        "correlation": r.correlation,
        "s": math.sqrt(r.s2),
        "cost": r.cost,
        "n_points": r.n_points,
        "starts": r.starts,
        "quality": {k: v.model_dump() for k, v in r.quality.items()},
        "frontend_s": fit.frontend_s,
        "frontend": fit.frontend.as_dict(),
        "mixed_steps": mixed_step_note(r),
        "decode_batch": fit.notes.get("decode_batch"),
        "host": fit.host,
        "residuals": r.residuals,
    }
