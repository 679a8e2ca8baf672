"""Fit of the cold-start coefficients to the vllm-startup-profiler CSVs, and the per-row check of
the formulas in :mod:`simulator.ops.coldstart` against them (``docs/operations.md`` gives the figures).

``fit_profiler_csvs`` regenerates the numbers in ``hwdb/data/coldstart/``; ``check_profiler_rows``
puts each measured start-up beside the breakdown's phase formulas.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hwdb.coldstart import StartupCoefficients, load_coldstart
from simulator.ops.coldstart_formulas import (
    capture_seconds,
    capture_sizes,
    compile_seconds,
    dynamo_seconds,
    kv_profile_seconds,
    weights_seconds,
)

FIG10 = "vllm_startup_profiler_fig10_gpu0_uncached.csv"
A100 = "vllm_startup_profiler_A100_batch_size_avg.csv"
FIG10_CAPTURE_MAX = 256  # the fig10 run logs' compilation_config: 35 sizes, 1..256


def _read_csv(path: Path) -> list[dict]:
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    return list(csv.DictReader(lines))


def _short(model: str) -> str:
    return model.split("(")[0]


def _lstsq(rows: list[str], X: list[list[float]], y: list[float], names: list[str]) -> dict:
    A, b = np.asarray(X, float), np.asarray(y, float)
    coef, *_ = np.linalg.lstsq(A, b, rcond=None)
    coef = np.array([float(f"{c:.6g}") for c in coef])  # what the YAML keeps
    pred = A @ coef
    res = b - pred
    return {
        "coefficients": {n: float(c) for n, c in zip(names, coef, strict=True)},  # a name per column of X
        "rows": [
            {
                "row": r,
                "observed_s": round(float(o), 4),
                "predicted_s": round(float(p), 4),
                "residual_s": round(float(e), 4),
            }
            for r, o, p, e in zip(rows, b, pred, res, strict=True)
        ],
        "rms_s": round(float(np.sqrt(np.mean(res**2))), 4),
        "max_abs_s": round(float(np.max(np.abs(res))), 4),
    }


def fit_profiler_csvs(folder: str | Path, coef: StartupCoefficients | None = None) -> dict[str, dict]:
    """Least-squares fits of every fitted phase to the two vllm-startup-profiler CSVs in ``folder``.

    Returns ``{phase: {coefficients, rows, rms_s, max_abs_s}}`` as stored in
    ``vllm-v1.yaml``'s ``fits``.  Model sizes and layers come from the file's
    ``profiled_models``, host peaks from ``profiled_hosts``.
    """
    folder = Path(folder)
    coef = coef or load_coldstart().coefficients("vllm-v1")
    models = coef.profiled_models
    u = _read_csv(folder / FIG10)
    a = _read_csv(folder / A100)

    def P(r):
        return models[_short(r["model"])].params

    def L(r):
        return models[_short(r["model"])].layers

    def B(r):
        m = models[_short(r["model"])]
        return m.params * m.checkpoint_bytes_per_param

    def f(r, k):
        return float(r[k]) if r.get(k) not in (None, "") else 0.0

    miss = [r for r in u if r["graph_compile_general_shape_s"]]
    hit = [r for r in u if not r["graph_compile_general_shape_s"]]
    name = [_short(r["model"]) for r in u]
    out: dict[str, dict] = {}
    # weights: fig10 host's storage (qwen-0.5b excluded, see the YAML), A100 host's page cache
    w = [r for r in u if _short(r["model"]) != "qwen-0.5b"]
    fit = _lstsq([_short(r["model"]) for r in w], [[B(r)] for r in w], [f(r, "load_weights_s") for r in w], ["inv"])
    inv = fit["coefficients"].pop("inv")
    fit["coefficients"]["storage_Bps"] = float(f"{1 / inv:.6g}")
    out["weights_storage"] = fit
    fit = _lstsq(
        [f"{r['model']} cg{r['cuda_graph_sizes']}" for r in a],
        [[B(r)] for r in a],
        [f(r, "load_weights_s") for r in a],
        ["inv"],
    )
    inv = fit["coefficients"].pop("inv")
    fit["coefficients"]["loader_Bps"] = float(f"{1 / inv:.6g}")
    out["weights_page_cache"] = fit
    out["dynamo"] = _lstsq(
        name, [[1, L(r)] for r in u], [f(r, "dynamo_transform_s") for r in u], ["d0_s", "d1_s_per_layer"]
    )
    out["compile_miss"] = _lstsq(
        [_short(r["model"]) for r in miss],
        [[1, L(r)] for r in miss],
        [f(r, "graph_compile_general_shape_s") for r in miss],
        ["c0_s", "c1_s_per_layer"],
    )
    out["compile_hit"] = _lstsq(
        [_short(r["model"]) for r in hit],
        [[L(r)] for r in hit],
        [f(r, "graph_compile_cached_s") for r in hit],
        ["h1_s_per_layer"],
    )
    out["kv_profile"] = _lstsq(
        name,
        [[1, L(r) if r in miss else 0, 0 if r in miss else L(r)] for r in u],
        [f(r, "kv_cache_profiling_s") for r in u],
        ["k0_s", "k_miss_s_per_layer", "k_hit_s_per_layer"],
    )
    # capture: A100 sweep of cuda_graph_sizes (vLLM 0.10 rule) + fig10 rows (35 sizes), PIECEWISE
    rows, X, y = [], [], []
    a100_peak = coef.profiled_hosts["A100"].peak_flops.value
    n1_peak = coef.profiled_hosts["n1"].peak_flops.value
    for r in a:
        s = capture_sizes(int(r["cuda_graph_sizes"]), None, "0.10")
        rows.append(f"{r['model']} cg{r['cuda_graph_sizes']}")
        X.append([1, len(s) * L(r), sum(s) * 2 * P(r) / a100_peak])
        y.append(f(r, "graph_capturing_s"))
    for r in u:
        s = capture_sizes(FIG10_CAPTURE_MAX, None, "0.10")
        rows.append(_short(r["model"]))
        X.append([1, len(s) * L(r), sum(s) * 2 * P(r) / n1_peak])
        y.append(f(r, "graph_capturing_s"))
    out["cuda_graphs"] = _lstsq(rows, X, y, ["g0_s", "g1_s_per_graph_layer", "g2_passes"])
    # constants: what the named phases leave of the measured total, and API start after the engine
    rest = [
        f(r, "total_time_s")
        - f(r, "load_weights_s")
        - f(r, "dynamo_transform_s")
        - f(r, "graph_compile_general_shape_s")
        - f(r, "graph_compile_cached_s")
        - f(r, "kv_cache_profiling_s")
        - f(r, "graph_capturing_s")
        for r in u
    ]
    out["process_start"] = _lstsq(name, [[1]] * len(u), rest, ["seconds"])
    out["api_ready"] = _lstsq(
        name, [[1]] * len(u), [f(r, "actual_total_time_s") - f(r, "total_time_s") for r in u], ["seconds"]
    )
    return out


@dataclass(frozen=True)
class RowCheck:
    """A profiled row re-predicted by the breakdown formulas."""

    row: str
    phase: str
    observed_s: float
    predicted_s: float

    @property
    def error_s(self) -> float:
        return self.predicted_s - self.observed_s


def check_profiler_rows(folder: str | Path, coef: StartupCoefficients | None = None) -> list[RowCheck]:
    """Predict every fig10 row's weights, Dynamo, compile and total with the breakdown's formulas.

    The storage rate is the fitted rate of the profiling host (its storage is
    not described); the total is process start + weights + Dynamo + compile +
    KV profiling + capture (35 sizes, PIECEWISE, as logged) + API start, and
    is compared with the profiler's ``actual_total_time_s``.
    """
    coef = coef or load_coldstart().coefficients("vllm-v1")
    u = _read_csv(Path(folder) / FIG10)
    storage = coef.coef("weights_storage", "storage_Bps")
    loader = coef.coef("weights_page_cache", "loader_Bps")
    peak = coef.profiled_hosts["n1"].peak_flops.value
    out = []
    for r in u:
        m = coef.profiled_models[_short(r["model"])]
        cache = "miss" if r["graph_compile_general_shape_s"] else "hit"
        sizes = capture_sizes(FIG10_CAPTURE_MAX, None, "0.10")
        t = {
            "weights": weights_seconds(m.params * m.checkpoint_bytes_per_param, 1, storage, 0.0, loader),
            "dynamo": dynamo_seconds(coef, m.layers),
            "compile": compile_seconds(coef, m.layers, cache),
            "kv_profile": kv_profile_seconds(coef, m.layers, cache),
            "cuda_graphs": capture_seconds(coef, len(sizes), sum(sizes), m.layers, m.params, peak),
        }
        total = coef.coef("process_start", "seconds") + sum(t.values()) + coef.coef("api_ready", "seconds")
        obs = {
            "weights": float(r["load_weights_s"]),
            "dynamo": float(r["dynamo_transform_s"]),
            "compile": float(r["graph_compile_general_shape_s"] or r["graph_compile_cached_s"]),
            "kv_profile": float(r["kv_cache_profiling_s"]),
            "cuda_graphs": float(r["graph_capturing_s"]),
        }
        for k in obs:
            out.append(RowCheck(_short(r["model"]), k, obs[k], t[k]))
        out.append(RowCheck(_short(r["model"]), "total", float(r["actual_total_time_s"]), total))
    return out
