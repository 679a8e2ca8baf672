"""Side-by-side comparison of scenarios: preset variants and a metrics table (no Streamlit).

A preset turns the current scenario into named variants (colocated vs PD with the same GPUs, plus
an encoder pool (E+PD) when requests carry images,
RDMA vs TCP for the KV transfer, engine generations vLLM V0 / V1 / SGLang); :func:`metrics_frame`
puts their headline metrics in one table with each row's best value and the change against
the first (baseline) column.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import pandas as pd

from app.services import builder
from app.services.scenarios import Prices, cost
from simulator import fmt
from simulator.confidence import error_bands, with_band
from simulator.pd.connectors import HOST_STAGED_CONNECTOR, RDMA_CONNECTOR

if TYPE_CHECKING:
    from simulator.summary_types import RunSummary

ENGINES = ("vllm-v0", "vllm-v1", "sglang")
PRESETS = ("colocated vs PD vs EPD", "RDMA vs TCP (PD)", "engine generations")

# (label, getter, better): better is "low" or "high"; the getter reads (summary, cost dict).
METRICS: tuple[tuple[str, Callable[[RunSummary, dict], float], str], ...] = (
    ("TTFT p50 (s)", lambda s, c: s["ttft_s"]["p50"], "low"),
    ("TTFT p99 (s)", lambda s, c: s["ttft_s"]["p99"], "low"),
    ("TPOT p50 (s)", lambda s, c: s["tpot_s"]["p50"], "low"),
    ("TPOT p99 (s)", lambda s, c: s["tpot_s"]["p99"], "low"),
    ("ITL p99 (s)", lambda s, c: s["itl_s"]["p99"], "low"),
    ("E2E p50 (s)", lambda s, c: s["e2e_s"]["p50"], "low"),
    ("queue mean (s)", lambda s, c: s["queue_s"]["mean"], "low"),
    ("throughput (req/s)", lambda s, c: s["throughput_rps"], "high"),
    ("output tokens/s", lambda s, c: s["output_tokens_per_s"], "high"),
    ("output tokens/s per GPU", lambda s, c: s["output_tokens_per_s_per_gpu"], "high"),
    ("SLO attainment", lambda s, c: s["slo_attainment"], "high"),
    ("completed", lambda s, c: s["completed"], "high"),
    ("preemptions", lambda s, c: s["preemptions"], "low"),
    ("GPUs", lambda s, c: s["gpus"], "low"),
    ("cost $/h", lambda s, c: c["usd_per_hour"], "low"),
    ("cost $/M output tokens", lambda s, c: c["usd_per_million_output_tokens"], "low"),
)


def variants(d: dict, preset: str) -> dict[str, dict]:
    """Named scenario dicts for ``preset`` built from ``d`` (the first is the baseline)."""
    if preset == "colocated vs PD vs EPD":
        colo = builder.with_layout(d, "colocated")
        if sum(p.get("instances", 1) for p in colo["pools"]) < 2:
            colo = builder.set_pool(colo, 0, instances=2)
        out = {"colocated": _named(colo, "colocated"), "PD": _named(builder.with_layout(colo, "pd"), "PD")}
        if (d.get("workload") or {}).get("images") and builder.has_vision(d["model"]):
            # The scenario's own encoder pool when it has one, else one TP1 encoder on the same GPU type.
            enc = (
                builder.with_layout(d, "e+colocated")
                if builder.layout(d).startswith("e+")
                else builder.with_layout(colo, "e+colocated")
            )
            out["E+PD"] = _named(enc, "EPD")
        return out
    if preset == "RDMA vs TCP (PD)":
        base = builder.with_layout(d, "pd")
        rdma = builder.set_kv_transfer(base, connector=RDMA_CONNECTOR, fabric="ib-ndr", same_node=False)
        tcp = builder.set_kv_transfer(base, connector=HOST_STAGED_CONNECTOR, fabric="tcp-10gbe", same_node=False)
        return {"RDMA (NIXL, IB NDR)": _named(rdma, "rdma"), "TCP (10 GbE, host-staged)": _named(tcp, "tcp")}
    if preset == "engine generations":
        out = {}
        for eng in ENGINES:
            v = d
            for i in range(len(d["pools"])):
                v = builder.set_pool(v, i, engine=eng)
            out[eng] = _named(v, eng)
        return out
    raise ValueError(f"preset {preset!r}: choose one of {PRESETS}")


def with_current(pinned: dict[str, dict], current: dict) -> dict[str, dict]:
    """The pinned scenarios, then the current one (named "current: NAME"), unless it is one of them
    unchanged."""
    out = dict(pinned)
    if not any(builder.core(p) == builder.core(current) for p in pinned.values()):
        out[f"current: {current.get('name', 'scenario')}"] = current
    return out


def _named(d: dict, label: str) -> dict:
    return {**d, "name": f"{d.get('name', 'scenario')}-{label}"}


def metrics_frame(results: dict, prices: Prices | None = None) -> pd.DataFrame:
    """Rows: metrics; columns: one per scenario, then ``best`` (the winning scenarios' names joined by
    ", " when tied within :data:`REL_TIE`; empty when all tie) and ``better`` ("low"/"high").  Values are floats (NaN
    where undefined)."""
    cols = {}
    for name, res in results.items():
        c = cost(res, prices)
        cols[name] = [float(get(res.summary, c)) for _, get, _ in METRICS]
    df = pd.DataFrame(cols, index=[m[0] for m in METRICS])
    best = []
    for (_, _, better), (_, row) in zip(METRICS, df.iterrows(), strict=True):
        vals = row.dropna()
        vals = vals[vals.map(math.isfinite)]
        top = (vals.min() if better == "low" else vals.max()) if not vals.empty else 0.0
        win = [n for n, v in vals.items() if _same(v, top)]
        # no highlight when every run ties (within float noise): nothing to prefer
        best.append("" if vals.empty or len(win) == len(vals) else ", ".join(str(n) for n in win))
    df["best"] = best
    df["better"] = [m[2] for m in METRICS]
    return df


REL_TIE = 0.005  # values within 0.5% of the best tie with it: float noise is no reason to win


def _same(v: float, top: float) -> bool:
    return abs(v - top) <= REL_TIE * max(abs(v), abs(top), 1e-300)


def row_formatter(label: str):
    """How a :func:`metrics_frame` row reads (simulator.fmt): durations for "(s)" rows, a percentage for
    the attainment, whole counts, dollars."""
    if label.endswith("(s)"):
        return fmt.duration
    if label == "SLO attainment":
        return fmt.percent
    if label.startswith("cost"):
        return lambda x: fmt.usd(x, 3 if "/M" in label else 2)
    if label in ("completed", "preemptions", "GPUs"):
        return lambda x: fmt.number(x, 0)
    return lambda x: fmt.number(x, 2 if abs(x) < 100 else 0) if x == x else "-"


# The metrics rows that carry a model error band, by the figure whose band they take (simulator.confidence.BANDED).
BANDED_ROWS = {
    "TTFT p50 (s)": "ttft_s",
    "TTFT p99 (s)": "ttft_s",
    "TPOT p50 (s)": "tpot_s",
    "TPOT p99 (s)": "tpot_s",
    "E2E p50 (s)": "e2e_s",
}


def bands(results: dict) -> dict[str, dict[str, float | None]]:
    """Each scenario's relative model error band per banded figure (:func:`simulator.confidence.error_bands`)."""
    return {name: error_bands(res.info) for name, res in results.items()}


def cell_formatter(label: str, rel: dict[str, float | None] | None = None):
    """How one cell of a :func:`metrics_frame` row reads: :func:`row_formatter`'s text, and for a latency row
    the scenario's model error band after it ("173 ms (124–222)") when ``rel`` (its :func:`bands`) has one."""
    key = BANDED_ROWS.get(label)
    r = (rel or {}).get(key) if key else None
    if r is None:
        return row_formatter(label)
    return lambda x: with_band(x, r) if x == x else "-"


def relative_change(df: pd.DataFrame) -> pd.DataFrame:
    """Each scenario's change against the first column, as a fraction (0.1 = 10% higher)."""
    names = [c for c in df.columns if c not in ("best", "better")]
    base = df[names[0]]
    return df[names].apply(lambda col: (col - base) / base.where(base != 0))


def winners(row) -> list[str]:
    """The scenario names in a :func:`metrics_frame` row's ``best``."""
    return [n for n in str(row["best"]).split(", ") if n]
