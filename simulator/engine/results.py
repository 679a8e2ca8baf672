"""Results of a run as DataFrames, and the metrics computed from them.

``requests``: one row per request (times in seconds from the first arrival).
``steps``: one row per engine step per instance.  ITL is the gap between
consecutive tokens of a request; a decoding sequence's token gap is the
duration of the step that produced it, so the ITL distribution over every
token is the step-duration distribution weighted by decode tokens per step,
plus the gaps of preempted requests (the time to re-prefill them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import pandas as pd
import yaml

from simulator.engine.outcome import LABELS, STATIC_OUTCOMES
from simulator.engine.records import PoolRun
from simulator.engine.steplog import StepLog
from simulator.summary_types import Percentiles, PoolStats, RunSummary, TTFTBreakdown

if TYPE_CHECKING:
    from simulator.scenario import Scenario

PCTS = (50, 90, 99)  # the percentiles of a summary's latency figures (summary_types.Percentiles)


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, pcts=PCTS) -> list[float]:
    """Percentiles of ``values`` where each value counts ``weights`` times (inverted CDF)."""
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if len(values) == 0:
        return [float("nan")] * len(pcts)
    order = np.argsort(values, kind="stable")
    v, cw = values[order], np.cumsum(weights[order])
    total = cw[-1]
    return [float(v[min(np.searchsorted(cw, p / 100.0 * total, side="left"), len(v) - 1)]) for p in pcts]


def requests_frame(run: PoolRun, pool: str, *, operations: bool = False) -> pd.DataFrame:
    """One row per request.  ``operations``: the run had an ``operations`` block, so the outcome may be
    ``failed`` and the table adds ``retries`` and ``discarded_tokens``; without it a request never fails
    and those columns are left out.  Re-prefilled requests are first restored to their original
    lengths and first attempt (:meth:`Recorder.finalize`)."""
    rec = run.recorder
    rec.finalize()
    arrival = np.asarray(rec.arrival)
    first = np.asarray(rec.t_first)
    finish = np.asarray(rec.t_finish)
    out = np.asarray(rec.output_tokens)
    seen = np.asarray(rec.t_seen)
    seen = np.where(np.isnan(seen), arrival, seen)  # never dispatched (past max_time_s, or never sent by a user)
    tpot = np.where(out > 1, (finish - first) / np.maximum(out - 1, 1), np.nan)
    categories = list(LABELS) if operations else [o.label for o in STATIC_OUTCOMES]
    df = pd.DataFrame(
        {
            "request_id": np.arange(len(arrival)),
            "pool": pool,
            "instance": np.asarray(rec.instance, dtype=np.int32),
            "prefill_instance": np.asarray(rec.prefill_instance, dtype=np.int32),
            "arrival_s": arrival,
            "input_tokens": np.asarray(rec.input_tokens, dtype=np.int64),
            "output_tokens": out.astype(np.int64),
            "scheduled_s": np.asarray(rec.t_sched),
            "first_token_s": first,
            "finish_s": finish,
            "frontend_s": seen - arrival,
            "queue_s": np.asarray(rec.t_sched) - seen,
            "prefill_s": np.where(np.isnan(np.asarray(rec.t_prefilled)), first, np.asarray(rec.t_prefilled))
            - np.asarray(rec.t_sched),
            "transfer_wait_s": np.asarray(rec.t_kv_start) - np.asarray(rec.t_prefilled),
            "transfer_s": np.asarray(rec.t_kv_done) - np.asarray(rec.t_kv_start),
            "decode_admission_s": first - np.asarray(rec.t_kv_done),
            "ttft_s": first - arrival,
            "tpot_s": tpot,
            "e2e_s": finish - arrival,
            "preemptions": np.asarray(rec.preemptions, dtype=np.int32),
            "generated_tokens": np.asarray(rec.generated, dtype=np.int64),
            "cached_tokens": np.asarray(rec.cached_tokens, dtype=np.int64),
            "outcome": pd.Categorical([LABELS[o] for o in rec.outcome], categories=categories),
            "reason": rec.reason,
        }
    )
    if operations:
        df["retries"] = np.asarray(rec.retries, dtype=np.int32)
        df["discarded_tokens"] = np.asarray(rec.discarded, dtype=np.int64)
    return df


STEP_COLUMNS = [
    "start_s",
    "duration_s",
    "decode_tokens",
    "prefill_tokens",
    "first_tokens",
    "batch_size",
    "waiting",
    "kv_blocks_used",
    "preemptions",
]


def steps_frame(run: PoolRun) -> pd.DataFrame:
    """One row per engine step of every instance, in instance order and step order within each."""
    insts = run.instances
    logs = cast("list[StepLog]", [inst.steps for inst in insts])  # a run without a step log builds no table
    counts = np.array([len(log) for log in logs], dtype=np.int64)
    # One array over every instance's flat log: no per-instance frame to concatenate.
    arr = np.fromiter(
        chain.from_iterable(log.flat for log in logs), dtype=np.float64, count=int(counts.sum()) * len(STEP_COLUMNS)
    ).reshape(-1, len(STEP_COLUMNS))
    data = {
        "pool": np.repeat(np.array([inst.pool for inst in insts], dtype=object), counts),
        "instance": np.repeat(np.array([inst.index for inst in insts], dtype=np.int64), counts),
        "step": np.concatenate([np.arange(c, dtype=np.int64) for c in counts])
        if len(insts)
        else np.zeros(0, dtype=np.int64),
    }
    for j, c in enumerate(STEP_COLUMNS):
        data[c] = arr[:, j] if j < 2 else arr[:, j].astype(np.int64)
    data["kv_occupancy"] = data["kv_blocks_used"] / np.repeat(
        np.array([inst.kv_total for inst in insts], dtype=np.int64), counts
    )
    return pd.DataFrame(data)


def _pcts(x: np.ndarray) -> Percentiles:
    x = x[np.isfinite(x)]
    if len(x) == 0:
        nan = float("nan")
        return Percentiles(p50=nan, p90=nan, p99=nan, mean=nan)
    p50, p90, p99 = (float(v) for v in np.percentile(x, PCTS))
    return Percentiles(p50=p50, p90=p90, p99=p99, mean=float(x.mean()))


def summarize(
    req: pd.DataFrame,
    steps: pd.DataFrame,
    resume_gaps: list[float],
    *,
    gpus: int,
    cost_usd_per_hour: float,
    ttft_slo: float | None,
    tpot_slo: float | None,
) -> RunSummary:
    """Headline metrics (seconds, tokens/s, dollars); see docs/metrics.md for definitions.

    Latency figures leave out a closed loop's warm-up requests (``warmup`` column), as benchmark
    clients do."""
    done = (
        req[(req["outcome"] == "completed").to_numpy() & ~req["warmup"].to_numpy()]
        if "warmup" in req
        else req[req["outcome"] == "completed"]
    )
    n = len(req)
    t0 = float(req["arrival_s"].min())
    t1 = float(np.nanmax(req["finish_s"].to_numpy())) if len(done) else t0
    span = max(t1 - t0, 1e-12)
    out_tok = float(done["output_tokens"].sum())
    in_tok = float(done["input_tokens"].sum())
    dur = steps["duration_s"].to_numpy()
    dec = steps["decode_tokens"].to_numpy().astype(float)
    gaps = np.asarray(resume_gaps, dtype=float)
    itl_vals = np.concatenate([dur, gaps])
    itl_w = np.concatenate([dec, np.ones_like(gaps)])
    p50, p90, p99 = weighted_percentiles(itl_vals, itl_w)
    itl = Percentiles(
        p50=p50, p90=p90, p99=p99, mean=float((itl_vals * itl_w).sum() / itl_w.sum()) if itl_w.sum() else float("nan")
    )
    ok = np.ones(len(req), dtype=bool) & (req["outcome"] == "completed").to_numpy()
    if ttft_slo is not None:
        ok &= req["ttft_s"].to_numpy() <= ttft_slo
    if tpot_slo is not None:
        tp = req["tpot_s"].to_numpy()
        ok &= ~(tp > tpot_slo)  # NaN TPOT (single-token outputs) passes
    busy = dur.sum()
    cost_h = cost_usd_per_hour
    out_rate = out_tok / span
    w = dur / busy if busy > 0 else dur
    return {
        "requests": n,
        "completed": int(len(done)),
        "rejected": int((req["outcome"] == "rejected").sum()),
        "unfinished": int((req["outcome"] == "unfinished").sum()),
        "duration_s": span,
        "throughput_rps": len(done) / span,
        "output_tokens_per_s": out_rate,
        "total_tokens_per_s": (in_tok + out_tok) / span,
        "output_tokens_per_s_per_gpu": out_rate / gpus,
        "ttft_s": _pcts(done["ttft_s"].to_numpy()),
        "tpot_s": _pcts(done["tpot_s"].to_numpy()),
        "itl_s": itl,
        "e2e_s": _pcts(done["e2e_s"].to_numpy()),
        "queue_s": _pcts(done["queue_s"].to_numpy()),
        "preemptions": int(req["preemptions"].sum()),
        "prefix_cache_hit_rate": float(req["cached_tokens"].sum() / max(1, req["input_tokens"].sum())),
        "mean_batch_size": float((steps["batch_size"].to_numpy() * w).sum()),
        "mean_kv_occupancy": float((steps["kv_occupancy"].to_numpy() * w).sum()),
        "max_kv_occupancy": float(steps["kv_occupancy"].max()) if len(steps) else 0.0,
        "slo_attainment": float(ok.mean()) if n else float("nan"),
        # the phases the requests table has columns for (the encoder's only in a multimodal run)
        "ttft_breakdown_mean_s": cast(
            TTFTBreakdown,
            {
                c.removesuffix("_s"): float(np.nanmean(done[c])) if done[c].notna().any() else 0.0
                for c in (
                    "frontend_s",
                    "encode_queue_s",
                    "encode_s",
                    "embedding_transfer_s",
                    "queue_s",
                    "prefill_s",
                    "transfer_wait_s",
                    "transfer_s",
                    "decode_admission_s",
                )
                if c in done
            },
        ),
        "pools": _pool_stats(steps),
        "gpus": gpus,
        "cost_usd_per_hour": cost_h,
        "cost_usd_per_million_output_tokens": cost_h / (out_rate * 3600.0) * 1e6 if out_rate > 0 else float("inf"),
    }


def _pool_stats(steps: pd.DataFrame) -> dict[str, PoolStats]:
    """Per pool: step-duration-weighted mean batch size and KV occupancy, max KV occupancy."""
    out: dict[str, PoolStats] = {}
    for name, g in steps.groupby("pool", sort=True):
        d = g["duration_s"].to_numpy()
        w = d / d.sum() if d.sum() > 0 else d
        out[str(name)] = PoolStats(
            mean_batch_size=float((g["batch_size"].to_numpy() * w).sum()),
            mean_kv_occupancy=float((g["kv_occupancy"].to_numpy() * w).sum()),
            max_kv_occupancy=float(g["kv_occupancy"].max()),
            steps=int(len(g)),
        )
    return out


def links_frame(fabric) -> pd.DataFrame:
    """Per link, the change points of the rate in use: (time_s, rate_Bps, utilisation); the rate holds
    until the next point of the same link."""
    rows = []
    for name, ln in fabric.links.items():
        for t, r in ln.rate_series:
            rows.append((name, t, r, r / ln.capacity_Bps))
    return pd.DataFrame(rows, columns=["link", "time_s", "rate_Bps", "utilisation"])


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """``df`` as CSV through pyarrow's writer (~10x faster than pandas' for the step log).

    Values read back equal to pandas' output; the text differs in form only: floats in shortest
    round-trip form without a forced ``.0`` (``0`` for 0.0, ``1.445e+11``), booleans ``true``/``false``,
    and strings quoted only when a value holds a comma, quote or line break."""
    import pyarrow as pa  # noqa: PLC0415 - heavy (pyarrow): loaded only to write a CSV
    import pyarrow.csv as pacsv  # noqa: PLC0415 - heavy (pyarrow): loaded only to write a CSV

    table = pa.Table.from_pandas(df, preserve_index=False)
    with open(path, "wb") as f:
        # pyarrow quotes the header; pandas' plain header keeps the files easy to read.
        f.write(pd.DataFrame(columns=df.columns).to_csv(index=False).encode())
        try:
            pacsv.write_csv(table, f, pacsv.WriteOptions(include_header=False, quoting_style="none"))
        except pa.ArrowInvalid:  # a value needs quotes (a comma in a name or reason): quote strings
            f.seek(0)
            f.truncate()
            f.write(pd.DataFrame(columns=df.columns).to_csv(index=False).encode())
            pacsv.write_csv(table, f, pacsv.WriteOptions(include_header=False, quoting_style="needed"))


@dataclass
class Results:
    """A finished run: DataFrames, the summary and what produced them."""

    scenario: Scenario
    requests: pd.DataFrame
    steps: pd.DataFrame
    summary: RunSummary
    info: dict = field(default_factory=dict)
    links: pd.DataFrame | None = None

    def write(self, out_dir: str | Path, formats: tuple[str, ...] = ("parquet",)) -> list[Path]:
        """Write requests, steps and summary; returns the paths written."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        tables = [("requests", self.requests), ("steps", self.steps)]
        if self.links is not None:
            tables.append(("links", self.links))
        for name, df in tables:
            if "parquet" in formats:
                paths.append(out / f"{name}.parquet")
                df.to_parquet(paths[-1], index=False)
            if "csv" in formats:
                paths.append(out / f"{name}.csv")
                write_csv(df, paths[-1])
            if "json" in formats:
                paths.append(out / f"{name}.json")
                df.to_json(paths[-1], orient="records", lines=True)
        paths.append(out / "summary.json")
        paths[-1].write_text(json.dumps({"summary": self.summary, "info": self.info}, indent=2, sort_keys=True))
        paths.append(out / "scenario.yaml")
        paths[-1].write_text(yaml.safe_dump(self.scenario.model_dump(mode="json"), sort_keys=False))
        return paths
