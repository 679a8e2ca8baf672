"""End-to-end validation: simulate measured serving runs and score the predictions.

:func:`predict` runs every expressible row of the measurement table
(:mod:`calibration.e2e.rows`) through :func:`simulator.run.simulate` with the
benchmark client of the closed loop, and returns one record per row:
measured and predicted mean TTFT and TPOT (seconds), or the reason the row
could not be expressed.  :func:`score` turns those records into MAPE and
signed bias per subset.  Rows are split into a fitting part and a held-out
part by :func:`split` (by model family), so that any end-to-end parameter is
fitted on one part and reported on the other.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict

import numpy as np
import pandas as pd

import hwdb
from calibration.e2e.physics import beyond_hardware
from calibration.e2e.rows import REQUESTS_PER_CLIENT, Row, admission_anomaly
from calibration.e2e.scenarios import to_scenario, why_not
from calibration.e2e.spec import speculative
from hwdb.schema import Figure
from simulator.resolved import resolve
from simulator.run import simulate
from simulator.scenario import ScenarioError, parse_scenario

# Model families whose rows may fit end-to-end terms: the dense Llama-3.1-70B (the only dense model
# vLLM was measured on), one MoE family per engine (MiniMax-M2.5 for vLLM, DeepSeek for TensorRT-LLM
# and SGLang); every other family is held out and reported separately.
FIT_FAMILIES = ("Llama-3.1-70B", "MiniMax-M2.5", "DeepSeek-V3", "DeepSeek-R1")


def family_of(model: str) -> str:
    return model.split("/")[-1]


def split(row: Row) -> str:
    """'fit' or 'held-out' (by model family: no end-to-end term ever sees a held-out family)."""
    name = family_of(row.model)
    return "fit" if any(name.startswith(f) for f in FIT_FAMILIES) else "held-out"


def _predict_one(row: Row, db, client: dict, requests_per_client: int, kv_mode: str = "quantised-fp8") -> dict:
    rec = {
        **asdict(row),
        "subset": row.subset,
        "split": split(row),
        "reason": why_not(row, db),
        "excluded": "",
        "ttft_pred_s": np.nan,
        "tpot_pred_s": np.nan,
    }
    if rec["reason"]:
        return rec
    t0 = time.perf_counter()
    k = requests_per_client if _cheap(row, requests_per_client) else min(requests_per_client, SHORT_RUN)
    try:
        scn = parse_scenario(to_scenario(row, db, k, client, kv_mode=kv_mode), origin=row.id)
        last = resolve(scn, db).pools[-1]
        res = simulate(scn, db=db)
    except ScenarioError as exc:
        # the broken rule, without the scenario's origin, pool name or the fix that follows it
        msg = str(exc).removeprefix(f"{row.id}: ").split("; ")[0]
        rec["reason"] = "does not fit: " + re.sub(r"pools\[\w+\](\.|: )", "", msg)[:100]
        return rec
    # The batch a client waits on is the decode side's (the only pool of a colocated run).
    ranks = last.dep.dp * last.pool.instances
    rec["kv_dtype"] = last.dep.kv_dtype
    rec["excluded"] = (
        speculative(row)
        or beyond_hardware(row, last.dep, last.step)
        or admission_anomaly(row, last.memory.kv_tokens * ranks, last.dep.knobs.max_num_seqs * ranks)
    )
    req = res.requests
    done = req[(req["outcome"] == "completed") & ~req.get("warmup", False)]
    ids = done["request_id"].to_numpy()
    wave = np.ones(len(ids), dtype=int)
    wave[ids >= (k - 1) * row.concurrency] = 2  # the last wave (the run drains)
    wave[ids < row.concurrency] = 0
    for col in ("ttft_s", "tpot_s"):
        rec[col.replace("_s", "_pred_s")] = benchmark_mean(done[col].to_numpy(), wave, requests_per_client)
    rec["requests_per_client_simulated"] = k
    rec["sim_wall_s"] = time.perf_counter() - t0
    return rec


# Rows whose full run would cost more than this many rank-steps (requests per client x output tokens x the
# scheduler ranks, both sides of a PD run) simulate SHORT_RUN requests per client and reweight
# (benchmark_mean): on four heavy rows checked against their full runs, TTFT +0.5 to +5 %, TPOT -2 to +0.5 %.
RANK_STEP_BUDGET = 1.5e5
SHORT_RUN = 3


def _cheap(row: Row, requests_per_client: int) -> bool:
    ranks = sum(w * dp for w, _, dp, _, _ in row.sides) if row.sides else row.dp
    return (
        requests_per_client * row.osl * ranks <= RANK_STEP_BUDGET
        and requests_per_client * row.concurrency <= 10 * RANK_STEP_BUDGET / 1000
    )


def benchmark_mean(values: np.ndarray, wave: np.ndarray, requests_per_client: int) -> float:
    """The benchmark's mean over ``requests_per_client`` x C requests from a run that may be shorter.

    ``wave``: 0 for a closed loop's first C requests (sent at once into an empty server), 2 for its last C
    (sent while the run drains), 1 for the ones between, which see the server in its steady state.  The
    benchmark averages one first, one last and ``requests_per_client - 2`` steady waves per user; a run of
    at least 3 waves gives all three means, weighed here as the full run would (with the full run, its
    plain mean)."""
    k = requests_per_client
    parts = [values[wave == w] for w in (0, 1, 2)]
    if any(len(p) == 0 for p in parts) or k < 3:
        return float(values.mean())
    return float((parts[0].mean() + (k - 2) * parts[1].mean() + parts[2].mean()) / k)


_WORKER: dict = {}


def with_engine_terms(db, terms: dict[str, dict[str, float]]):
    """``db`` with engine profiles' end-to-end terms replaced: ``{engine: {field: seconds}}``."""
    for name, fields in terms.items():
        eng = db.engine(name)

        def fig(v):
            return Figure(value=v, source="trial value of calibration/e2e/fit.py", empirical=True)

        db.engines[eng.name] = eng.model_copy(
            update={
                k: ({g: fig(x) for g, x in v.items()} if isinstance(v, dict) else fig(v)) for k, v in fields.items()
            }
        )
    return db


def _init_worker(hwdb_dirs: tuple[str, ...], terms: dict | None = None) -> None:
    _WORKER["db"] = with_engine_terms(hwdb.load(hwdb_dirs), terms or {})


def _work(args) -> dict:
    row, client, rpc, kv_mode = args
    return _predict_one(row, _WORKER["db"], client, rpc, kv_mode)


def predict(
    rows: list[Row],
    client: dict | None = None,
    workers: int | None = None,
    requests_per_client: int = REQUESTS_PER_CLIENT,
    hwdb_dirs: tuple[str, ...] = (),
    terms: dict | None = None,
    kv_mode: str = "quantised-fp8",
) -> pd.DataFrame:
    """One record per row: measured and predicted mean TTFT/TPOT (s), subset, split, reason.

    ``client``: extra fields of the closed-loop arrival (the benchmark client model); ``workers``:
    processes (default: the CPUs available); ``terms``: engine end-to-end terms to try instead of
    the shipped ones (see :func:`with_engine_terms`); ``kv_mode``: how a row's KV format is chosen
    (:data:`calibration.e2e.scenarios.KV_MODES`).  Results are in row order whatever the worker count.
    """
    client = client or {}
    workers = workers or len(os.sched_getaffinity(0))
    args = [(r, client, requests_per_client, kv_mode) for r in rows]
    if workers <= 1 or len(rows) < 8:
        _init_worker(hwdb_dirs, terms)
        out = [_work(a) for a in args]
    else:
        with ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(hwdb_dirs, terms)) as ex:
            out = list(ex.map(_work, args, chunksize=4))
    df = pd.DataFrame(out)
    df["ttft_err"] = df["ttft_pred_s"] / df["ttft_s"] - 1.0
    df["tpot_err"] = df["tpot_pred_s"] / df["tpot_s"] - 1.0
    return df


def score(df: pd.DataFrame, by: list[str] | None = None, min_rows: int = 1) -> pd.DataFrame:
    """MAPE and signed mean bias of TTFT and TPOT per group of expressed rows (fractions, not %)."""
    by = by or ["split", "subset"]
    ok = scored(df)
    g = ok.groupby(by, sort=True)
    out = pd.DataFrame(
        {
            "rows": g.size(),
            "ttft_mape": g["ttft_err"].apply(lambda e: float(np.mean(np.abs(e)))),
            "ttft_bias": g["ttft_err"].mean(),
            "tpot_mape": g["tpot_err"].apply(lambda e: float(np.mean(np.abs(e)))),
            "tpot_bias": g["tpot_err"].mean(),
            # Medians of |error|: what a typical row sees, beside the MAPE that a few outlying runs can dominate.
            "ttft_mdape": g["ttft_err"].apply(lambda e: float(np.median(np.abs(e)))),
            "tpot_mdape": g["tpot_err"].apply(lambda e: float(np.median(np.abs(e)))),
        }
    ).reset_index()
    return out[out["rows"] >= min_rows]


def scored(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that enter the scores: simulated, and not excluded as runs their settings cannot produce."""
    ok = df["reason"] == ""
    if "excluded" in df:
        ok &= df["excluded"].fillna("") == ""
    return df[ok]


def excluded(df: pd.DataFrame) -> pd.DataFrame:
    """Simulated rows left out of the scores, with why: runs made with speculative decoding
    (:func:`calibration.e2e.spec.speculative`), beyond the hardware (:mod:`calibration.e2e.physics`) or with
    an admission anomaly (:func:`calibration.e2e.rows.admission_anomaly`)."""
    if "excluded" not in df:
        return df.iloc[:0]
    return df[(df["reason"] == "") & (df["excluded"].fillna("") != "")]


def reasons(df: pd.DataFrame) -> pd.DataFrame:
    """Rows not expressed, counted by reason (every row is either expressed or counted here)."""
    bad = df[df["reason"] != ""]
    return bad.groupby("reason").size().rename("rows").reset_index().sort_values("rows", ascending=False)


def worst(df: pd.DataFrame, n: int = 15) -> pd.DataFrame:
    ok = scored(df).copy()
    ok["worst"] = np.maximum(ok["ttft_err"].abs(), ok["tpot_err"].abs())
    cols = [
        "id",
        "split",
        "subset",
        "isl",
        "osl",
        "concurrency",
        "ttft_s",
        "ttft_pred_s",
        "tpot_s",
        "tpot_pred_s",
        "ttft_err",
        "tpot_err",
    ]
    return ok.sort_values("worst", ascending=False)[cols].head(n)
