"""Tables and detail views of the hardware database, as plain data.

Pure functions over a :class:`hwdb.HardwareDB`: no printing, no styling.  The
CLI (or the app) renders the rows.  Records (``gpu_records``, ...) hold full SI
figures named with their unit (``_bytes``, ``_Bps`` bytes/s, ``_FLOPS`` FLOP/s,
``_s``); rows (``gpu_rows``, ...) are the same columns in display units named by
the key's suffix (``_GiB``, ``_TBps``, ``_GBps``, ``_TFLOPS``, ``_us``, ``_B``
for billions), rounded (:data:`TABLE_COLUMNS`); :func:`describe` returns full
SI figures with their sources.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hwdb.db import HardwareDB, ModelEntry
from hwdb.files import HwdbError
from hwdb.models import ModelArch
from hwdb.schema import DTYPE_BYTES, GPU, EfficiencyCurve, Figure, Link

KINDS = ("gpu", "link", "model")


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


def _empirical_fields(item: GPU | Link) -> list[str]:
    """Names of the figures of ``item`` that are flagged ``empirical: true``."""
    out = []
    for field in type(item).model_fields:
        val = getattr(item, field)
        if isinstance(val, (Figure, EfficiencyCurve)) and val.empirical:
            out.append(field)
        elif isinstance(val, dict):
            out += [f"{field}.{k}" for k, v in val.items() if isinstance(v, Figure) and v.empirical]
    return out


def _flops(g: GPU, dtype: str) -> float | None:
    fig = g.peak_flops.get(dtype)
    return None if fig is None else float(fig.value)


def _per(unit: float):
    return lambda v: None if v is None else v / unit


def _times(factor: float):
    return lambda v: None if v is None else v * factor


# How a table shows a record's column: (table column, conversion from SI, decimals kept).  Columns not
# listed are shown as they are.  The table's column names carry its display units; a record's carry SI.
TABLE_COLUMNS: dict[str, tuple[str, Any, int | None]] = {
    "memory_bytes": ("memory_GiB", _per(2**30), 1),
    "memory_bandwidth_Bps": ("memory_bandwidth_TBps", _per(1e12), 3),
    "bf16_FLOPS": ("bf16_TFLOPS", _per(1e12), 1),
    "fp8_FLOPS": ("fp8_TFLOPS", _per(1e12), 1),
    "fp4_FLOPS": ("fp4_TFLOPS", _per(1e12), 1),
    "power_W": ("power_W", None, 0),
    "price_usd_per_hour": ("price_usd_per_hour", None, 2),
    "bandwidth_Bps": ("bandwidth_GBps", _per(1e9), 3),
    "efficiency": ("efficiency", None, 3),
    "effective_Bps": ("effective_GBps", _per(1e9), 3),
    "latency_s": ("latency_us", _times(1e6), 2),
    "cpu_s_per_byte": ("cpu_ns_per_byte", _times(1e9), 4),
    "params": ("params_B", _per(1e9), 2),
    "active_params": ("active_params_B", _per(1e9), 2),
    "moe": ("moe", lambda v: v or False, None),
}


def table_row(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` (SI units) as a table row: display units, rounded, named by :data:`TABLE_COLUMNS`."""
    out = {}
    for key, value in record.items():
        name, convert, decimals = TABLE_COLUMNS.get(key, (key, None, None))
        if convert is not None:
            value = convert(value)
        out[name] = value if decimals is None else _r(value, decimals)
    return out


def gpu_records(db: HardwareDB) -> list[dict[str, Any]]:
    """One record per GPU, sorted by name, in SI units: ``memory_bytes`` (bytes), ``memory_bandwidth_Bps``
    (bytes/s), ``bf16_FLOPS``, ``fp8_FLOPS``, ``fp4_FLOPS`` (dense FLOP/s; bf16 is fp16's where the GPU
    lists no bf16; None: no tensor cores for that format), ``power_W`` (W), ``price_usd_per_hour``
    (US dollars per GPU-hour), the links by name and ``gpus_per_node``."""
    return [
        {
            "name": g.name,
            "vendor": g.vendor,
            "memory_bytes": float(g.memory_bytes.value),
            "memory_bandwidth_Bps": float(g.memory_bandwidth_Bps.value),
            "bf16_FLOPS": _flops(g, "bf16") or _flops(g, "fp16"),
            "fp8_FLOPS": _flops(g, "fp8"),
            "fp4_FLOPS": _flops(g, "fp4"),
            "intra_node_link": g.intra_node_link,
            "scale_out_link": g.scale_out_link,
            "gpus_per_node": g.gpus_per_node,
            "power_W": float(g.power_W.value),
            "price_usd_per_hour": float(g.price_usd_per_hour.value),
        }
        for g in sorted(db.gpus.values(), key=lambda g: g.name)
    ]


def gpu_rows(db: HardwareDB) -> list[dict[str, Any]]:
    """One row per GPU, sorted by name (aliases, links' figures and sources: see :func:`describe`)."""
    return [table_row(r) for r in gpu_records(db)]


def link_records(db: HardwareDB) -> list[dict[str, Any]]:
    """One record per link, sorted by kind then bandwidth, in SI units: ``bandwidth_Bps`` (bytes/s per
    direction), ``efficiency`` (fraction), ``effective_Bps`` (their product), ``latency_s`` (s),
    ``gpu_direct``, ``cpu_s_per_byte`` (CPU seconds per byte moved through the host)."""
    return [
        {
            "name": link.name,
            "kind": link.kind,
            "bandwidth_Bps": float(link.bandwidth_Bps.value),
            "efficiency": float(link.efficiency.value),
            "effective_Bps": float(link.effective_Bps),
            "latency_s": float(link.latency_s.value),
            "gpu_direct": link.gpu_direct,
            "cpu_s_per_byte": float(link.cpu_cost_s_per_byte.value),
        }
        for link in sorted(db.links.values(), key=lambda x: (x.kind, x.bandwidth_Bps.value, x.name))
    ]


def link_rows(db: HardwareDB) -> list[dict[str, Any]]:
    """One row per link, sorted by kind then bandwidth."""
    return [table_row(r) for r in link_records(db)]


def _kv_bytes_per_token(a: ModelArch, dtype: str = "bf16") -> int:
    return int(a.kv_elems_per_token * DTYPE_BYTES[dtype])


def model_records(db: HardwareDB) -> list[dict[str, Any]]:
    """One record per model, sorted by name: ``params`` and ``active_params`` (parameters of the language
    model), ``layers``, ``kv_heads``, ``kv_bytes_per_token_bf16`` (bytes of KV cache per token, all
    layers, bf16), ``moe`` (None for a dense model, else e.g. ``"256e top-8 +1s"``: routed experts,
    experts per token, shared experts), ``mla``, ``vision``, ``max_context`` (tokens; None: unknown)."""
    rows = []
    for m in sorted(db.models.values(), key=lambda m: m.name):
        a = m.arch
        rows.append(
            {
                "name": m.name,
                "params": a.total_params,
                "active_params": a.active_params,
                "layers": a.num_layers,
                "kv_heads": a.num_kv_heads,
                "kv_bytes_per_token_bf16": _kv_bytes_per_token(a, "bf16"),
                "moe": (
                    f"{a.num_experts}e top-{a.experts_per_token}"
                    f"{f' +{a.num_shared_experts}s' if a.num_shared_experts else ''}"
                    if a.is_moe
                    else None
                ),
                "mla": a.is_mla,
                "vision": m.sidecar.vision is not None,
                "max_context": a.max_position_embeddings or None,
            }
        )
    return rows


def model_rows(db: HardwareDB) -> list[dict[str, Any]]:
    """One row per model, sorted by name; parameter counts in billions (language model only).

    ``moe`` is ``False`` for dense models, else a short label such as ``"256e top-8 +1s"``
    (routed experts, experts per token, shared experts).
    """
    return [table_row(r) for r in model_records(db)]


def _arch_dict(a: ModelArch) -> dict[str, Any]:
    out = dataclasses.asdict(a)
    out["derived"] = {
        "total_params": a.total_params,
        "active_params": a.active_params,
        "linear_params_per_token": a.linear_params_per_token,
        "embedding_params": a.embedding_params,
        "lm_head_params": a.lm_head_params,
        "attn_params_per_layer": a.attn_params_per_layer,
        "kv_elems_per_token": a.kv_elems_per_token,
        "kv_bytes_per_token": {d: _kv_bytes_per_token(a, d) for d in ("bf16", "fp8")},
        "is_moe": a.is_moe,
        "is_mla": a.is_mla,
        "moe_layers": a.moe_layers,
    }
    return out


def _describe_model(m: ModelEntry) -> dict[str, Any]:
    return {
        "kind": "model",
        "name": m.name,
        "path": str(m.path),
        "sidecar": m.sidecar.model_dump(mode="json"),
        "source": m.sidecar.source,
        "architecture": _arch_dict(m.arch),
        "config": m.config,
    }


def describe(db: HardwareDB, kind: str, name: str) -> dict[str, Any]:
    """Everything about one GPU, link or model (by name or alias), with the sources of its figures.

    Raises :class:`hwdb.HwdbError` for an unknown kind or name.
    """
    k = kind.lower().rstrip("s")
    if k == "gpu":
        g = db.gpu(name)
        prof = db.profile_for(g.name)
        return {
            "kind": "gpu",
            **g.model_dump(mode="json"),
            "links": {
                "intra_node": db.link(g.intra_node_link).model_dump(mode="json"),
                "scale_out": (db.link(g.scale_out_link).model_dump(mode="json") if g.scale_out_link else None),
            },
            "calibration_profile": prof.model_dump(mode="json") if prof else None,
            "empirical_fields": _empirical_fields(g),
        }
    if k == "link":
        link = db.link(name)
        return {
            "kind": "link",
            **link.model_dump(mode="json"),
            "effective_Bps": link.effective_Bps,
            "used_by_gpus": sorted(
                g.name for g in db.gpus.values() if link.name in (g.intra_node_link, g.scale_out_link)
            ),
            "empirical_fields": _empirical_fields(link),
        }
    if k == "model":
        return _describe_model(db.model(name))
    raise HwdbError(f"unknown kind '{kind}'. Known kinds: {', '.join(KINDS)}")
