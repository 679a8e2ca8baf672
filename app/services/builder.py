"""The scenario builder's operations on a scenario dict (pure functions, no Streamlit).

The builder page shows widgets initialised from a scenario dict and writes them back with
these functions; each returns a new dict and leaves its input untouched.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import get_args

import hwdb
from simulator.routing import ROUTERS
from simulator.scenario import PoolConfig

LAYOUTS = ("colocated", "pd", "e+colocated", "e+p+d")
LAYOUT_LABELS = {
    "colocated": "colocated",
    "pd": "prefill/decode (PD)",
    "e+colocated": "encoder + colocated (E+PD)",
    "e+p+d": "encoder + prefill + decode (E+P+D)",
}


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
    return Options(
        models=tuple(sorted(db.models)),
        gpus=tuple(sorted(db.gpus)),
        fabrics=fabrics,
        connectors=tuple(sorted(db.connectors)),
        engines=tuple(sorted(db.engines)),
        routers=tuple(sorted(ROUTERS)),
    )


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
        lm = [
            {**copy.deepcopy(base), "name": "prefill", "role": "prefill", "instances": pre},
            {**copy.deepcopy(base), "name": "decode", "role": "decode", "instances": dec},
        ]
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
        w["images"] = {
            **(w.get("images") or {}),
            "count": {"kind": "fixed", "value": int(count)},
            "resolutions": [{"width": int(width), "height": int(height)}],
        }
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


POOL_DEFAULTS = {("dtype", "bf16"), ("pp", 1), ("dp", 1), ("ep", 1), ("kv_cache_dtype", "auto")}
DTYPES = ("bf16", "fp8", "fp4", "int4", "fp16")  # weights: fp8 halves them (and needs a GPU with FP8)
# The KV cache's format: auto is the engine's choice for the weights (docs/validation/memory.md); fp8 halves it.
KV_DTYPES = get_args(PoolConfig.model_fields["kv_cache_dtype"].annotation)


def set_pool(d: dict, index: int, **values) -> dict:
    """Set pool fields (gpu, tp, pp, dp, ep, instances, dtype, kv_cache_dtype, router) and engine arguments
    (keys of EngineConfig).

    ``None`` removes an engine argument (vLLM's default applies); a field set to its default (bf16
    weights, PP, DP and EP 1, KV cache auto) is removed, so that a scenario edited back to what it was compares
    equal to it.
    """
    engine_keys = {
        "engine",
        "max_num_seqs",
        "max_num_batched_tokens",
        "gpu_memory_utilization",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "block_size",
        "max_model_len",
    }
    out = copy.deepcopy(d)
    pool = out["pools"][index]
    for k, v in values.items():
        if (k, v) in POOL_DEFAULTS:  # the schema's default: not written, so the dict stays as loaded
            pool.pop(k, None)
        elif k in engine_keys:
            eng = pool.setdefault("engine", {})
            if v is None:
                eng.pop(k, None)
            else:
                eng[k] = v
        else:
            pool[k] = v
    return out


def set_workload(
    d: dict,
    *,
    rate: float | None = None,
    input_mean: float | None = None,
    output_mean: float | None = None,
    num_requests: int | None = None,
) -> dict:
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
            w[key] = {"kind": "lognormal", "mean": float(mean), "cv": 1.0, "low": 1, "high": max(int(mean) * 16, 16)}
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


ARRIVALS = ("poisson", "gamma", "closed")
ARRIVAL_LABELS = {
    "poisson": "Poisson (open loop)",
    "gamma": "bursty (gamma gaps, open loop)",
    "closed": "closed loop (fixed number of users)",
}


def arrival(d: dict) -> dict:
    """The scenario's arrival process (a dict with ``kind``)."""
    return dict((d.get("workload") or {}).get("arrival") or {})


def set_arrival(
    d: dict,
    kind: str,
    *,
    rate: float | None = None,
    cv: float | None = None,
    concurrency: int | None = None,
    think_time_s: float | None = None,
) -> dict:
    """Switch the arrival process to ``kind`` (one of :data:`ARRIVALS`) keeping what carries over: the
    rate between Poisson and gamma, the request count and the lengths.  Switching from a closed loop to
    an open one needs ``rate``; to a closed loop, ``concurrency`` (default 16 users)."""
    if kind not in ARRIVALS:
        raise ValueError(f"arrival {kind!r}: choose one of {ARRIVALS}")
    out = copy.deepcopy(d)
    w = out.setdefault("workload", {})
    cur = w.get("arrival") or {}
    if kind in ("poisson", "gamma"):
        r = float(rate if rate is not None else cur.get("rate") or 10.0)
        new = {"kind": kind, "rate": r}
        if kind == "gamma":
            new["cv"] = float(cv if cv is not None else cur.get("cv", 2.0))
    else:
        new = {"kind": "closed", "concurrency": int(concurrency or cur.get("concurrency") or 16)}
        t = think_time_s if think_time_s is not None else cur.get("think_time_s")
        if t:
            new["think_time_s"] = float(t)
        if w.get("num_requests") is None:
            w["num_requests"] = 1000
    w["arrival"] = new
    return out


def set_seed(d: dict, seed: int) -> dict:
    """The run's seed: the same seed gives the same requests and the same results."""
    return {**copy.deepcopy(d), "seed": int(seed)}


def core(d: dict) -> dict:
    """``d`` without its name, description and hardware folders: what the user edits of a run."""
    return {k: v for k, v in d.items() if k not in ("name", "description", "hwdb")}


def _arrival_text(d: dict) -> str:
    a = arrival(d)
    kind = a.get("kind")
    if kind == "poisson":
        return f"Poisson {a.get('rate', 0):g} req/s"
    if kind == "gamma":
        return f"bursty {a.get('rate', 0):g} req/s (cv {a.get('cv', 1):g})"
    if kind == "closed":
        return f"closed loop, {a.get('concurrency')} users"
    if kind == "trace":
        return f"trace {str(a.get('path', '')).rsplit('/', 1)[-1]}"
    return str(kind or "no arrivals")


def auto_label(d: dict) -> tuple[str, str]:
    """(name, description) that say what scenario ``d`` is: model, pools, load, lengths.

    The builder gives an edited scenario these unless the user typed a name or description, so that
    charts, reports and saved files never carry the label of the scenario it was edited from."""
    model = str(d.get("model", "model")).rstrip("/").rsplit("/", 1)[-1]
    pools = list(d.get("pools") or [])

    def pool_text(p, sep):
        extra = "".join(f"{sep}{k}{p[k]}" for k in ("pp", "dp", "ep") if p.get(k, 1) != 1)
        dt = f"{sep}{p['dtype']}" if p.get("dtype", "bf16") != "bf16" else ""
        return f"{p.get('instances', 1)}x{' ' if sep == ' ' else ''}{p['gpu']}{sep}TP{p.get('tp', 1)}{extra}{dt}"

    name = "-".join([model, *(pool_text(p, "-") for p in pools)]).replace(" ", "")
    wl = d.get("workload") or {}
    rate, inp, out = workload_means(d)
    parts = [
        f"{model}, " + " + ".join(f"{pool_text(p, ' ')} {p.get('role', 'colocated')}" for p in pools),
        _arrival_text(d),
    ]
    if wl.get("num_requests"):
        parts.append(f"{wl['num_requests']:,} requests")
    if inp is not None and out is not None:
        parts.append(f"~{inp:g} prompt / ~{out:g} output tokens")
    n_img = images(d)[0]
    if n_img:
        parts.append(f"{n_img} image(s) per request")
    return name, ", ".join(parts)
