"""The single entry point of a simulation: scenario in, :class:`Results` out (or its requests table alone)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import pandas as pd

from simulator.confidence import assess
from simulator.engine.frontend import FrontEnd, add_stream
from simulator.engine.opsresults import ops_summary
from simulator.engine.opsrun import run_operations
from simulator.engine.records import PoolSpec
from simulator.engine.results import Results, links_frame, requests_frame, steps_frame, summarize
from simulator.epd.epd import EPDError
from simulator.epd.epd import prepare as prepare_epd
from simulator.epd.epd_flow import add_columns, encoder_summary
from simulator.errors import WorkloadError
from simulator.pd.pd import crossover_bandwidth
from simulator.resolved import ResolvedPool, ResolvedScenario, resolve
from simulator.scenario import Scenario, ScenarioError
from simulator.serving_summary import offered_load
from simulator.traces import TraceError
from simulator.workload import generate

if TYPE_CHECKING:
    from simulator.engine.opsengine import OpsRun
    from simulator.engine.records import PoolRun, Recorder
    from simulator.epd.epd import EPDSetup
    from simulator.pd.pd import TransferPlan


def pool_spec(r: ResolvedPool) -> PoolSpec:
    """The engine's view of a resolved pool."""
    pool, dep = r.pool, r.dep
    k, eng = dep.knobs, dep.engine
    # Each attention data-parallel rank schedules its own batch into its own KV cache: the engine runs
    # ranks (instances x dp of them); the pool's GPUs and cost count whole instances (Deployment.gpus).
    return PoolSpec(
        pool.name,
        pool.instances * dep.dp,
        r.step,
        r.memory,
        k.max_num_seqs,
        k.max_num_batched_tokens,
        k.enable_chunked_prefill,
        k.max_model_len,
        pool.router,
        pool.role,
        k.prefix_caching,
        front_end(dep, pool.instances),
        dep.dp,
        eng.admission,
        eng.dp_context_wait_steps,
        k.recv_interval,
        k.async_scheduling,
    )


def front_end(dep, instances: int = 1) -> FrontEnd:
    """The engine profile's fitted front end for a deployment (:mod:`simulator.engine.frontend`).

    A harness-fitted profile (``calibrate fit``: it names the model it measured, or has a fitted step
    overhead) describes the server of one host; the front end that goes with it is the one its
    calibrated engine, named as the profile, carries.  Another engine's front end (fitted end to end on
    GPU servers) stays out.  Each of the pool's ``instances`` has an API server of its own (a serial
    part each)."""
    eng, prof = dep.engine, dep.profile
    harness = prof is not None and (prof.model is not None or prof.step_overhead_s is not None)
    if harness and eng.name != prof.name:
        return FrontEnd()

    def val(f) -> float:
        return f.value if f is not None else 0.0

    return FrontEnd(
        val(eng.frontend_s),
        val(eng.frontend_s_per_token),
        val(eng.frontend_serial_s_per_token),
        max(int(instances), 1),
        val(eng.frontend_stream_s_per_output),
        val(eng.frontend_stream_s_per_chunk),
        val(eng.frontend_stream_s_per_request),
    )


@dataclass(frozen=True)
class _Run:
    """One resolved and run scenario, before its summary: what :func:`simulate` reports on."""

    resolved: ResolvedScenario
    epd: EPDSetup | None  # a multimodal run's, else None
    plan: TransferPlan | None  # the PD transfer plan, else None
    front: ResolvedPool  # the colocated or prefill pool
    back: ResolvedPool | None  # the decode pool (PD)
    ops: OpsRun | None  # the operations run, None without an operations block
    run: PoolRun
    recorder: Recorder
    requests: pd.DataFrame
    steps: pd.DataFrame | None  # None when the step log was not kept
    notes: tuple[str, ...]  # what the workload generator adjusted (trace rows sorted, outputs clamped)


def _run(scn: Scenario, replication: int, db, step_log: bool = True, watch=None, shortcuts: bool = True) -> _Run:
    """Resolve and run ``scn``: what :func:`simulate` and :func:`simulate_requests` build their tables from.
    ``watch``: see :func:`simulate_requests`; ``shortcuts``: see :func:`simulate`."""
    rs = resolve(scn, db)
    db, model, pools = rs.db, rs.model, rs.pools
    rngs = rs.streams(replication)
    try:
        reqs = generate(scn.workload, rngs["arrivals"], rngs["lengths"])
    except (WorkloadError, TraceError) as exc:
        raise ScenarioError(f"workload: {exc}") from None
    try:
        reqs, epd = prepare_epd(scn, db, model, pools, reqs, rngs["images"])
    except EPDError as exc:
        raise ScenarioError(str(exc)) from None
    plan = rs.transfer
    # The scenario's pool roles are checked (Scenario._pool_layout): the front pool is there.
    if scn.is_pd:
        front, back = cast(ResolvedPool, rs.role("prefill")), rs.role("decode")
    else:
        front, back = cast(ResolvedPool, rs.role("colocated")), None
    closed = reqs.client if reqs.is_closed_loop else None
    # A run without operations is an operations run whose lifecycle never fires; its requests table
    # has no failures, retries or discarded tokens to show.
    fe = front_end(back.dep if back else front.dep)
    # The front end's API server loop reads the step log (when each token left the engine).
    step_log = step_log or fe.has_queue
    # A watch may judge a request when it ends only where the requests table will show the recorder's figures
    # unchanged: no operations (re-prefilled requests are restored after the run), no front-end API server loop
    # and no encoder tier (both rewrite client times).
    if scn.operations.enabled or fe.has_queue or epd is not None:
        watch = None
    ops, run, rec = run_operations(
        scn, reqs, front, back, plan, closed, rngs, pool_spec, epd, step_log, watch, shortcuts=shortcuts
    )
    req_df = requests_frame(run, back.name if back else front.name, operations=scn.operations.enabled)
    if not scn.operations.enabled:
        ops = None
    step_df = steps_frame(run) if step_log else None
    # What the client sees: the first and last tokens through the front end's API server loop.
    req_df = add_stream(req_df, step_df, fe)
    if run.epd is not None:
        req_df = add_columns(req_df, run.epd)
    if reqs.client is not None and reqs.client.warmup_requests:
        req_df["warmup"] = req_df["request_id"].to_numpy() < reqs.client.warmup_requests
    return _Run(rs, epd, plan, front, back, ops, run, rec, req_df, step_df, tuple(reqs.notes))


def simulate_requests(scn: Scenario, replication: int = 0, db=None, watch=None) -> pd.DataFrame:
    """The requests table of ``simulate(scn, replication, db)``, and only it: for callers that judge
    requests alone (the goodput probes of :mod:`simulator.goodput` and the planner), which need not
    pay for the step log, the step table, the summary and the link table.

    ``watch``: called with the run's recorder before it starts; what it returns (if not None) is called
    as ``(rid, outcome, now)`` whenever a request ends, and may stop the run by raising
    (:class:`simulator.goodput.VerdictWatch`).  Not called where the table's figures could differ from the
    recorder's."""
    return _run(scn, replication, db, step_log=False, watch=watch).requests


def simulate(scn: Scenario, replication: int = 0, db=None, *, shortcuts: bool = True) -> Results:
    """Run ``scn`` once; ``replication`` selects an independent random stream.

    Same scenario and replication give byte-identical DataFrames.  Raises
    :class:`ScenarioError` for anything wrong with the input.  ``db``: an
    already loaded ``hwdb.load(scn.hwdb)`` to reuse across many runs.  ``shortcuts`` False: every
    step is one SimPy event (:mod:`simulator.engine.stepping`), the slow reference that gives the same results.
    """
    r = _run(scn, replication, db, shortcuts=shortcuts)
    rs, epd, plan, front, ops, run, rec = r.resolved, r.epd, r.plan, r.front, r.ops, r.run, r.recorder
    req_df, step_df = r.requests, r.steps
    db, model, pools = rs.db, rs.model, rs.pools
    gpus = sum(r.pool.instances * r.dep.gpus for r in pools) + (epd.gpus if epd else 0)
    price = sum(r.pool.instances * r.dep.gpus * r.dep.gpu.price_usd_per_hour.value for r in pools) + (
        epd.price_usd_per_hour if epd else 0.0
    )
    summary = summarize(
        req_df,
        step_df,
        rec.resume_gaps,
        gpus=gpus,
        cost_usd_per_hour=price,
        ttft_slo=scn.slo.ttft_s,
        tpot_slo=scn.slo.tpot_s,
    )
    if ops is not None:
        price_per_gpu_h = {r.name: r.dep.gpu.price_usd_per_hour.value for r in pools}
        if epd is not None and epd.encoder_pool is not None:
            price_per_gpu_h[epd.encoder_pool.name] = epd.price_usd_per_hour / epd.gpus
        summary["operations"] = ops_summary(ops, req_df, scn.slo.ttft_s, price_per_gpu_h)
    if run.coordinator is not None:
        summary["kv_bytes_moved"] = run.coordinator.bytes_moved
        summary["links"] = run.coordinator.fabric.link_stats()
        mean_prompt = max(1, int(round(float(req_df["input_tokens"].mean()))))
        kv_per_token = cast("TransferPlan", plan).kv_bytes_per_token  # a PD run has its transfer plan
        summary["crossover"] = crossover_bandwidth(
            front.step, kv_per_token, mean_prompt, front.dep.knobs.max_num_batched_tokens
        )
    if run.epd is not None:
        summary["encoder"] = encoder_summary(run.epd, summary["duration_s"])
    pool, dep, mem = front.pool, front.dep, front.memory
    k = dep.knobs
    info: dict[str, Any] = {
        "model": model.name,
        "gpu": dep.gpu.name,
        "tp": dep.tp,
        "pp": dep.pp,
        "instances": pool.instances,
        "engine": dep.engine.name,
        "max_num_seqs": max(r.dep.knobs.max_num_seqs for r in pools),
        "max_num_batched_tokens": max(r.dep.knobs.max_num_batched_tokens for r in pools),
        "max_model_len": k.max_model_len,
        "kv_cache_tokens_per_instance": mem.kv_tokens,
        "weights_bytes_per_gpu": mem.weight_bytes,
        "pools": [
            {
                "name": p.name,
                "role": p.role,
                "gpu": d.gpu.name,
                "tp": d.tp,
                "pp": d.pp,
                "dp": d.dp,
                "ep": d.ep,
                "instances": p.instances,
                "kv_cache_tokens_per_instance": m.kv_tokens,
                "dtype": d.weight_dtype,  # weights; the KV cache's format is kv_cache_dtype
                "kv_cache_dtype": d.kv_dtype,
                "kv_cache_dtype_why": d.kv_note,
                "moe_kernel": d.moe_source,
                **(
                    {"linear_attention_kernel": d.gdn_source or "none measured: not modelled"}
                    if d.arch.num_linear_layers
                    else {}
                ),
                **(
                    {"mla_kernel": d.mla_source or "not measured apart: the attention curves of the profile or GPU"}
                    if d.arch.is_mla
                    else {}
                ),
                "kv_cache_sizing": m.rule,
                "max_running_requests": d.knobs.max_num_seqs,
                # a prompt sent while step K runs first joins K + 2 (the engine schedules a step ahead)
                "async_scheduling": d.knobs.async_scheduling,
                "perf_model": (
                    f"calibrated profile {d.profile.name}"
                    if d.profile
                    else f"datasheet peaks x default efficiencies of {d.gpu.name} (uncalibrated)"
                ),
                "confidence": assess(d),
            }
            for p, d, m in ((r.pool, r.dep, r.memory) for r in pools)
        ],
        "perf_model": (
            f"calibrated profile {dep.profile.name}"
            if dep.profile
            else f"datasheet peaks x default efficiencies of {dep.gpu.name} (uncalibrated)"
        ),
        "kv_transfer": (
            None
            if plan is None
            else {
                "connector": plan.connector,
                "link": plan.link_name,
                "prefill_side_Bps": plan.prefill_side_Bps,
                "decode_side_Bps": plan.decode_side_Bps,
                "layerwise": plan.layerwise,
            }
        ),
        "replication": replication,
        "seed": scn.seed,
        "slo": scn.slo.model_dump(mode="json"),
        "offered_load": offered_load(scn.workload, req_df["arrival_s"]),
        "workload_notes": list(r.notes),
    }
    if epd is not None and epd.encoder_pool is not None:
        ep = epd.encoder_pool
        info["pools"].append(
            {
                "name": ep.name,
                "role": "encoder",
                "gpu": epd.encoder_gpu,
                "tp": ep.tp,
                "pp": 1,
                "instances": ep.instances,
                "kv_cache_tokens_per_instance": 0,
                "dtype": "bf16",  # the vision encoder is modelled in bf16 (simulator.epd.epd)
                "perf_model": "vision encoder: datasheet peaks x GPU efficiency curves x TP table",
            }
        )
    links = links_frame(run.coordinator.fabric) if run.coordinator is not None else None
    return Results(scn, req_df, step_df, summary, info, links)
