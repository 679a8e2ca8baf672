"""Fit the fused-MoE kernel curves (:class:`hwdb.moe.MoeCurve`) to measured routed-expert latencies.

Data: the ``moe/<engine>/<version>/moe_perf.parquet`` tables of aiconfigurator-core 0.12.0
(github ai-dynamo/aiconfigurator, Apache-2.0), ``../shared/data/kernels/aiconfigurator_0.12.0``:
one fused MoE layer's latency (ms) by tokens, hidden and expert width, experts, top-k, expert TP and
EP sizes, weight format and routing distribution, on H100/H200/B200/B300/GB200/GB300 for vLLM,
SGLang and TensorRT-LLM.

Per (GPU, engine release, weight format, layout class: tensor-parallel experts or expert parallel) the
seven coefficients of :class:`hwdb.moe.MoeCurve` are
fitted by robust least squares (soft-L1 on log-latency residuals) on the rows of the engine's main
kernel for that format (:func:`main_kernels`: the most measured lane, or TensorRT-LLM's fastest) with
**balanced** routing, the kernel's own cost; the power-law rows measure routing imbalance, reported beside the
fit as the ratio of the two (``imbalance``) and not folded into the curve.  Expert shapes
(hidden, expert width, experts, top-k) are the unit held out: every fourth shape is kept out of
the fit and scored alone; a format measured on fewer than four shapes is held out by token count
instead (said in its ``source``).  Run::

    python -m calibration.moe_fit [--kernels DIR] [--write]

``--write`` writes ``hwdb/data/moe_kernels/<GPU>_<engine>.yaml``, each format from the newest release of
the engine whose table measured it.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

import hwdb
from hwdb.moe import FORMATS, MoeCurve, MoeKernels
from hwdb.profiles import FitQuality

KERNELS = Path(__file__).resolve().parents[2] / "shared" / "data" / "kernels" / "aiconfigurator_0.12.0" / "data"
OUT = Path(__file__).resolve().parents[1] / "hwdb" / "data" / "moe_kernels"
SYSTEMS = {"h100_sxm": "H100-SXM-80GB", "h200_sxm": "H200-SXM-141GB", "b200_sxm": "B200-SXM-180GB",
           "b300_sxm": "B300-SXM", "gb200": "GB200", "gb300": "GB300"}
ENGINES = ("vllm", "sglang", "trtllm")
KEYS = ["num_tokens", "hidden_size", "inter_size", "num_experts", "topk", "moe_tp_size", "moe_ep_size"]
NAMES = ("max_eff", "half_rows", "half_nk", "mem_eff", "fixed_s", "act_passes", "per_expert_s")
# Start and bounds of the fitted vector (half_nk in millions of elements, times in microseconds: the
# solver's steps are then of one order).
X0 = [0.5, 4.0, 1.0, 0.7, 20.0, 1.0, 0.1]
LO = [0.01, 0.0, 0.0, 0.05, 0.0, 0.0, 0.0]
HI = [1.0, 1e4, 1e3, 1.5, 500.0, 50.0, 20.0]


def _version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in v.replace("rc", ".").replace("post", ".").split("."))


def _curve(x) -> MoeCurve:
    return MoeCurve.model_construct(**dict(zip(NAMES, (x[0], x[1], x[2] * 1e6, x[3], x[4] * 1e-6, x[5],
                                                         x[6] * 1e-6))))


def predict(x, cols: dict[str, np.ndarray], peak: float, wbytes: float, bw: float) -> np.ndarray:
    """Modelled latency (s) of every row for the fitted vector ``x`` (the form of :meth:`MoeCurve.time`)."""
    c = _curve(x)
    t, h, i, e, k, tp, ep = (cols[n] for n in KEYS)
    m = t * k / e
    s = h * i / tp
    eff = c.max_eff * m / (m + c.half_rows) * s / (s + c.half_nk)
    touched = e / ep * (1.0 - (1.0 - k / e) ** t)
    comp = 6.0 * t * k * h * i / (tp * ep) / (peak * eff)
    mem = touched * 3.0 * h * i / tp * wbytes / (bw * c.mem_eff)
    return c.fixed_s + np.maximum(comp, mem) + c.act_passes * t * k * h * 2.0 / bw + c.per_expert_s * touched


def _rel(pred, y):
    return np.abs(pred / y - 1.0)


# Engines that time their MoE backends and keep the fastest (TensorRT-LLM's fused-MoE autotuner over its
# CUTLASS, min-latency and non-gated paths): measured DeepSeek-R1 NVFP4 decodes on B200 at TP8 take 4.3 ms a
# token in all, less than 58 MoE layers of the CUTLASS lane alone (88 us each at 4 tokens; min-latency 25 us).
FASTEST = ("trtllm",)


def _fastest(part: pd.DataFrame) -> str:
    """The kernel with the lowest median latency relative to the most measured one, over the points each
    shares with it (the most measured one itself when no other is faster)."""
    piv = part.pivot_table(index=KEYS + ["distribution"], columns="kernel_source", values="latency")
    ref = part.kernel_source.value_counts().idxmax()
    ratio = piv.div(piv[ref], axis=0).median().dropna()
    return str(ratio.idxmin()) if len(ratio) else str(ref)


def main_kernels(rows: pd.DataFrame, engine: str = "vllm") -> pd.DataFrame:
    """The rows of the kernel an engine runs for a format: per layout class (expert parallel or not), the
    kernel the table measured most, which is the engine's default lane there, or for an engine of
    :data:`FASTEST` the fastest lane; a model-specific stand-in ("situ_as_silu": another activation run
    as SiLU) is never taken."""
    rows = rows[~rows.kernel_source.str.contains("situ_as_silu")]
    pick = _fastest if engine in FASTEST else (lambda part: part.kernel_source.value_counts().idxmax())
    parts = [part[part.kernel_source == pick(part)] for _, part in rows.groupby(rows.moe_ep_size > 1)]
    return pd.concat(parts) if parts else rows


def fit_format(rows: pd.DataFrame, gpu, fmt: str, version: str = "unstated",
               engine: str = "vllm") -> tuple[MoeCurve, dict]:
    """One format's curve on one GPU from its balanced rows (``rows``: one table's rows of that format)."""
    cdt, wbytes = FORMATS[fmt]
    rows = main_kernels(rows, engine)
    peak, bw = gpu.flops(cdt), gpu.memory_bandwidth_Bps.value
    bal = rows[rows.distribution == "balanced"].groupby(KEYS, as_index=False).latency.median()
    cols = {n: bal[n].to_numpy(float) for n in KEYS}
    y = bal.latency.to_numpy(float) * 1e-3
    shape = pd.factorize(pd.Series(list(zip(bal.hidden_size, bal.inter_size, bal.num_experts, bal.topk))))[0]
    n_shapes = int(shape.max()) + 1
    if n_shapes >= 4:
        held, unit = shape % 4 == 3, f"every fourth of {n_shapes} expert shapes"
    else:
        tok = pd.factorize(bal.num_tokens, sort=True)[0]
        held, unit = tok % 4 == 3, f"every fourth token count ({n_shapes} expert shape(s) measured)"

    def resid(x, sel):
        return np.log(predict(x, {n: v[sel] for n, v in cols.items()}, peak, wbytes, bw) / y[sel])

    r = least_squares(lambda x: resid(x, ~held), X0, bounds=(LO, HI), loss="soft_l1", f_scale=0.1)
    sub = {n: v for n, v in cols.items()}
    err = _rel(predict(r.x, sub, peak, wbytes, bw), y)
    q = FitQuality(n_points=int((~held).sum()), median_abs_rel_error=round(float(np.median(err[~held])), 4),
                   p90_abs_rel_error=round(float(np.quantile(err[~held], 0.9)), 4),
                   held_out_median_abs_rel_error=round(float(np.median(err[held])), 4))
    diag = {"held_out_p90": float(np.quantile(err[held], 0.9)), "held_out_points": int(held.sum()),
            "unit": unit, "imbalance": _imbalance(rows)}
    kernels = ", ".join(sorted(rows.kernel_source.unique()))
    x = [float(f"{v:.4g}") for v in r.x]
    curve = _curve(x)
    return MoeCurve(**{n: float(f"{getattr(curve, n):.4g}") for n in NAMES}, kernel=kernels, engine_version=version, quality=q, source=(
        f"fit to {len(bal)} balanced-routing rows ({fmt}) by calibration/moe_fit.py: median |rel err| "
        f"{q.median_abs_rel_error:.1%}, p90 {q.p90_abs_rel_error:.1%}; held out ({unit}, {diag['held_out_points']} "
        f"rows): median {q.held_out_median_abs_rel_error:.1%}, p90 {diag['held_out_p90']:.1%}; power-law "
        f"(alpha 1.01) routing at EP >= 8 measured {diag['imbalance']:.2f}x balanced (median over matched rows)")), diag


def _imbalance(rows: pd.DataFrame) -> float:
    """Median ratio of the power-law (alpha 1.01) rows' latency to the balanced rows' at the same shape, over
    the layouts where routing skew can load one GPU more than another (expert parallel >= 8)."""
    piv = rows[rows.moe_ep_size >= 8].pivot_table(index=KEYS, columns="distribution", values="latency", aggfunc="median")
    if "balanced" not in piv or "power_law_1.01" not in piv:
        return float("nan")
    ratio = (piv["power_law_1.01"] / piv["balanced"]).dropna()
    return float(ratio.median()) if len(ratio) else float("nan")


def fit_system(root: Path, system: str, engine: str, db=None) -> MoeKernels | None:
    """Every format's curve of one engine on one system, each from the newest release whose table measured
    that format (None: the engine has no MoE table there)."""
    tables = sorted(((p.parent.name, p) for p in (Path(root) / system / "moe" / engine).glob("*/moe_perf.parquet")),
                    key=lambda vp: _version_key(vp[0]), reverse=True)
    if not tables:
        return None
    db = db or hwdb.load()
    gpu = db.gpu(SYSTEMS[system])
    curves: dict[str, dict] = {"curves": {}, "ep_curves": {}}
    used = {}
    for version, path in tables:
        df = pd.read_parquet(path)
        for (fmt, ep_class), rows in df.groupby(["moe_dtype", df.moe_ep_size > 1]):
            key = "ep_curves" if ep_class else "curves"
            if (fmt in curves[key] or fmt not in FORMATS or FORMATS[fmt][0] not in gpu.peak_flops
                    or (rows.distribution == "balanced").sum() < 50):
                continue
            curve, _ = fit_format(rows, gpu, fmt, version, engine)
            table = f"aiconfigurator_0.12.0/data/{system}/moe/{engine}/{version}/moe_perf.parquet"
            curves[key][fmt] = curve.model_copy(update={"source": f"{table}: {curve.source}"})
            used[version] = table
    if not curves["curves"] and not curves["ep_curves"]:
        return None
    newest = max(used, key=_version_key)
    return MoeKernels(
        name=f"{gpu.name}_{engine}", gpu=gpu.name, engine=engine, engine_version=newest,
        source=(f"{', '.join(used.values())} (aiconfigurator-core 0.12.0, github ai-dynamo/aiconfigurator, "
                f"Apache-2.0); each format from the newest release that measured it"),
        method=("scipy.optimize.least_squares (trf, soft_l1 f_scale 0.1) on log-latency residuals of the "
                "hwdb/moe.py form; the engine's main kernel per layout class, rows with balanced routing, "
                f"median over repeated keys; peaks and HBM bandwidth of hwdb/data/gpus ({gpu.name}); "
                "coefficients to 4 significant figures; layouts with tensor-parallel experts (EP 1) and expert "
                "parallel ones (EP > 1) fitted apart: the engines run different kernels for them"),
        **curves)


def write(kernels: MoeKernels, out: Path = OUT) -> Path:
    """Write one GPU's curves as hwdb data (a generated file: rerun this module rather than edit it)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{kernels.name}.yaml"
    body = yaml.safe_dump(kernels.model_dump(mode="json"), sort_keys=False, width=120)
    path.write_text("# Generated by `python -m calibration.moe_fit --write`; rerun it rather than editing.\n" + body)
    return path


def summary(kernels: MoeKernels) -> list[str]:
    """One line per format and layout class: the fit and held-out errors."""
    return [f"{kernels.name:28s} {lay:3s} {fmt:17s} n={c.quality.n_points:5d} median "
            f"{c.quality.median_abs_rel_error:6.1%} p90 {c.quality.p90_abs_rel_error:6.1%} held-out median "
            f"{c.quality.held_out_median_abs_rel_error:6.1%}"
            for lay, table in (("tp", kernels.curves), ("ep", kernels.ep_curves)) for fmt, c in table.items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", type=Path, default=KERNELS, help="aiconfigurator_0.12.0/data folder")
    ap.add_argument("--system", action="append", choices=sorted(SYSTEMS), help="only these systems")
    ap.add_argument("--engine", action="append", choices=ENGINES, help="only these engines")
    ap.add_argument("--write", action="store_true", help="write hwdb/data/moe_kernels/*.yaml")
    args = ap.parse_args(argv)
    if not args.kernels.is_dir():
        print(f"no kernel tables at {args.kernels}: give --kernels DIR (../shared/data/kernels/aiconfigurator_0.12.0/data)")
        return 2
    db = hwdb.load()
    for system in args.system or SYSTEMS:
        for engine in args.engine or ENGINES:
            k = fit_system(args.kernels, system, engine, db)
            if k is None:
                continue
            print("\n".join(summary(k)), flush=True)
            if args.write:
                print(f"  wrote {write(k)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
