"""``epdsim validate-e2e``: the end-to-end validation as a command, a Markdown table and an HTML page.

The command simulates every expressible row of the measured serving table (or
a fixed subset with ``--sample``), prints MAPE and signed bias of mean TTFT and
TPOT per subset (engine x GPU x model x precision x TP) for the fitting and the
held-out families separately, the worst rows, and the rows it could not
express counted by reason; ``--out DIR`` writes ``predictions.csv``,
``e2e.md`` and ``e2e.html``.  ``--max-ttft-mape`` / ``--max-tpot-mape`` make it
a gate (exit 1 when the held-out vLLM figures exceed them).
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from calibration.e2e.rows import DEFAULT_TABLE, RANGE_RATIO, REQUESTS_PER_CLIENT, TableError, load_rows
from calibration.e2e.scenarios import KV_MODES
from simulator.inputs import float_arg, int_arg
from simulator.outputs import OutputPathError, check_output, write_failed

if TYPE_CHECKING:
    import pandas as pd

CLIENT_NOTE = (
    f"Benchmark client modelled: InferenceX-style `benchmark_serving.py --dataset-name random "
    f"--random-range-ratio {RANGE_RATIO} --num-prompts {REQUESTS_PER_CLIENT}xC --max-concurrency C "
    f"--ignore-eos` (lengths uniform on [{RANGE_RATIO}L, L], all C users start together, warm-up "
    f"requests run before and are not counted)."
)


def sample(rows, every: int):
    """A fixed, deterministic subset: every ``every``-th row of the table."""
    return rows[::every]


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:+.1f} %" if abs(x) < 10 else f"{100 * x:+.0f} %"


def _mape(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f} %"


def markdown(df: pd.DataFrame, min_rows: int = 20) -> str:
    """The report as Markdown: summary by split and engine, subsets with >= ``min_rows`` rows, worst rows,
    reasons."""
    from calibration.e2e import score as e2e  # noqa: PLC0415 - pandas and the simulator: only when validating

    lines = [CLIENT_NOTE, ""]
    if "copies" in df and (df["copies"] > 1).any():
        rep = df[df["copies"] > 1]
        lines += [
            f"{int(df['copies'].sum())} table rows hold {len(df)} distinct measured runs: {len(rep)} runs are "
            f"listed more than once (the same configuration and figures, to 0.1 %, under several source files "
            f"or layout encodings) and count once.",
            "",
        ]
    by_engine = e2e.score(df, by=["split", "backend"])
    lines += [
        "| split | engine | rows | TTFT MAPE | TTFT MdAPE | TTFT bias | TPOT MAPE | TPOT MdAPE | TPOT bias |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in by_engine.itertuples():
        lines.append(
            f"| {r.split} | {r.backend} | {r.rows} | {_mape(r.ttft_mape)} | {_mape(r.ttft_mdape)} | "
            f"{_pct(r.ttft_bias)} | {_mape(r.tpot_mape)} | {_mape(r.tpot_mdape)} | {_pct(r.tpot_bias)} |"
        )
    kinds = e2e.score(df.assign(layout=layout_kind(df)), by=["split", "backend", "layout"])
    lines += [
        "",
        "By layout (colocated with one attention rank, colocated with attention data parallelism, "
        "prefill-decode disaggregated):",
        "",
        "| split | engine | layout | rows | TTFT MAPE | TTFT bias | TPOT MAPE | TPOT bias |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in kinds.itertuples():
        lines.append(
            f"| {r.split} | {r.backend} | {r.layout} | {r.rows} | {_mape(r.ttft_mape)} | "
            f"{_pct(r.ttft_bias)} | {_mape(r.tpot_mape)} | {_pct(r.tpot_bias)} |"
        )
    sub = e2e.score(df, by=["split", "backend", "system", "model", "quant"], min_rows=min_rows)
    lines += [
        "",
        f"Subsets (engine x GPU x model x precision, all TP) with at least {min_rows} rows:",
        "",
        "| split | engine | GPU | model | precision | rows | TTFT MAPE | TTFT bias | TPOT MAPE | TPOT bias |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sub.itertuples():
        lines.append(
            f"| {r.split} | {r.backend} | {r.system} | {r.model.split('/')[-1]} | {r.quant} | {r.rows} | "
            f"{_mape(r.ttft_mape)} | {_pct(r.ttft_bias)} | {_mape(r.tpot_mape)} | {_pct(r.tpot_bias)} |"
        )
    tp = e2e.score(df[df["backend"] == "vllm"], by=["split", "tp"])
    lines += [
        "",
        "vLLM by tensor-parallel size:",
        "",
        "| split | TP | rows | TTFT MAPE | TTFT bias | TPOT MAPE | TPOT bias |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in tp.itertuples():
        lines.append(
            f"| {r.split} | {r.tp} | {r.rows} | {_mape(r.ttft_mape)} | {_pct(r.ttft_bias)} | "
            f"{_mape(r.tpot_mape)} | {_pct(r.tpot_bias)} |"
        )
    lines += [
        "",
        "Worst rows (largest of |TTFT error|, |TPOT error|):",
        "",
        "| id | split | isl | osl | C | TTFT meas / pred (ms) | TPOT meas / pred (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in e2e.worst(df, 12).itertuples():
        lines.append(
            f"| {r.id} | {r.split} | {r.isl} | {r.osl} | {r.concurrency} | {1e3 * r.ttft_s:.0f} / "
            f"{1e3 * r.ttft_pred_s:.0f} | {1e3 * r.tpot_s:.1f} / {1e3 * r.tpot_pred_s:.1f} |"
        )
    ex = e2e.excluded(df)
    if len(ex):
        lines += [
            "",
            f"Measured runs left out of the scores ({len(ex)}): simulated, but made with speculative "
            "decoding (`calibration/e2e/spec.py`), or their own figures need more than the hardware has "
            "(`calibration/e2e/physics.py`) or say the server held far fewer requests than its stated settings "
            "admit (`admission_anomaly` in calibration/e2e/rows.py):",
            "",
            "| id | C | TTFT meas / pred (ms) | TPOT meas / pred (ms) | why |",
            "|---|---|---|---|---|",
        ]
        for r in ex.itertuples():
            lines.append(
                f"| {r.id} | {r.concurrency} | {1e3 * r.ttft_s:.0f} / {1e3 * r.ttft_pred_s:.0f} | "
                f"{1e3 * r.tpot_s:.1f} / {1e3 * r.tpot_pred_s:.1f} | {r.excluded} |"
            )
    lines += ["", "Rows not expressed, by reason:", "", "| reason | rows |", "|---|---|"]
    for r in e2e.reasons(df).itertuples():
        lines.append(f"| {r.reason} | {r.rows} |")
    return "\n".join(lines) + "\n"


def layout_kind(df: pd.DataFrame):
    """colocated / colocated DP (attention data parallel) / PD, per row."""
    return np.where(df["disagg"].astype(bool), "PD", np.where(df["dp"] > 1, "colocated DP", "colocated"))


def html_page(df: pd.DataFrame, title: str = "epdsim end-to-end validation") -> str:
    """A self-contained HTML page of the same tables (no scripts)."""
    from calibration.e2e import score as e2e  # noqa: PLC0415 - pandas and the simulator: only when validating

    def table(frame: pd.DataFrame) -> str:
        return frame.to_html(index=False, float_format=lambda x: f"{x:.4g}", border=0)

    parts = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(CLIENT_NOTE)}</p>",
        "<h2>By split and engine</h2>",
        table(e2e.score(df, by=["split", "backend"])),
        "<h2>Subsets</h2>",
        table(e2e.score(df, by=["split", "subset"])),
        "<h2>Worst rows</h2>",
        table(e2e.worst(df, 25)),
        "<h2>Rows not expressed</h2>",
        table(e2e.reasons(df)),
    ]
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{padding:2px 8px;text-align:right}"
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>"
    )


def bands(df: pd.DataFrame) -> dict:
    """Error bands for :mod:`simulator.confidence`: held-out MAPE per engine and per engine x GPU, and
    which model families the table validates (fit or held-out), from a full validation run."""
    from calibration.e2e import score as e2e  # noqa: PLC0415 - pandas and the simulator: only when validating
    from calibration.e2e.rows import SYSTEMS  # noqa: PLC0415 - listed in tests/test_import_structure.py

    ok = e2e.scored(df)
    held = ok[ok["split"] == "held-out"]

    def band(g: pd.DataFrame) -> dict:
        return {
            "ttft_mape": round(float(g["ttft_err"].abs().mean()), 4),
            "tpot_mape": round(float(g["tpot_err"].abs().mean()), 4),
            "rows": int(len(g)),
        }

    out: dict = {
        "source": "epdsim validate-e2e --write-bands (calibration/e2e/report.py) on "
        "../shared/data/e2e/serving_measurements.csv; docs/validation/e2e.md",
        "engines": {},
    }

    def family(model: str) -> str:
        return model.split("/")[-1].removesuffix("-FP8")

    for backend, g in ok.groupby("backend"):
        h = held[held["backend"] == backend]
        # Per family: its own rows' band (held-out rows for held-out families; a fitting family's rows are
        # scored on the terms they fitted, so its band is marked 'fit'); the widest held-out family's band
        # is what a family with no validated runs gets (simulator/confidence.py).
        fam_bands = {family(m): {**band(x), "split": x["split"].iloc[0]} for m, x in g.groupby("model")}
        held_bands = [b for b in fam_bands.values() if b["split"] == "held-out" and b["rows"] >= 20]
        out["engines"][backend] = {
            "all": band(h) if len(h) else None,
            "gpus": {SYSTEMS[s]: band(x) for s, x in h.groupby("system")},
            "families": {family(m): sp for m, sp in g.groupby("model")["split"].first().items()},
            "family_bands": fam_bands,
            "widest": (
                {
                    "ttft_mape": max(b["ttft_mape"] for b in held_bands),
                    "tpot_mape": max(b["tpot_mape"] for b in held_bands),
                    "rows": sum(b["rows"] for b in held_bands),
                }
                if held_bands
                else None
            ),
        }
    return out


def add_subparser(sub) -> None:
    v = sub.add_parser("validate-e2e", help="simulate measured serving runs and report TTFT/TPOT errors per subset")
    v.add_argument("--table", default=str(DEFAULT_TABLE), help="measured runs CSV (default: ../shared/data/e2e/...)")
    v.add_argument(
        "--sample", type=int_arg(1, 100_000), default=1, metavar="K", help="every K-th row only (fixed subset)"
    )
    v.add_argument("--engine", action="append", choices=("vllm", "sglang", "trtllm"), help="only these table backends")
    v.add_argument(
        "--kv",
        choices=KV_MODES,
        default="quantised-fp8",
        help="each row's KV format: fp8 for every quantised run (quantised-fp8, what the table's quantised "
        "campaigns fit; docs/validation/e2e.md), or the engine release's 'auto' for the checkpoint "
        "(rule)",
    )
    v.add_argument("--workers", type=int_arg(1, 256), help="processes (default: all CPUs)")
    v.add_argument("--out", help="folder for predictions.csv, e2e.md and e2e.html")
    v.add_argument(
        "--write-bands",
        metavar="FILE.json",
        help="write the error bands simulate and plan report (the shipped ones live in hwdb/data/validation/e2e.json)",
    )
    v.add_argument(
        "--max-ttft-mape",
        type=float_arg(0.0, 10.0, lo_open=True),
        metavar="F",
        help="exit 1 if held-out vLLM TTFT MAPE exceeds this fraction (0 < F <= 10)",
    )
    v.add_argument(
        "--max-tpot-mape",
        type=float_arg(0.0, 10.0, lo_open=True),
        metavar="F",
        help="exit 1 if held-out vLLM TPOT MAPE exceeds this fraction (0 < F <= 10)",
    )
    v.set_defaults(func=cmd_validate_e2e)


def cmd_validate_e2e(args, con) -> int:
    from calibration.e2e import score as e2e  # noqa: PLC0415 - pandas and the simulator: only when validating

    path = Path(args.table)
    if path.is_dir():
        raise FileNotFoundError(
            f"--table {path}: is a directory; give the CSV file itself (../shared/data/e2e/serving_measurements.csv)"
        )
    if path.exists() and not path.is_file():
        raise FileNotFoundError(
            f"--table {path}: not a regular file (a device, FIFO or socket); give the CSV "
            f"file itself (../shared/data/e2e/serving_measurements.csv)"
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"--table {path}: no such file; the measured runs live in ../shared/data/e2e/serving_measurements.csv"
        )
    # before the simulations (minutes on the full table): an output that cannot be written is known now
    if args.out:
        check_output(args.out, "--out", folder=True, error=OutputPathError)
    if args.write_bands:
        check_output(args.write_bands, "--write-bands", folder=False, error=OutputPathError)
    try:
        rows = [r for r in load_rows(path) if not args.engine or r.backend in args.engine]
    except TableError as exc:
        from simulator.errors import print_user_error  # noqa: PLC0415 - listed in tests/test_import_structure.py

        return print_user_error(exc)
    rows = sample(rows, max(1, args.sample))
    t0 = time.perf_counter()
    df = e2e.predict(rows, workers=args.workers, kv_mode=args.kv)
    wall = time.perf_counter() - t0
    con.print(markdown(df), markup=False, highlight=False)
    done = int((df["reason"] == "").sum())
    con.print(f"{done} of {len(df)} rows simulated in {wall:.1f} s", markup=False)
    if args.out:
        out = Path(args.out)
        try:
            out.mkdir(parents=True, exist_ok=True)
            df.to_csv(out / "predictions.csv", index=False)
            (out / "e2e.md").write_text(markdown(df))
            (out / "e2e.html").write_text(html_page(df))
        except OSError as exc:
            raise OutputPathError(write_failed(exc, "--out", out)) from None
    if args.write_bands:
        try:
            Path(args.write_bands).parent.mkdir(parents=True, exist_ok=True)
            Path(args.write_bands).write_text(json.dumps(bands(df), indent=1, sort_keys=True) + "\n")
        except OSError as exc:
            raise OutputPathError(write_failed(exc, "--write-bands", args.write_bands)) from None
    held = e2e.score(df[(df["backend"] == "vllm") & (df["split"] == "held-out")], by=["backend"])
    if len(held):
        h = held.iloc[0]
        bad = [
            f"TTFT MAPE {h.ttft_mape:.1%} > {args.max_ttft_mape:.1%}"
            for _ in [0]
            if args.max_ttft_mape is not None and h.ttft_mape > args.max_ttft_mape
        ]
        bad += [
            f"TPOT MAPE {h.tpot_mape:.1%} > {args.max_tpot_mape:.1%}"
            for _ in [0]
            if args.max_tpot_mape is not None and h.tpot_mape > args.max_tpot_mape
        ]
        if bad:
            con.print("held-out vLLM rows: " + "; ".join(bad), markup=False)
            return 1
    return 0
