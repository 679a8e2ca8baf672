"""Measured serving runs (``../shared/data/e2e/serving_measurements.csv``) as epdsim scenarios.

Each row of that table is one benchmark run: a client at a fixed concurrency
(``batch_size``) sending fixed nominal input/output lengths (``isl``, ``osl``)
to one engine (vLLM, SGLang, TensorRT-LLM) on one GPU type with one parallel
layout, reporting mean TTFT and TPOT in milliseconds.  :func:`load_rows`
reads the table (each run once, in the layout its server ran);
:mod:`calibration.e2e.scenarios` turns a row the simulator can express into a
scenario dict, and says why it cannot for the others.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TABLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "e2e" / "serving_measurements.csv"

# The table's system names and the hwdb GPU entries they are (aliases resolve the rest).
SYSTEMS = {
    "h100_sxm": "H100-SXM-80GB",
    "h200_sxm": "H200-SXM-141GB",
    "b200_sxm": "B200-SXM-180GB",
    "gb200": "GB200",
    "b300_sxm": "B300-SXM",
    "gb300": "GB300",
}
ENGINES = {"vllm": "vllm-v1", "sglang": "sglang", "trtllm": "trtllm"}
# Weight formats: fp8_block is DeepSeek-style 128x128 block scaling (fp8 tensor cores, scales
# negligible in bytes); nvfp4 is 4-bit with an fp8 scale per 16 weights; int4_wo is weight-only
# int4 with bf16 activations (W4A16).
# The benchmark client that produced the table (see docs/validation/e2e.md): InferenceX-style
# `benchmark_serving.py --dataset-name random --random-range-ratio 0.8 --num-prompts 10*C
# --max-concurrency C --ignore-eos`, warm-up requests run before and excluded.
RANGE_RATIO = 0.8
REQUESTS_PER_CLIENT = 10
QUANT = {"bf16": "bf16", "fp16": "fp16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "int4_wo": "int4"}


@dataclass(frozen=True)
class Row:
    """One measured run, in the table's own terms (times in seconds)."""

    id: str
    backend: str
    version: str
    model: str
    system: str
    quant: str
    precision: str
    isl: int
    osl: int
    concurrency: int
    tp: int
    pp: int
    dp: int
    moe_tp: int
    moe_ep: int
    ttft_s: float
    tpot_s: float
    disagg: bool
    # Rows of the table holding this same measurement (the same run listed under several source
    # files, e.g. 2026_03_25_... and 2026_04_06_... ids): counted once, the first id kept.
    copies: int = 1
    # Disaggregated runs: (workers, tp, dp, moe_tp, moe_ep) of the prefill side and of the decode side;
    # () when the table does not give the worker counts.
    sides: tuple = ()

    @property
    def subset(self) -> str:
        """The validation subset: engine x GPU x model x precision x TP."""
        quant = self.quant if self.quant in QUANT else self.precision

        def lay(tp, dp, ep):
            return f"tp{tp}" + (f" dp{dp}" if dp > 1 else "") + (f" ep{ep}" if ep > 1 else "")

        if self.sides:
            (pw, ptp, pdp, _, pep), (dw, dtp, ddp, _, dep) = self.sides
            layout = f"PD {pw}x({lay(ptp, pdp, pep)}) + {dw}x({lay(dtp, ddp, dep)})"
        else:
            layout = lay(self.tp, self.dp, self.moe_ep)
        return f"{self.backend} {self.system} {self.model.split('/')[-1]} {quant} {layout}"


def _int(x, default: int = 1) -> int:
    return default if x is None or (isinstance(x, float) and math.isnan(x)) else int(x)


COLUMNS = (
    "id",
    "backend",
    "backend_version",
    "model_path",
    "system",
    "precision",
    "mode",
    "isl",
    "osl",
    "gemm_quant_mode",
    "batch_size",
    "tp_size",
    "pp_size",
    "attention_dp_size",
    "moe_tp_size",
    "moe_ep_size",
    "silicon_ttft_ms",
    "silicon_tpot_ms",
)


class TableError(ValueError):
    """The measurement table cannot be read as one (a user error: the message names the file and the fix)."""


def load_rows(path: str | Path = DEFAULT_TABLE) -> list[Row]:
    """The measurement table's runs in file order, each once (raises :class:`TableError`).

    A run listed several times (the same configuration and the same measured figures under several
    source files, or under several encodings of its layout) is kept once, with ``copies`` counting the
    listings, so that no measurement weighs double in a score.  ``concurrency`` is the client's total:
    the table's ``batch_size`` is per attention data-parallel rank."""
    import pandas as pd  # noqa: PLC0415 - heavy (pandas): the CLI starts without it

    try:
        df = pd.read_csv(path, dtype={"backend_version": str})
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError, OSError) as exc:
        raise TableError(
            f"{path}: not a readable CSV measurement table ({type(exc).__name__}: "
            f"{str(exc)[:120]}); give ../shared/data/e2e/serving_measurements.csv or a CSV "
            f"with its columns"
        ) from None
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise TableError(
            f"{path}: lacks the column(s) {', '.join(missing)} of a serving measurement table "
            f"(../shared/data/e2e/README.md lists them)"
        )
    for c in ("isl", "osl", "batch_size", "tp_size", "silicon_ttft_ms", "silicon_tpot_ms"):
        if not pd.api.types.is_numeric_dtype(df[c]):
            raise TableError(f"{path}: column {c} must hold numbers (found e.g. {df[c].iloc[0]!r})")
    rows: dict[tuple, Row] = {}
    for r in df.itertuples(index=False):
        dp = _int(r.attention_dp_size)
        row = Row(
            id=str(r.id),
            backend=str(r.backend),
            version=str(r.backend_version),
            model=str(r.model_path),
            system=str(r.system),
            quant=str(r.gemm_quant_mode),
            precision=str(r.precision),
            isl=_int(r.isl),
            osl=_int(r.osl),
            # batch_size is per attention data-parallel rank: the client ran batch_size x dp users (vLLM
            # MiniMax-M2.5 on B200: tp2 dp2 at 64 measures what tp2 measures at 128, 28.0 vs 27.9 ms TPOT).
            concurrency=_int(r.batch_size) * dp,
            tp=_int(r.tp_size),
            pp=_int(r.pp_size),
            dp=dp,
            moe_tp=_int(r.moe_tp_size),
            moe_ep=_int(r.moe_ep_size),
            ttft_s=float(r.silicon_ttft_ms) / 1e3,
            tpot_s=float(r.silicon_tpot_ms) / 1e3,
            disagg=str(r.mode) == "disagg",
        )
        row = as_launched(row)
        if row.disagg:
            row = _disagg(row, r)
            # Every column but the id and the source note: the disaggregated layouts' per-side columns too.
            key: tuple = tuple(str(v) for k, v in r._asdict().items() if k not in ("id", "silicon_data_source"))
        else:
            # The same run is also listed under other layout encodings with identical figures (SGLang
            # Qwen3.5-397B: tp4 ep4 again as tp16 with moe 4x4): the layout is not in the key, and the
            # listing on the fewest GPUs is kept.
            key = (
                row.backend,
                row.version,
                row.model,
                row.system,
                row.quant,
                row.precision,
                row.isl,
                row.osl,
                row.concurrency,
                r.silicon_ttft_ms,
                r.silicon_tpot_ms,
            )
        old = rows.get(key)
        rows[key] = row if old is None else kept_copy(old, row)
    return merge_rounded_copies(list(rows.values()))


# The table's vLLM runs with attention dp > 1 all carry moe_ep = tp x dp (the InferenceX database dump and
# the 2026-04-06 file): they encode a config {tp: T, ep: E} as dp E, moe_ep T x E and a batch per "rank".
# They measure what the same config's plain listing measures (MiniMax-M2.5 on H100, tp4 dp4 ep16 against
# tp4 ep4: 10.09 / 12.55 / 15.47 ms TPOT against 10.12 / 12.47 / 15.54 at 4 / 8 / 16 users; Kimi-K2.5
# on B200 alike), so they ran on T GPUs with vLLM's --enable-expert-parallel, experts spread over all T.
# Campaigns whose launch scripts did not pass the expert-parallel setting at all: InferenceX's Kimi-K2.5
# vLLM scripts for B200 and H200 (SemiAnalysisAI/InferenceX benchmarks/single_node/kimik2.5_{fp4,int4}_
# {b200,h200}.sh, March to August 2026) give `vllm serve` --tensor-parallel-size alone, so a config's
# "ep: 4" ran its experts tensor-parallel.
TP_ONLY_LAUNCHES = frozenset(
    {("vllm", "moonshotai/Kimi-K2.5", "b200_sxm"), ("vllm", "moonshotai/Kimi-K2.5", "h200_sxm")}
)


def as_launched(row: Row) -> Row:
    """``row`` with the layout its server ran where the table's encoding or label differs from it
    (``concurrency`` stays the client's total)."""
    if row.disagg or row.backend != "vllm":
        return row
    if row.dp > 1 and row.tp > 1 and row.moe_ep == row.tp * row.dp:
        row = dataclasses.replace(row, dp=1, moe_tp=1, moe_ep=row.tp)
    if (row.backend, row.model, row.system) in TP_ONLY_LAUNCHES and row.moe_ep > 1:
        row = dataclasses.replace(row, moe_tp=row.tp, moe_ep=1)
    return row


def kept_copy(old: Row, new: Row) -> Row:
    """One of two listings of the same run: the one on the fewest GPUs, counting both listings."""
    keep = new if new.tp * new.dp * new.pp < old.tp * old.dp * old.pp else old
    return dataclasses.replace(keep, copies=old.copies + new.copies)


# Two listings whose TTFT and TPOT agree this closely are one measurement: the table repeats runs with
# their figures rounded (Kimi-K2.5 on B200: 169.94070923828986 ms under config 635 of the InferenceX
# database dump, 169.94 ms in the gap-analysis file) or differing in the last float bit (disaggregated
# DeepSeek-R1: 1259.1389953753603 and ...605 ms); distinct runs of one configuration differ by percents.
SAME_FIGURES = 1e-3


def merge_rounded_copies(rows: list[Row]) -> list[Row]:
    """``rows`` with the listings of one run under rounded figures merged (:func:`kept_copy`), order kept.
    Non-disaggregated listings may differ in their layout encoding, disaggregated ones may not."""
    groups: dict[tuple, list[int]] = {}
    out: list[Row | None] = list(rows)
    for i, r in enumerate(rows):
        key = (
            r.backend,
            r.version,
            r.model,
            r.system,
            r.quant,
            r.precision,
            r.isl,
            r.osl,
            r.concurrency,
            r.disagg,
            r.sides,
        )
        for j in groups.setdefault(key, []):
            o = out[j]
            if o is not None and (
                abs(o.ttft_s - r.ttft_s) <= SAME_FIGURES * o.ttft_s
                and abs(o.tpot_s - r.tpot_s) <= SAME_FIGURES * o.tpot_s
            ):
                out[j], out[i] = kept_copy(o, r), None
                break
        else:
            groups[key].append(i)
    return [r for r in out if r is not None]


def _disagg(row: Row, r) -> Row:
    """A disaggregated row with its two sides' layouts and its client concurrency: the source note's
    ``silicon_concurrency`` where it has one (it always equals decode batch x workers x attention dp,
    the decode side's batch being per rank), else that product."""
    if any(_int(getattr(r, f"{side}_num_workers"), 0) < 1 for side in ("prefill", "decode")):
        return row
    sides = tuple(
        (
            _int(getattr(r, f"{side}_num_workers")),
            _int(getattr(r, f"{side}_tp_size")),
            _int(getattr(r, f"{side}_attention_dp_size")),
            _int(getattr(r, f"{side}_moe_tp_size")),
            _int(getattr(r, f"{side}_moe_ep_size")),
        )
        for side in ("prefill", "decode")
    )
    m = re.search(r"silicon_concurrency=(\d+)", str(r.silicon_data_source))
    conc = int(m.group(1)) if m else _int(r.decode_batch_size, 0) * sides[1][0] * sides[1][2]
    return dataclasses.replace(row, sides=sides, concurrency=conc)


def admission_anomaly(row: Row, kv_tokens: int, max_num_seqs: int) -> str:
    """'' or why a measured run cannot have come from an engine that admits every request it has room for.

    Little's law on the closed loop: each of the C users cycles through TTFT + (osl - 1) x TPOT, so the mean
    number of requests decoding is ``N = C (osl - 1) TPOT / (TTFT + (osl - 1) TPOT)``; the others wait or
    prefill.  vLLM's scheduler (like SGLang's and TensorRT-LLM's) admits a waiting request as soon as a
    sequence slot and its KV blocks are free, so a run whose decode batch stays below half of what the
    stated settings hold (``min(C, max_num_seqs, KV capacity in whole requests)``) while most users wait
    was limited by something the table does not state (a smaller max_num_seqs, a stalled client)."""
    cycle = row.ttft_s + (row.osl - 1) * row.tpot_s
    decoding = row.concurrency * (row.osl - 1) * row.tpot_s / cycle
    room = min(row.concurrency, max_num_seqs, kv_tokens // max(1, row.isl + row.osl))
    if decoding < 0.5 * row.concurrency and decoding < 0.5 * room:
        return (
            f"measured run its settings cannot produce: {decoding:.0f} of {row.concurrency} users decoding on "
            f"average (Little's law) where the engine has room for {room}"
        )
    return ""
