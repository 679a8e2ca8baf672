"""Tables and detail views of the hardware database, as plain data.

Pure functions over a :class:`hwdb.HardwareDB`: no printing, no styling.  The
CLI (or the app) renders the rows.  Row values are in display units named by
the key's suffix (``_GiB``, ``_TBps``, ``_GBps``, ``_TFLOPS``, ``_us``,
``_B`` for billions); :func:`describe` returns full SI figures with their
sources.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from hwdb.db import HardwareDB, HwdbError, ModelEntry
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


def _tflops(g: GPU, dtype: str) -> float | None:
    fig = g.peak_flops.get(dtype)
    return None if fig is None else _r(fig.value / 1e12, 1)


def gpu_rows(db: HardwareDB) -> list[dict[str, Any]]:
    """One row per GPU, sorted by name (aliases, links' figures and sources: see :func:`describe`)."""
    rows = []
    for g in sorted(db.gpus.values(), key=lambda g: g.name):
        rows.append({
            "name": g.name,
            "vendor": g.vendor,
            "memory_GiB": _r(g.memory_bytes.value / 2**30, 1),
            "memory_bandwidth_TBps": _r(g.memory_bandwidth_Bps.value / 1e12, 3),
            "bf16_TFLOPS": _tflops(g, "bf16") or _tflops(g, "fp16"),
            "fp8_TFLOPS": _tflops(g, "fp8"),
            "fp4_TFLOPS": _tflops(g, "fp4"),
            "intra_node_link": g.intra_node_link,
            "scale_out_link": g.scale_out_link,
            "gpus_per_node": g.gpus_per_node,
            "power_W": _r(g.power_W.value, 0),
            "price_usd_per_hour": _r(g.price_usd_per_hour.value, 2),
        })
    return rows


def link_rows(db: HardwareDB) -> list[dict[str, Any]]:
    """One row per link, sorted by kind then bandwidth."""
    rows = []
    for link in sorted(db.links.values(), key=lambda x: (x.kind, x.bandwidth_Bps.value, x.name)):
        rows.append({
            "name": link.name,
            "kind": link.kind,
            "bandwidth_GBps": _r(link.bandwidth_Bps.value / 1e9, 3),
            "efficiency": _r(link.efficiency.value, 3),
            "effective_GBps": _r(link.effective_Bps / 1e9, 3),
            "latency_us": _r(link.latency_s.value * 1e6, 2),
            "gpu_direct": link.gpu_direct,
            "cpu_ns_per_byte": _r(link.cpu_cost_s_per_byte.value * 1e9, 4),
        })
    return rows


def _kv_bytes_per_token(a: ModelArch, dtype: str = "bf16") -> int:
    return int(a.kv_elems_per_token * DTYPE_BYTES[dtype])


def model_rows(db: HardwareDB) -> list[dict[str, Any]]:
    """One row per model, sorted by name; parameter counts in billions (language model only).

    ``moe`` is ``False`` for dense models, else a short label such as ``"256e top-8 +1s"``
    (routed experts, experts per token, shared experts).
    """
    rows = []
    for m in sorted(db.models.values(), key=lambda m: m.name):
        a = m.arch
        rows.append({
            "name": m.name,
            "params_B": _r(a.total_params / 1e9, 2),
            "active_params_B": _r(a.active_params / 1e9, 2),
            "layers": a.num_layers,
            "kv_heads": a.num_kv_heads,
            "kv_bytes_per_token_bf16": _kv_bytes_per_token(a, "bf16"),
            "moe": (f"{a.num_experts}e top-{a.experts_per_token}"
                    f"{f' +{a.num_shared_experts}s' if a.num_shared_experts else ''}" if a.is_moe else False),
            "mla": a.is_mla,
            "vision": m.sidecar.vision is not None,
            "max_context": a.max_position_embeddings or None,
        })
    return rows


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
                "scale_out": (db.link(g.scale_out_link).model_dump(mode="json")
                              if g.scale_out_link else None),
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
            "used_by_gpus": sorted(g.name for g in db.gpus.values()
                                   if link.name in (g.intra_node_link, g.scale_out_link)),
            "empirical_fields": _empirical_fields(link),
        }
    if k == "model":
        return _describe_model(db.model(name))
    raise HwdbError(f"unknown kind '{kind}'. Known kinds: {', '.join(KINDS)}")
