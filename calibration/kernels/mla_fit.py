"""Fit the MLA attention kernel curves (:class:`hwdb.mla.MlaCurve`) to measured latencies.

Data: the ``mla/<engine>/<version>/{context,generation}_mla_perf.parquet`` tables of aiconfigurator-core
0.12.0 (github ai-dynamo/aiconfigurator, Apache-2.0), ``../shared/data/kernels/aiconfigurator_0.12.0``:
the MLA attention kernel alone (ms) by batch, prompt length (context) or cached length (generation,
``step + 1`` tokens a sequence), heads on the GPU and KV-cache dtype, with DeepSeek-V3's dimensions, for
SGLang and TensorRT-LLM on H100/H200/B200/B300/GB200/GB300.  vLLM measured MLA only as whole modules
(projections included), so it keeps its attention curves.

Per (GPU, engine, phase, KV dtype) the coefficients are fitted by robust least squares (soft-L1 on
log-latency residuals) on every head count but 4 and 32, which are held out and scored alone.  Run::

    python -m calibration.kernels.mla_fit [--kernels DIR] [--write] [--markdown FILE]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

import hwdb
from calibration.kernels import cli as kernel_cli
from calibration.kernels import dsa_fit
from calibration.kernels.moe_fit import SYSTEMS, version_key
from hwdb.mla import MlaContext, MlaCurve, MlaGeneration
from hwdb.profiles import FitQuality

OUT = Path(__file__).resolve().parents[2] / "hwdb" / "data" / "mla_kernels"
ENGINES = ("sglang", "trtllm")
HELD_HEADS = (4, 32)
# DeepSeek-V3's MLA dimensions, which the tables measured.
D_C, D_R, D_QK, D_V = 512, 64, 192, 128
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0}
# Measured kernels the engine does not serve that KV format with: left out, with the reason in the curve's source.
NOT_SERVED = {
    ("sglang", "flash_attention", "fp8"): (
        "fp8 KV rows of flash_attention (FA3) left out: SGLang's attention-backend support matrix lists FA3's MLA with "
        "an fp8 KV cache for page size 1 only, and these rows decode 3-4x slower than its bf16 ones"
    )
}
# The quality of the solver's trial curves, which are built only to be timed (the fitted curve gets its own).
UNSCORED = FitQuality(n_points=0, median_abs_rel_error=0.0, p90_abs_rel_error=0.0)


def _quality(pred, y, held) -> FitQuality:
    err = np.abs(pred / y - 1.0)
    return FitQuality(
        n_points=int((~held).sum()),
        median_abs_rel_error=round(float(np.median(err[~held])), 4),
        p90_abs_rel_error=round(float(np.quantile(err[~held], 0.9)), 4),
        held_out_median_abs_rel_error=round(float(np.median(err[held])), 4),
    )


def _sig(x) -> list[float]:
    """Four significant figures; what the solver leaves at its bound of 0 (below 1e-15 in its units) is 0."""
    return [float(f"{v:.4g}") if abs(v) > 1e-15 else 0.0 for v in x]


def fit_context(rows: pd.DataFrame, peak: float) -> MlaContext:
    """One KV dtype's context curve (x: fixed in us, seq_s and seq_head_s in ns, max_eff, half_len, half_rows in
    thousands)."""
    g = rows.groupby(["batch_size", "isl", "num_heads"], as_index=False).latency.median()
    b, s, n = (g[c].to_numpy(float) for c in ("batch_size", "isl", "num_heads"))
    y = g.latency.to_numpy(float) * 1e-3
    held = np.isin(n, HELD_HEADS)

    def model(x, sel=slice(None)):
        return MlaContext.model_construct(
            fixed_s=x[0] * 1e-6,
            seq_s=x[1] * 1e-9,
            seq_head_s=x[2] * 1e-9,
            max_eff=x[3],
            half_len=x[4],
            half_rows=x[5] * 1e3,
            quality=UNSCORED,
        ).time(b[sel], s[sel], n[sel], D_QK, D_V, peak)

    r = least_squares(
        lambda x: np.log(model(x, ~held) / y[~held]),
        [10.0, 10.0, 10.0, 0.5, 1000.0, 10.0],
        bounds=([0.0, 0.0, 0.0, 0.01, 0.0, 0.0], [1e3, 1e4, 1e4, 2.0, 1e7, 1e6]),
        loss="soft_l1",
        f_scale=0.1,
    )
    x = _sig(r.x)
    return MlaContext(
        fixed_s=float(f"{x[0] * 1e-6:.4g}"),
        seq_s=float(f"{x[1] * 1e-9:.4g}"),
        seq_head_s=float(f"{x[2] * 1e-9:.4g}"),
        max_eff=x[3],
        half_len=x[4],
        half_rows=float(f"{x[5] * 1e3:.4g}"),
        quality=_quality(model(x), y, held),
    )


def fit_generation(rows: pd.DataFrame, kv: str, peak: float, bw: float) -> MlaGeneration:
    """One KV dtype's generation curve (x: fixed in us, per sequence-head in ns, mem_eff, comp_eff)."""
    g = rows.groupby(["batch_size", "step", "num_heads"], as_index=False).latency.median()
    b, n = g.batch_size.to_numpy(float), g.num_heads.to_numpy(float)
    ctx = b * (g.step.to_numpy(float) + 1.0)
    y = g.latency.to_numpy(float) * 1e-3
    held = np.isin(n, HELD_HEADS)

    def model(x, sel=slice(None)):
        return MlaGeneration.model_construct(
            fixed_s=x[0] * 1e-6, seq_head_s=x[1] * 1e-9, mem_eff=x[2], comp_eff=x[3], quality=UNSCORED
        ).time(b[sel], ctx[sel], n[sel], D_C, D_R, KV_BYTES[kv], peak, bw)

    r = least_squares(
        lambda x: np.log(model(x, ~held) / y[~held]),
        [10.0, 1.0, 0.7, 0.5],
        bounds=([0.0, 0.0, 0.05, 0.01], [1e3, 1e4, 1.5, 2.0]),
        loss="soft_l1",
        f_scale=0.1,
    )
    x = _sig(r.x)
    return MlaGeneration(
        fixed_s=float(f"{x[0] * 1e-6:.4g}"),
        seq_head_s=float(f"{x[1] * 1e-9:.4g}"),
        mem_eff=x[2],
        comp_eff=x[3],
        quality=_quality(model(x), y, held),
    )


def fit_system(root: Path, system: str, engine: str, db=None) -> MlaCurve | None:
    """One engine's curves on one system from its newest release with both tables (None: none there)."""
    versions = sorted(
        (
            p.name
            for p in (Path(root) / system / "mla" / engine).glob("*")
            if (p / "context_mla_perf.parquet").is_file() and (p / "generation_mla_perf.parquet").is_file()
        ),
        key=version_key,
        reverse=True,
    )
    if not versions:
        return None
    version = versions[0]
    base = Path(root) / system / "mla" / engine / version
    ctx, gen = (pd.read_parquet(base / f"{p}_mla_perf.parquet") for p in ("context", "generation"))
    gpu = (db or hwdb.load()).gpu(SYSTEMS[system])
    peak, bw = gpu.flops("bf16"), gpu.memory_bandwidth_Bps.value
    left = [why for (eng, kernel, kv), why in NOT_SERVED.items() if eng == engine and kernel in set(gen.kernel_source)]
    keep = [kv for kv in KV_BYTES if (engine, gen.kernel_source.iloc[0], kv) not in NOT_SERVED]
    context = {kv: fit_context(r, peak) for kv, r in ctx.groupby("kv_cache_dtype") if kv in keep}
    generation = {kv: fit_generation(r, kv, peak, bw) for kv, r in gen.groupby("kv_cache_dtype") if kv in keep}
    notes = [
        f"{phase} {kv}: median |rel err| {c.quality.median_abs_rel_error:.1%}, held-out heads "
        f"{c.quality.held_out_median_abs_rel_error:.1%}"
        for phase, table in (("context", context), ("generation", generation))
        for kv, c in table.items()
    ]
    kernel = ", ".join(sorted(set(ctx.kernel_source) | set(gen.kernel_source)))
    indexer, indexer_source = dsa_fit.fit_system(root, system, engine)
    return MlaCurve(
        name=f"{gpu.name}_{engine}",
        gpu=gpu.name,
        engine=engine,
        engine_version=version,
        kernel=kernel,
        source=(
            f"aiconfigurator_0.12.0/data/{system}/mla/{engine}/{version}/{{context,generation}}_mla_perf"
            f".parquet (aiconfigurator-core 0.12.0, github ai-dynamo/aiconfigurator, Apache-2.0); "
            f"least squares (soft_l1 on log latency) by calibration/kernels/mla_fit.py "
            "on every head count but "
            f"{', '.join(map(str, HELD_HEADS))}; peaks and bandwidth of hwdb/data/gpus; " + "; ".join(notes + left)
        ),
        context=context,
        generation=generation,
        indexer=indexer,
        indexer_source=indexer_source,
    )


def markdown(db) -> str:
    """The table of every shipped curve's fit and held-out error (docs/validation/mla_kernels.md)."""
    out = [
        "# MLA attention kernel curves: fit and held-out error",
        "",
        "Generated by `python -m calibration.kernels.mla_fit --markdown docs/validation/mla_kernels.md` "
        "from the shipped",
        "`hwdb/data/mla_kernels/*.yaml` (the form: `hwdb/mla.py`; the method: `calibration/kernels/mla_fit.py`).",
        "Errors are |predicted / measured - 1| per measured point; held out: the points with 4 and 32 heads",
        "on the GPU, which the fit never saw; for the DSA indexer (`calibration/kernels/dsa_fit.py`, decode), the",
        "batches of 4 and 64.",
        "",
        "| GPU | engine | phase | KV cache | points fitted | median | p90 | held-out median |",
        "|---|---|---|---|---|---|---|---|",
    ]
    n = ok = 0
    for c in sorted(db.mla_kernels.values(), key=lambda c: (c.gpu, c.engine)):
        for phase in ("context", "generation", "indexer"):
            for kv, p in sorted(getattr(c, phase).items()):
                q = p.quality
                n += 1
                ok += q.held_out_median_abs_rel_error <= 0.15
                out.append(
                    f"| {c.gpu} | {c.engine} {c.engine_version} | {phase} | {kv} | {q.n_points} | "
                    f"{q.median_abs_rel_error:.1%} | {q.p90_abs_rel_error:.1%} | "
                    f"{q.held_out_median_abs_rel_error:.1%} |"
                )
    return "\n".join(out) + f"\n\n{ok} of {n} curves within 15 % median |error| on held-out points.\n"


def summary(c: MlaCurve) -> list[str]:
    """One line per phase and KV dtype: the fit and held-out errors."""
    return [
        f"{c.name:24s} {phase:10s} {kv:8s} n={p.quality.n_points:5d} median {p.quality.median_abs_rel_error:6.1%} "
        f"p90 {p.quality.p90_abs_rel_error:6.1%} held-out median {p.quality.held_out_median_abs_rel_error:6.1%}"
        for phase in ("context", "generation", "indexer")
        for kv, p in getattr(c, phase).items()
    ]


def main(argv=None) -> int:
    db = hwdb.load()
    return kernel_cli.run(
        argv,
        __doc__.split("\n")[0],
        "calibration.kernels.mla_fit",
        OUT,
        ENGINES,
        lambda root, system, engine: fit_system(root, system, engine, db),
        summary,
        markdown,
    )


if __name__ == "__main__":
    raise SystemExit(main())
