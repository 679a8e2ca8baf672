"""The single entry point of a simulation: scenario in, :class:`Results` out."""
from __future__ import annotations

from simulator.engine import PoolSpec, Recorder, run_pool
from simulator.results import Results, requests_frame, steps_frame, summarize
from simulator.scenario import Scenario, ScenarioError, resolve, rng_streams
from simulator.traces import TraceError
from simulator.workload import WorkloadError, generate


def simulate(scn: Scenario, replication: int = 0) -> Results:
    """Run ``scn`` once; ``replication`` selects an independent random stream.

    Same scenario and replication give byte-identical DataFrames.  Raises
    :class:`ScenarioError` for anything wrong with the input.
    """
    db, model, pools = resolve(scn)
    rngs = rng_streams(scn.seed, replication)
    try:
        reqs = generate(scn.workload, rngs["arrivals"], rngs["lengths"])
    except (WorkloadError, TraceError) as exc:
        raise ScenarioError(f"workload: {exc}") from None
    pool, dep, mem, step = pools[0]
    k = dep.knobs
    spec = PoolSpec(pool.name, pool.instances, step, mem, k.max_num_seqs, k.max_num_batched_tokens,
                    k.enable_chunked_prefill, k.max_model_len, pool.router)
    rec = Recorder(reqs.input_tokens, reqs.output_tokens, reqs.arrival_s)
    closed = (reqs.concurrency, reqs.think_time_s) if reqs.is_closed_loop else None
    run = run_pool(spec, rec, closed_loop=closed, max_time_s=scn.simulation.max_time_s)
    req_df = requests_frame(run, pool.name)
    step_df = steps_frame(run, pool.name)
    gpus = pool.instances * dep.gpus
    summary = summarize(req_df, step_df, rec.resume_gaps, gpus=gpus,
                        price_per_gpu_hour=dep.gpu.price_usd_per_hour.value,
                        ttft_slo=scn.slo.ttft_s, tpot_slo=scn.slo.tpot_s, kv_total_blocks=mem.kv_blocks)
    info = {
        "model": model.name,
        "gpu": dep.gpu.name,
        "tp": dep.tp, "pp": dep.pp, "instances": pool.instances,
        "engine": dep.engine.name,
        "max_num_seqs": k.max_num_seqs, "max_num_batched_tokens": k.max_num_batched_tokens,
        "max_model_len": k.max_model_len,
        "kv_cache_tokens_per_instance": mem.kv_tokens,
        "weights_bytes_per_gpu": mem.weight_bytes,
        "perf_model": (f"calibrated profile {dep.profile.name}" if dep.profile
                       else f"datasheet peaks x default efficiencies of {dep.gpu.name} (uncalibrated)"),
        "replication": replication,
        "seed": scn.seed,
        "workload_notes": list(reqs.notes),
    }
    return Results(scn, req_df, step_df, summary, info)
