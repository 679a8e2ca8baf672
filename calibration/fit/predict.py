"""Predictions through the simulator itself: a candidate parameter set becomes a
:class:`hwdb.profiles.Profile` (and, with a per-sequence host cost, a calibrated engine profile) on the
bundle's deployment, and :func:`simulator.step_build.build_step_model` gives the times of each point."""

from __future__ import annotations

import dataclasses

import hwdb
from calibration.fit.engine_setup import CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS, CPU_DEFAULT_MAX_NUM_SEQS
from calibration.fit.points import Point
from hwdb.profiles import Profile
from hwdb.schema import EfficiencyCurve, Figure


# ============================================================================ predictions
def step(
    sm, tokens: float, logits: float, pairs: float, decode_ctx: float, prefill_ctx: float = 0.0, running: float = 0.0
) -> float:
    """``StepModel.step_time`` of one step, with its running-sequence count (the host's per-sequence cost)."""
    return sm.step_time(tokens, logits, pairs, decode_ctx, prefill_ctx, running=running)


def predict(sm, pt: Point, chunk: int) -> float:
    """The simulator's time for a measurement point (seconds): the mean step time at the batch and
    prefill share the point *measured* (``pt.batch``, ``pt.mix``), so the fit compares step times, not
    capacities.  Unlike the planner's screen (:mod:`simulator.plan.screen`), which solves for the batch
    a rate produces, nothing here is solved for: the measured load is given."""
    if pt.kind == "prefill":
        return sm.prefill_time(pt.prompt, chunk)
    b = max(pt.batch, 1.0)
    ctx = pt.prompt + pt.output / 2.0  # mean context over the request's decode steps
    t = step(sm, b, b, 0.0, b * ctx, 0.0, b)
    if pt.mix > 0:
        p = min(pt.prompt, max(chunk - int(b), 1)) if chunk else pt.prompt
        mixed = step(sm, b + p, b + 1, p * (p + 1) / 2.0, b * ctx, 0.0, b + 1)
        t = (1.0 - pt.mix) * t + pt.mix * mixed
    return t


def candidate_profile(vals: dict[str, float], gpu: hwdb.GPU, **meta) -> Profile:
    """A Profile holding ``vals``; parameters absent from ``vals`` keep the GPU's defaults."""
    src = meta.pop("curve_source", "epdsim calibrate fit (candidate)")
    ce_half = vals.get("compute_half", gpu.compute_efficiency.half)
    ce = EfficiencyCurve(
        max_eff=min(vals.get("compute_max_eff", gpu.compute_efficiency.max_eff), 1.0),
        half=ce_half,
        source=src,
        empirical=True,
    )
    att = (
        EfficiencyCurve(max_eff=min(vals["attention_max_eff"], 1.0), half=ce_half, source=src, empirical=True)
        if "attention_max_eff" in vals
        else None
    )
    me = (
        EfficiencyCurve(
            max_eff=min(vals["memory_max_eff"], 1.0), half=gpu.memory_efficiency.half, source=src, empirical=True
        )
        if "memory_max_eff" in vals
        else None
    )
    kv = (
        EfficiencyCurve(
            max_eff=min(vals["kv_max_eff"], 1.0), half=gpu.memory_efficiency.half, source=src, empirical=True
        )
        if "kv_max_eff" in vals
        else None
    )
    base = dict(
        name="candidate",
        gpu=gpu.name,
        engine_version="candidate",
        created="candidate",
        source="epdsim calibrate fit",
        method="candidate",
    )
    base.update(meta)
    return Profile(
        compute_efficiency=ce,
        attention_prefill_efficiency=att,
        memory_efficiency=me,
        attention_decode_efficiency=kv,
        step_overhead_s=vals.get("step_overhead_s"),
        prefill_step_overhead_s=vals.get("prefill_overhead_s"),
        **base,
    )


def calibrated_engine(
    base,
    overhead_s: float,
    per_seq_s: float,
    *,
    name: str = "candidate",
    version: str = "",
    source: str = "epdsim calibrate fit (candidate)",
    cpu_defaults: bool = False,
    frontend=None,
):
    """``base`` (an EngineProfile) with the host cost replaced by ``overhead_s + per_seq_s x sampled
    sequences`` per step, added to the device time (not overlapped), and no kernel-launch term.

    This is how a fitted per-sequence host cost reaches the simulator: a Profile's single
    ``step_overhead_s`` would zero the engine's CPU costs.  ``frontend``: the harness's fitted front end
    (:class:`calibration.fit.frontend.FrontEndFit`), or None for none."""

    def fig(v: float, what: str) -> Figure:
        return Figure(value=float(v), source=f"{source}: {what}", empirical=True)

    def zero(what: str) -> Figure:
        return fig(0.0, what)

    cpu = base.cpu.model_copy(
        update={
            "step_s": fig(overhead_s, "fixed host time per step"),
            "per_running_seq_s": zero("folded into per_sampled_seq_s"),
            "per_waiting_seq_s": zero("not measured"),
            "per_token_s": zero("folded into the compute efficiency"),
            "per_sampled_seq_s": fig(per_seq_s, "host time per sequence sampled in a step"),
        }
    )
    upd = {
        "name": name,
        "aliases": (),
        "version": version or base.version,
        "scheduling_overlapped": False,
        "cpu": cpu,
        "graph_launch_s": zero("folded into step_s"),
        "eager_launch_s_per_layer": zero("folded into step_s"),
        "notes": f"calibrated by {source}; the host cost adds to the device time (no overlap)",
    }
    # The base engine's front end was fitted on GPU serving runs; this engine carries the harness's own.
    upd.update(
        frontend_s=None,
        frontend_s_per_token=None,
        frontend_serial_s_per_token=None,
        frontend_stream_s_per_output=None,
        frontend_stream_s_per_chunk=None,
        frontend_stream_s_per_request=None,
    )
    if frontend is not None and frontend.frontend_s is not None:
        what = {
            "frontend_s": (frontend.frontend_s, "fitted: the way in, fixed (client - server TTFT of lone requests)"),
            "frontend_serial_s_per_token": (
                frontend.serial_s_per_token,
                "fitted: the way in's serial part, per prompt token (slope of the lone requests' client - server TTFT)",
            ),
            "frontend_stream_s_per_output": (
                frontend.stream_s_per_output,
                "fitted: the API server's loop, "
                "per engine output processed" + (f" (0: {frontend.stream_why})" if frontend.stream_why else ""),
            ),
            "frontend_stream_s_per_chunk": (
                frontend.stream_s_per_chunk,
                "fitted: the API server's loop, per SSE chunk streamed (a chunk carries every token waiting)",
            ),
            "frontend_stream_s_per_request": (
                frontend.stream_s_per_request,
                "fitted: the API server's loop, more for a request's first chunk",
            ),
        }
        upd.update({k: fig(round(v, 9), w) for k, (v, w) in what.items()})
    if cpu_defaults:
        upd.update(
            default_max_num_seqs=CPU_DEFAULT_MAX_NUM_SEQS,
            default_max_num_batched_tokens=CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS,
            defaults_source="vLLM 0.32 EngineArgs.get_batch_defaults for a CPU platform (OpenAI server, world "
            "size 1): max_num_seqs 128, max_num_batched_tokens 2048; " + base.defaults_source,
        )
    return base.model_copy(update=upd)


def candidate_deployment(dep, vals: dict[str, float]):
    """``dep`` with a candidate profile, and with a calibrated engine when ``vals`` has ``per_seq_s``."""
    if "per_seq_s" in vals:
        v = {k: x for k, x in vals.items() if k != "step_overhead_s"}
        return dataclasses.replace(
            dep,
            profile=candidate_profile(v, dep.gpu),
            engine=calibrated_engine(dep.engine, vals["step_overhead_s"], vals["per_seq_s"]),
        )
    return dataclasses.replace(dep, profile=candidate_profile(vals, dep.gpu))
