"""Fit the DeepSeek-sparse-attention lightning indexer's decode cost (:class:`hwdb.mla.MlaIndexer`).

Data: ``sparse_attention/sglang/<version>/dsa_generation_module_perf.parquet`` of aiconfigurator-core 0.12.0
(github ai-dynamo/aiconfigurator, Apache-2.0), ``../shared/data/kernels/aiconfigurator_0.12.0``: the whole
DSA attention module of a decode step (projections, indexer, sparse MLA; ms) by batch, cached length
(``step + 1`` tokens a sequence), TP and KV dtype.  Besides the full module the tables time a
``dsa_generation_module_skip_indexer`` variant (GLM-5.2 reuses an earlier layer's top-k), so the indexer is
the difference of a pair measured with the same attention weights format on the same GPU:

- the same checkpoint both ways where the table has it (``nvidia/GLM-5.2-NVFP4``: B300, GB200, GB300);
- else GLM-5's own module (``zai-org/GLM-5-FP8``) against GLM-5.2's skip variant (``zai-org/GLM-5.2-FP8``),
  whose attention has GLM-5's dimensions (H100, H200, B200).

The difference does not change with TP (the indexer is replicated on every rank), so every TP size is one
sample.  Batches of 1,024 are left out: there the module falls off a cliff (0.9 ms more than at 512, for
either variant), a path beyond the decode batches the engine captures in CUDA graphs.  Fitted by robust
least squares (soft-L1 on log latency) on every batch size but 4 and 64, which are held out and scored alone.
Only SGLang's tables carry the skip variant; vLLM's and TensorRT-LLM's time the full module only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from calibration.kernels.moe_fit import version_key
from hwdb.mla import MlaIndexer
from hwdb.profiles import FitQuality

TABLE = "dsa_generation_module_perf.parquet"
SKIP_OP = "dsa_generation_module_skip_indexer"
# (full module's checkpoint, skip variant's checkpoint), in order of preference
PAIRS = (("nvidia/GLM-5.2-NVFP4", "nvidia/GLM-5.2-NVFP4"), ("zai-org/GLM-5-FP8", "zai-org/GLM-5.2-FP8"))
HELD_BATCHES = (4, 64)
MAX_BATCH = 512


def indexer_rows(table: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The indexer's latency (ms) by KV dtype, TP, batch and step from one DSA generation table, and the
    pair it came from; an empty frame when the table has no such pair."""
    key = ["kv_cache_dtype", "gemm_type", "tp_size", "batch_size", "step"]
    skip = table.op_name == SKIP_OP
    for full_model, skip_model in PAIRS:
        a = table[~skip & (table.model == full_model)].groupby(key).latency.median()
        b = table[skip & (table.model == skip_model)].groupby(key).latency.median()
        both = pd.concat([a.rename("full"), b.rename("skip")], axis=1).dropna()
        if len(both):
            d = (both.full - both.skip).rename("latency").reset_index()
            return d[d.batch_size <= MAX_BATCH], f"{full_model} minus {skip_model} ({SKIP_OP})"
    return pd.DataFrame(columns=[*key, "latency"]), ""


def fit_indexer(rows: pd.DataFrame) -> MlaIndexer:
    """One KV dtype's indexer cost (x: fixed in us, per sequence in ns, per cached token in ps)."""
    b = rows.batch_size.to_numpy(float)
    ctx = b * (rows.step.to_numpy(float) + 1.0)
    y = rows.latency.to_numpy(float) * 1e-3
    held = np.isin(b, HELD_BATCHES)
    ok = y > 0.0  # a difference of two timings at their noise floor can come out negative

    def model(x, sel=slice(None)):
        return x[0] * 1e-6 + x[1] * 1e-9 * b[sel] + x[2] * 1e-12 * ctx[sel]

    fit = ~held & ok
    r = least_squares(
        lambda x: np.log(model(x, fit) / y[fit]),
        [20.0, 50.0, 0.1],
        bounds=([0.0, 0.0, 0.0], [1e3, 1e5, 1e4]),
        loss="soft_l1",
        f_scale=0.1,
    )
    x = [float(f"{v:.4g}") for v in r.x]
    err = np.abs(model(x) / y - 1.0)
    quality = FitQuality(
        n_points=int(fit.sum()),
        median_abs_rel_error=round(float(np.median(err[fit])), 4),
        p90_abs_rel_error=round(float(np.quantile(err[fit], 0.9)), 4),
        held_out_median_abs_rel_error=round(float(np.median(err[held & ok])), 4),
    )
    return MlaIndexer(
        fixed_s=float(f"{x[0] * 1e-6:.4g}"),
        seq_s=float(f"{x[1] * 1e-9:.4g}"),
        ctx_s=float(f"{x[2] * 1e-12:.4g}"),
        quality=quality,
    )


def fit_system(root: Path, system: str, engine: str) -> tuple[dict[str, MlaIndexer], str]:
    """The indexer's cost by KV dtype on one system from the engine's newest release with a pair, and its
    source ({} and "" when none)."""
    base = Path(root) / system / "sparse_attention" / engine
    for version in sorted((p.name for p in base.glob("*") if (p / TABLE).is_file()), key=version_key, reverse=True):
        rows, pair = indexer_rows(pd.read_parquet(base / version / TABLE))
        if not len(rows):
            continue
        fits = {kv: fit_indexer(r) for kv, r in rows.groupby("kv_cache_dtype")}
        notes = "; ".join(
            f"{kv}: median |rel err| {f.quality.median_abs_rel_error:.1%}, held-out batches "
            f"{f.quality.held_out_median_abs_rel_error:.1%}"
            for kv, f in fits.items()
        )
        return fits, (
            f"aiconfigurator_0.12.0/data/{system}/sparse_attention/{engine}/{version}/{TABLE}: {pair}, "
            f"batches up to {MAX_BATCH}; least squares (soft_l1 on log latency) by "
            "calibration/kernels/dsa_fit.py "
            f"on every batch but {', '.join(map(str, HELD_BATCHES))}; {notes}"
        )
    return {}, ""
