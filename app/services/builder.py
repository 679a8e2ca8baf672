"""The scenario builder's operations on a scenario dict (pure functions, no Streamlit).

The builder page shows widgets initialised from a scenario dict and writes them back with
these functions; each returns a new dict and leaves its input untouched.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import hwdb
from simulator.routing import ROUTERS

LAYOUTS = ("colocated", "pd")


@dataclass(frozen=True)
class Options:
    """What the hardware database offers, for select boxes (names, sorted)."""

    models: tuple[str, ...]
    gpus: tuple[str, ...]
    fabrics: tuple[str, ...]
    connectors: tuple[str, ...]
    engines: tuple[str, ...]
    routers: tuple[str, ...]


def options(hwdb_dirs: tuple[str, ...] = ()) -> Options:
    db = hwdb.load(hwdb_dirs)
    fabrics = tuple(sorted(n for n, ln in db.links.items() if ln.kind not in ("nvlink", "pcie", "xgmi")))
    return Options(models=tuple(sorted(db.models)), gpus=tuple(sorted(db.gpus)), fabrics=fabrics,
                   connectors=tuple(sorted(db.connectors)), engines=tuple(sorted(db.engines)),
                   routers=tuple(sorted(ROUTERS)))


def canonical_gpu(name: str, hwdb_dirs: tuple[str, ...] = ()) -> str:
    """The database's name for a GPU name or alias (``H100`` -> ``H100-SXM-80GB``); unchanged if unknown."""
    try:
        return hwdb.load(hwdb_dirs).gpu(name).name
    except hwdb.HwdbError:
        return name


def layout(d: dict) -> str:
    return "pd" if len(d.get("pools") or []) == 2 else "colocated"


def with_layout(d: dict, mode: str) -> dict:
    """Switch between one colocated pool and a prefill + decode pair with the same GPUs in total.

    Colocated -> PD splits the instances (at least one each; prefill gets the smaller half);
    PD -> colocated sums them.  GPU type, TP and engine arguments carry over.
    """
    if mode not in LAYOUTS:
        raise ValueError(f"layout {mode!r}: choose one of {LAYOUTS}")
    out = copy.deepcopy(d)
    pools = out["pools"]
    if mode == layout(out):
        return out
    if mode == "pd":
        base = pools[0]
        n = int(base.get("instances", 1))
        pre = max(1, n // 2)
        dec = max(1, n - pre)
        out["pools"] = [{**copy.deepcopy(base), "name": "prefill", "role": "prefill", "instances": pre},
                        {**copy.deepcopy(base), "name": "decode", "role": "decode", "instances": dec}]
    else:
        base = next(p for p in pools if p.get("role") == "decode")
        n = sum(int(p.get("instances", 1)) for p in pools)
        out["pools"] = [{**copy.deepcopy(base), "name": "main", "role": "colocated", "instances": n}]
        out.pop("kv_transfer", None)
    return out


def set_pool(d: dict, index: int, **values) -> dict:
    """Set pool fields (gpu, tp, instances, router) and engine arguments (keys of EngineConfig).

    ``None`` removes an engine argument (vLLM's default applies).
    """
    engine_keys = {"engine", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
                   "enable_prefix_caching", "enable_chunked_prefill", "block_size", "max_model_len"}
    out = copy.deepcopy(d)
    pool = out["pools"][index]
    for k, v in values.items():
        if k in engine_keys:
            eng = pool.setdefault("engine", {})
            if v is None:
                eng.pop(k, None)
            else:
                eng[k] = v
        else:
            pool[k] = v
    return out


def set_workload(d: dict, *, rate: float | None = None, input_mean: float | None = None,
                 output_mean: float | None = None, num_requests: int | None = None) -> dict:
    """Poisson rate (req/s), mean input/output lengths (tokens, lognormal) and request count."""
    out = copy.deepcopy(d)
    w = out.setdefault("workload", {})
    if rate is not None:
        arr = w.get("arrival") or {}
        if arr.get("kind") in ("poisson", "gamma", None):
            w["arrival"] = {**arr, "kind": arr.get("kind", "poisson"), "rate": float(rate)}
        elif arr.get("kind") == "trace":
            w["arrival"] = {**arr, "rate": float(rate)}
            w["arrival"].pop("time_scale", None)
    for key, mean in (("input_length", input_mean), ("output_length", output_mean)):
        if mean is None:
            continue
        dist = w.get(key) or {}
        if dist.get("kind") == "lognormal":
            w[key] = {**dist, "mean": float(mean)}
        elif dist.get("kind") == "fixed":
            w[key] = {**dist, "value": int(mean)}
        elif w.get("arrival", {}).get("kind") != "trace":
            w[key] = {"kind": "lognormal", "mean": float(mean), "cv": 1.0, "low": 1,
                      "high": max(int(mean) * 16, 16)}
    if num_requests is not None:
        w["num_requests"] = int(num_requests)
    return out


def workload_means(d: dict) -> tuple[float | None, float | None, float | None]:
    """(rate, mean input, mean output) the builder can show; None where the workload has no such knob."""
    w = d.get("workload") or {}
    arr = w.get("arrival") or {}
    rate = arr.get("rate")

    def mean(dist):
        if not dist:
            return None
        return dist.get("mean") if dist.get("kind") == "lognormal" else dist.get("value")
    return rate, mean(w.get("input_length")), mean(w.get("output_length"))


def set_kv_transfer(d: dict, **values) -> dict:
    """PD only: connector, fabric (a scale-out link), same_node, bandwidth_factor."""
    out = copy.deepcopy(d)
    kv = out.setdefault("kv_transfer", {})
    for k, v in values.items():
        if v is None:
            kv.pop(k, None)
        else:
            kv[k] = v
    return out


def set_slo(d: dict, ttft_s: float | None, tpot_s: float | None) -> dict:
    out = copy.deepcopy(d)
    slo = out.setdefault("slo", {})
    for k, v in (("ttft_s", ttft_s), ("tpot_s", tpot_s)):
        if v is None or v <= 0:
            slo.pop(k, None)
        else:
            slo[k] = float(v)
    return out
