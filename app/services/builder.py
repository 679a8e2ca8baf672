"""The scenario builder's operations on a scenario dict (pure functions, no Streamlit).

The builder page shows widgets initialised from a scenario dict and writes them back with
these functions; each returns a new dict and leaves its input untouched.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import hwdb
from simulator.routing import ROUTERS

LAYOUTS = ("colocated", "pd", "e+colocated", "e+p+d")
LAYOUT_LABELS = {"colocated": "colocated", "pd": "prefill/decode (PD)", "e+colocated": "encoder + colocated (E+PD)",
                 "e+p+d": "encoder + prefill + decode (E+P+D)"}


@dataclass(frozen=True)
class Options:
    """What the hardware database offers, for select boxes (names, sorted)."""

    models: tuple[str, ...]
    gpus: tuple[str, ...]
    fabrics: tuple[str, ...]
    connectors: tuple[str, ...]
    engines: tuple[str, ...]
    routers: tuple[str, ...]


def options(db: hwdb.HardwareDB | None = None) -> Options:
    db = db or hwdb.load()
    fabrics = tuple(sorted(n for n, ln in db.links.items() if ln.kind not in ("nvlink", "pcie", "xgmi")))
    return Options(models=tuple(sorted(db.models)), gpus=tuple(sorted(db.gpus)), fabrics=fabrics,
                   connectors=tuple(sorted(db.connectors)), engines=tuple(sorted(db.engines)),
                   routers=tuple(sorted(ROUTERS)))


def canonical_gpu(name: str, db: hwdb.HardwareDB | None = None) -> str:
    """The database's name for a GPU name or alias (``H100`` -> ``H100-SXM-80GB``); unchanged if unknown."""
    try:
        return (db or hwdb.load()).gpu(name).name
    except hwdb.HwdbError:
        return name


def _is_encoder(p: dict) -> bool:
    return p.get("role") == "encoder"


def layout(d: dict) -> str:
    """One of :data:`LAYOUTS` from the pools' roles."""
    pools = d.get("pools") or []
    lm = "pd" if sum(not _is_encoder(p) for p in pools) == 2 else "colocated"
    if any(_is_encoder(p) for p in pools):
        return "e+p+d" if lm == "pd" else "e+colocated"
    return lm


def has_vision(model: str, db: hwdb.HardwareDB | None = None) -> bool:
    """Whether the model has a vision encoder (requests may carry images)."""
    try:
        return bool((db or hwdb.load()).model(model).sidecar.vision)
    except hwdb.HwdbError:
        return False


def with_layout(d: dict, mode: str) -> dict:
    """Switch layouts keeping the language model's GPUs: colocated <-> prefill + decode, with or without
    an encoder pool (EPD).

    Colocated -> PD splits the instances (at least one each; prefill gets the smaller half);
    PD -> colocated sums them.  GPU type, TP and engine arguments carry over.  An encoder pool
    (added as one TP1 instance on the language model's GPU type) is kept across switches that keep
    an encoder, and dropped with ``embedding_transfer`` otherwise.
    """
    if mode not in LAYOUTS:
        raise ValueError(f"layout {mode!r}: choose one of {LAYOUTS}")
    out = copy.deepcopy(d)
    enc = [p for p in out["pools"] if _is_encoder(p)]
    lm = [p for p in out["pools"] if not _is_encoder(p)]
    want_pd = mode in ("pd", "e+p+d")
    if want_pd and len(lm) == 1:
        base = lm[0]
        n = int(base.get("instances", 1))
        pre = max(1, n // 2)
        dec = max(1, n - pre)
        lm = [{**copy.deepcopy(base), "name": "prefill", "role": "prefill", "instances": pre},
              {**copy.deepcopy(base), "name": "decode", "role": "decode", "instances": dec}]
    elif not want_pd and len(lm) == 2:
        base = next(p for p in lm if p.get("role") == "decode")
        n = sum(int(p.get("instances", 1)) for p in lm)
        lm = [{**copy.deepcopy(base), "name": "main", "role": "colocated", "instances": n}]
    if not want_pd:
        out.pop("kv_transfer", None)
    if mode.startswith("e+"):
        enc = enc or [{"name": "enc", "role": "encoder", "gpu": lm[0]["gpu"], "tp": 1, "instances": 1}]
    else:
        enc = []
        out.pop("embedding_transfer", None)
    out["pools"] = lm + enc
    return out


def set_images(d: dict, count: int, width: int = 1920, height: int = 1080) -> dict:
    """``count`` images of ``width`` x ``height`` pixels per request; 0 removes images (text only)."""
    out = copy.deepcopy(d)
    w = out.setdefault("workload", {})
    if count <= 0:
        w.pop("images", None)
    else:
        w["images"] = {**(w.get("images") or {}), "count": {"kind": "fixed", "value": int(count)},
                       "resolutions": [{"width": int(width), "height": int(height)}]}
    return out


def images(d: dict) -> tuple[int, int, int]:
    """(images per request, width, height) the builder can show; (0, 1920, 1080) for text only or
    for image settings it cannot edit (kept as they are)."""
    im = (d.get("workload") or {}).get("images") or {}
    c = im.get("count") or {}
    res = (im.get("resolutions") or [{}])[0]
    n = int(c.get("value", 0)) if c.get("kind") == "fixed" else 0
    return n, int(res.get("width", 1920)), int(res.get("height", 1080))


def set_embedding_transfer(d: dict, **values) -> dict:
    """EPD with an encoder pool: connector, fabric (a scale-out link), same_node."""
    out = copy.deepcopy(d)
    et = out.setdefault("embedding_transfer", {})
    for k, v in values.items():
        if v is None:
            et.pop(k, None)
        else:
            et[k] = v
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
