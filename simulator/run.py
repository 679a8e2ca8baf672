"""The single entry point of a simulation: scenario in, :class:`Results` out (or its requests table alone)."""
from __future__ import annotations

import pandas as pd

from simulator.confidence import assess
from simulator.engine.engine import PoolSpec
from simulator.epd.epd import EPDError, prepare as prepare_epd
from simulator.epd.epd_flow import add_columns, encoder_summary
from simulator.engine.opsresults import ops_requests_frame, ops_summary
from simulator.engine.opsrun import run_operations
from simulator.errors import WorkloadError
from simulator.pd.pd import TransferConfigError, build_transfer_plan, crossover_bandwidth
from simulator.engine.results import Results, links_frame, requests_frame, steps_frame, summarize
from simulator.scenario import ResolvedPool, Scenario, ScenarioError, resolve, rng_streams
from simulator.traces import TraceError
from simulator.workload import generate


def pool_spec(r: ResolvedPool) -> PoolSpec:
    """The engine's view of a resolved pool."""
    pool, dep = r.pool, r.dep
    k, eng = dep.knobs, dep.engine
    # A harness-fitted profile describes the server side; `calibrate validate` adds its own measured
    # front end, so the engine's fitted GPU-serving front end stays out.
    harness = dep.profile is not None and dep.profile.step_overhead_s is not None
    fe = (eng.frontend_s.value if eng.frontend_s and not harness else 0.0,
          eng.frontend_s_per_token.value if eng.frontend_s_per_token and not harness else 0.0)
    # Each attention data-parallel rank schedules its own batch into its own KV cache: the engine runs
    # ranks (instances x dp of them); the pool's GPUs and cost count whole instances (Deployment.gpus).
    return PoolSpec(pool.name, pool.instances * dep.dp, r.step, r.memory, k.max_num_seqs, k.max_num_batched_tokens,
                    k.enable_chunked_prefill, k.max_model_len, pool.router, pool.role,
                    eng.default_prefix_caching if pool.engine.enable_prefix_caching is None
                    else pool.engine.enable_prefix_caching,
                    *fe, dep.dp)


def _run(scn: Scenario, replication: int, db, step_log: bool = True):
    """Resolve and run ``scn``: what :func:`simulate` and :func:`simulate_requests` build their tables from."""
    rs = resolve(scn, db)
    db, model, pools = rs.db, rs.model, rs.pools
    rngs = rng_streams(scn.seed, replication)
    try:
        reqs = generate(scn.workload, rngs["arrivals"], rngs["lengths"])
    except (WorkloadError, TraceError) as exc:
        raise ScenarioError(f"workload: {exc}") from None
    try:
        reqs, epd = prepare_epd(scn, db, model, pools, reqs, rngs["images"])
    except EPDError as exc:
        raise ScenarioError(str(exc)) from None
    plan = None
    if scn.is_pd:
        front, back = rs.role("prefill"), rs.role("decode")
        try:
            plan = build_transfer_plan(scn.kv_transfer, db, front.dep, back.dep)
        except TransferConfigError as exc:
            raise ScenarioError(str(exc)) from None
    else:
        front, back = rs.role("colocated"), None
    closed = reqs.client if reqs.is_closed_loop else None
    # A run without operations is an operations run whose lifecycle never fires; its requests table
    # has no failures, retries or discarded tokens to show.
    ops, run, rec = run_operations(scn, reqs, front, back, plan, closed, rngs, pool_spec, epd, step_log)
    if scn.operations.enabled:
        req_df = ops_requests_frame(run, back.name if back else front.name)
    else:
        req_df = requests_frame(run, back.name if back else front.name)
        ops = None
    if run.epd is not None:
        req_df = add_columns(req_df, run.epd)
    if reqs.client is not None and reqs.client.warmup_requests:
        req_df["warmup"] = req_df["request_id"].to_numpy() < reqs.client.warmup_requests
    return rs, reqs, epd, plan, front, back, ops, run, rec, req_df


def simulate_requests(scn: Scenario, replication: int = 0, db=None) -> pd.DataFrame:
    """The requests table of ``simulate(scn, replication, db)``, and only it: for callers that judge
    requests alone (the goodput probes of :mod:`simulator.goodput` and the planner), which need not
    pay for the step log, the step table, the summary and the link table."""
    return _run(scn, replication, db, step_log=False)[-1]


def simulate(scn: Scenario, replication: int = 0, db=None) -> Results:
    """Run ``scn`` once; ``replication`` selects an independent random stream.

    Same scenario and replication give byte-identical DataFrames.  Raises
    :class:`ScenarioError` for anything wrong with the input.  ``db``: an
    already loaded ``hwdb.load(scn.hwdb)`` to reuse across many runs.
    """
    rs, reqs, epd, plan, front, back, ops, run, rec, req_df = _run(scn, replication, db)
    db, model, pools = rs.db, rs.model, rs.pools
    step_df = steps_frame(run)
    gpus = sum(r.pool.instances * r.dep.gpus for r in pools) + (epd.gpus if epd else 0)
    price = (sum(r.pool.instances * r.dep.gpus * r.dep.gpu.price_usd_per_hour.value for r in pools)
             + (epd.price_usd_per_hour if epd else 0.0))
    summary = summarize(req_df, step_df, rec.resume_gaps, gpus=gpus, cost_usd_per_hour=price,
                        ttft_slo=scn.slo.ttft_s, tpot_slo=scn.slo.tpot_s)
    if ops is not None:
        summary["operations"] = ops_summary(ops, req_df, scn.slo.ttft_s, {
            r.name: r.dep.gpu.price_usd_per_hour.value for r in pools})
    if run.coordinator is not None:
        summary["kv_bytes_moved"] = run.coordinator.bytes_moved
        summary["links"] = run.coordinator.fabric.link_stats()
        mean_prompt = max(1, int(round(float(req_df["input_tokens"].mean()))))
        summary["crossover"] = crossover_bandwidth(front.step, plan.kv_bytes_per_token, mean_prompt,
                                                   front.dep.knobs.max_num_batched_tokens)
    if run.epd is not None:
        summary["encoder"] = encoder_summary(run.epd, summary["duration_s"])
    pool, dep, mem = front.pool, front.dep, front.memory
    k = dep.knobs
    info = {
        "model": model.name,
        "gpu": dep.gpu.name,
        "tp": dep.tp, "pp": dep.pp, "instances": pool.instances,
        "engine": dep.engine.name,
        "max_num_seqs": max(r.dep.knobs.max_num_seqs for r in pools),
        "max_num_batched_tokens": max(r.dep.knobs.max_num_batched_tokens for r in pools),
        "max_model_len": k.max_model_len,
        "kv_cache_tokens_per_instance": mem.kv_tokens,
        "weights_bytes_per_gpu": mem.weight_bytes,
        "pools": [{"name": p.name, "role": p.role, "gpu": d.gpu.name, "tp": d.tp, "pp": d.pp, "dp": d.dp, "ep": d.ep,
                   "instances": p.instances, "kv_cache_tokens_per_instance": m.kv_tokens,
                   "perf_model": (f"calibrated profile {d.profile.name}" if d.profile
                                  else f"datasheet peaks x default efficiencies of {d.gpu.name} (uncalibrated)"),
                   "confidence": assess(d)}
                  for p, d, m in ((r.pool, r.dep, r.memory) for r in pools)],
        "perf_model": (f"calibrated profile {dep.profile.name}" if dep.profile
                       else f"datasheet peaks x default efficiencies of {dep.gpu.name} (uncalibrated)"),
        "kv_transfer": (None if plan is None else
                        {"connector": plan.connector, "link": plan.link_name,
                         "prefill_side_Bps": plan.prefill_side_Bps, "decode_side_Bps": plan.decode_side_Bps,
                         "layerwise": plan.layerwise}),
        "replication": replication,
        "seed": scn.seed,
        "workload_notes": list(reqs.notes),
    }
    if epd is not None and epd.encoder_pool is not None:
        ep = epd.encoder_pool
        info["pools"].append({"name": ep.name, "role": "encoder", "gpu": epd.encoder_gpu, "tp": ep.tp, "pp": 1,
                              "instances": ep.instances, "kv_cache_tokens_per_instance": 0,
                              "perf_model": "vision encoder: datasheet peaks x GPU efficiency curves x TP table"})
    links = links_frame(run.coordinator.fabric) if run.coordinator is not None else None
    return Results(scn, req_df, step_df, summary, info, links)
