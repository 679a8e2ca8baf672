"""Cold start and Kubernetes probes for one model on one GPU type (no Streamlit).

Wraps :mod:`simulator.ops.coldstart` and :mod:`simulator.ops.k8s` as the ``epdsim coldstart`` and
``epdsim probes`` commands do, returning DataFrames for the Operations page.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

import pandas as pd

import hwdb
from app.services.scenarios import InputError
from hwdb.coldstart import load_coldstart
from simulator.ops.coldstart import PHASE_LABELS, CompileCache, breakdown
from simulator.ops.coldstart_formulas import ColdStartError
from simulator.ops.k8s import recommend_probes, simulate_pod
from simulator.ops.probe_spec import PodSpec, Probe, ProbeError
from simulator.perf import FitError, plan_memory
from simulator.plan.artefacts import vllm_args
from simulator.scenario import PoolConfig, ScenarioError, deployment_for

OPS_ERRORS = (ColdStartError, ProbeError, hwdb.HwdbError, ScenarioError, FitError, ValueError)


@dataclass(frozen=True)
class StartQuery:
    """One instance's start: model, GPU, parallelism, storage, caches (names as in hwdb)."""

    model: str
    gpu: str
    tp: int = 1
    dtype: str = "bf16"
    storage: str = "nvme"
    compile_cache: CompileCache = "miss"
    image_cached: bool = True
    enforce_eager: bool = False
    hwdb_dirs: tuple[str, ...] = ()
    kv_cache_dtype: str = "auto"
    pp: int = 1
    dp: int = 1
    ep: int = 1
    # The pool's other engine arguments (EngineConfig keys and values), as the scenario on Home has them.
    engine_args: tuple[tuple[str, object], ...] = ()


def query_from_pool(pool: dict, model: str, gpu: str, tp: int, **start) -> StartQuery:
    """The start of one instance of scenario pool ``pool`` (a dict as Home edits it): its weights and KV
    dtypes, PP/DP/EP and engine arguments travel; ``model``, ``gpu``, ``tp`` and ``start`` (storage,
    caches, enforce_eager, dtype or kv_cache_dtype overrides) are the page's choices."""
    eng = {k: v for k, v in (pool.get("engine") or {}).items() if k != "enforce_eager"}
    keep = {
        "dtype": pool.get("dtype", "bf16"),
        "kv_cache_dtype": pool.get("kv_cache_dtype", "auto"),
        "pp": int(pool.get("pp", 1)),
        "dp": int(pool.get("dp", 1)),
        "ep": int(pool.get("ep", 1)),
    }
    return StartQuery(model=model, gpu=gpu, tp=int(tp), **{**keep, **start}, engine_args=tuple(sorted(eng.items())))


def settings_text(q: StartQuery) -> str:
    """The instance's settings in one line: "TP2 PP1 DP2 EP4, weights fp8, KV cache fp8, engine vllm-v1"."""
    eng = dict(q.engine_args)
    extra = ", ".join(f"{k} {v}" for k, v in eng.items() if k != "engine")
    return (
        f"TP{q.tp} PP{q.pp} DP{q.dp} EP{q.ep}, weights {q.dtype}, KV cache {q.kv_cache_dtype}, engine "
        f"{eng.get('engine', 'vllm-v1')}" + (f", {extra}" if extra else "")
    )


def serve_line(q: StartQuery, db: hwdb.HardwareDB | None = None) -> str:
    """The `vllm serve` line of the instance whose start is modelled (the planner's own argument builder)."""
    try:
        dep = _deployment(q, db)
        model = (db or hwdb.load(q.hwdb_dirs)).model(q.model)
        args = vllm_args(model.sidecar.hf_id or model.name, dep, "colocated", None)
    except OPS_ERRORS as exc:
        raise InputError(str(exc)) from None
    return "vllm serve " + shlex.join(args)


def storages() -> list[str]:
    return sorted(load_coldstart().storage)


def _deployment(q: StartQuery, db: hwdb.HardwareDB | None = None):
    db = db or hwdb.load(q.hwdb_dirs)
    model = db.model(q.model)
    pool = PoolConfig(
        gpu=q.gpu,
        tp=q.tp,
        pp=q.pp,
        dp=q.dp,
        ep=q.ep,
        dtype=q.dtype,
        kv_cache_dtype=q.kv_cache_dtype,
        engine={**dict(q.engine_args), "enforce_eager": q.enforce_eager},
    )
    dep = deployment_for(pool, model, db)
    plan_memory(dep)
    return dep


def cold_start(q: StartQuery, db: hwdb.HardwareDB | None = None) -> dict:
    """The start-up breakdown (cold cache as asked, and with a warm compile cache for contrast).

    Returns {"phases": DataFrame(case, phase, label, seconds, detail), "total_s", "container_s",
    "warm_total_s", "description", "notes"}.  ``db``: an already loaded database (else loaded here).
    """
    try:
        dep = _deployment(q, db)
        bd = breakdown(dep, q.compile_cache, storage=q.storage, image_cached=q.image_cached)
        warm = breakdown(dep, "hit", storage=q.storage, image_cached=q.image_cached)
    except OPS_ERRORS as exc:
        raise InputError(str(exc)) from None
    rows = [
        {
            "case": f"compile cache {b.compile_cache}",
            "phase": p.name,
            "label": PHASE_LABELS.get(p.name, p.name),
            "seconds": p.seconds,
            "detail": p.detail,
        }
        for b in ((bd, warm) if q.compile_cache == "miss" else (bd,))
        for p in b.phases
    ]
    return {
        "phases": pd.DataFrame(rows),
        "total_s": bd.total_s,
        "container_s": bd.container_s,
        "warm_total_s": warm.total_s,
        "description": bd.description,
        "notes": list(bd.extrapolated),
        "breakdown": bd,
        "warm": warm,
        "deployment": dep,
    }


def probes(
    q: StartQuery,
    startup: tuple[int, int, int, int] | None,
    liveness: tuple[int, int, int, int] | None,
    readiness: tuple[int, int, int, int] | None = None,
    compile_cache_volume: bool = False,
    margin: float = 0.5,
    horizon_s: float = 1800.0,
    db: hwdb.HardwareDB | None = None,
) -> dict:
    """Simulate the pod under the given probes (each (initialDelaySeconds, periodSeconds, timeoutSeconds,
    failureThreshold) or None); returns the outcome, the attempts as a DataFrame and the recommended probes."""
    try:
        if not horizon_s > 0:
            raise ProbeError(f"horizon={horizon_s} must be > 0 seconds")
        st = Probe(*startup, name="startupProbe") if startup else None
        lv = Probe(*liveness, name="livenessProbe") if liveness else None
        rd = Probe(*readiness, name="readinessProbe") if readiness else None
        cs = cold_start(q, db)
        bd, warm = cs["breakdown"], cs["warm"]
        basis = (
            bd
            if bd.compile_cache == "miss"
            else breakdown(cs["deployment"], "miss", storage=q.storage, image_cached=q.image_cached)
        )
        rec = recommend_probes(basis, margin=margin)
        spec = PodSpec(startup=st, liveness=lv, readiness=rd, compile_cache_volume=compile_cache_volume)
        res = simulate_pod(bd, spec, warm, horizon_s=horizon_s)
    except OPS_ERRORS as exc:
        raise InputError(str(exc)) from None
    att = pd.DataFrame(
        [
            {
                "attempt": a.index,
                "start_s": a.started_s,
                "end_s": a.ended_s
                if a.ended_s is not None
                else min(horizon_s, res.ready_s or horizon_s)
                if a.outcome != "serving"
                else horizon_s,
                "outcome": a.outcome,
                "compile_cache": a.compile_cache,
                "phase": a.phase,
                "killed_by": a.killed_by,
            }
            for a in res.attempts
        ]
    )
    return {
        "ready_s": res.ready_s,
        "never_ready": res.never_ready,
        "restarts": res.restarts,
        "summary": res.summary() if not res.never_ready else f"never ready: {res.reason}",
        "warnings": list(res.warnings),
        "attempts": att,
        "recommended_yaml": rec.yaml,
        "recommended_startup": rec.startup,
        "horizon_s": horizon_s,
        "start_s": bd.total_s,
    }
