"""Readers for request traces: Azure LLM CSV, Mooncake JSONL and a plain format.

Every reader returns a :class:`Trace`: arrival times in seconds relative to the
first request (float64, sorted, ``arrival_s[0] == 0``), prompt and output
lengths in tokens (int64, each >= 1) and, when the file has them, per-request
prefix-block hashes.

Rules applied to every format (the same rules, the same messages):

* A malformed row raises :class:`TraceError` naming the file, the line number,
  the column, the offending value and what was expected.  Validation is
  vectorised (masks over whole columns); only the first bad line is reported.
* A prompt of 0 tokens is an error: no request can be served without one.
* An output of 0 tokens is clamped to 1 (with a :class:`TraceWarning` and a
  note on the trace giving the count and first line): a served request always
  produces at least the token that ends its prefill, and traces of failed or
  cancelled requests (e.g. BurstGPT) record such rows.
* Unsorted arrivals are sorted stably (ties keep file order, which preserves
  turn order in multi-turn traces), again with a warning and a note.
* An empty file, a file with a header but no rows, and missing columns or keys
  are errors.

Formats (``fmt`` of :func:`read_trace`):

``azure``
    CSV ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps such as
    ``2023-11-16 18:15:46.6805900`` (Azure/AzurePublicDataset, 2023 and 2024).
``mooncake``
    JSONL with ``timestamp`` (milliseconds), ``input_length``,
    ``output_length`` and optional ``hash_ids`` (one id per 512-token block).
``plain``
    CSV or JSONL with ``arrival_s`` (seconds), ``input_tokens``,
    ``output_tokens`` and optional ``hash_ids`` (JSON list, or in CSV a string
    of ids separated by spaces or commas), also assumed 512-token blocks.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from simulator.trace_files import Table, TraceError, check_readable, numbers_of, read_csv_rows, read_jsonl

TraceFormat = Literal["azure", "mooncake", "plain", "auto"]
Role = Literal["input", "output"]

HASH_BLOCK_TOKENS = 512
"""Tokens per prefix-hash block in Mooncake traces (and assumed for plain ones)."""

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
MOONCAKE_KEYS = ("timestamp", "input_length", "output_length")
PLAIN_COLUMNS = ("arrival_s", "input_tokens", "output_tokens")
_JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")


class TraceWarning(UserWarning):
    """A trace was read but adjusted (zero outputs clamped, rows sorted)."""


@dataclass(frozen=True, eq=False)
class Trace:
    """Requests read from a trace file.

    Invariants (checked on construction): all arrays are 1-D, of equal length
    n >= 1 and read-only; ``arrival_s`` is float64 seconds, finite,
    non-decreasing, with ``arrival_s[0] == 0``; token counts are int64 >= 1;
    ``hash_ids``, when present, has one tuple of block ids per request and
    ``hash_block_tokens`` gives the tokens per block.  ``notes`` lists the
    adjustments the reader made (also issued as :class:`TraceWarning`).
    """

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: tuple[tuple[int, ...], ...] | None = None
    hash_block_tokens: int | None = None
    source: str = ""
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        for name in ("arrival_s", "input_tokens", "output_tokens"):
            arr = getattr(self, name)
            if arr.ndim != 1 or len(arr) != n:
                raise ValueError(f"Trace.{name} must be 1-D with {n} entries")
            arr.flags.writeable = False
        if n == 0:
            raise ValueError("a Trace needs at least one request")
        if self.hash_ids is not None and len(self.hash_ids) != n:
            raise ValueError(f"Trace.hash_ids must have {n} entries")
        if self.arrival_s[0] != 0 or np.any(np.diff(self.arrival_s) < 0):
            raise ValueError("Trace.arrival_s must start at 0 and be non-decreasing")
        if self.input_tokens.min() < 1 or self.output_tokens.min() < 1:
            raise ValueError("Trace token counts must be >= 1")

    def __len__(self) -> int:
        return len(self.arrival_s)


MAX_ABS_SECONDS = 1e11
"""Largest arrival time (s, either sign) a trace may give: about 3,000 years."""


def _tokens(t: Table, column: str, role: Role, notes: list[str]) -> np.ndarray:
    """Validated token counts: integers >= 1 for prompts; >= 0 for outputs, 0 clamped to 1."""
    x = numbers_of(t.df[column])
    lowest = 1 if role == "input" else 0
    bad = ~np.isfinite(x) | (x != np.floor(x)) | (x < lowest) | (x >= 2.0**53)
    if bad.any():
        what = "a positive integer (prompt tokens)" if role == "input" else "a non-negative integer"
        raise t.fail(int(np.argmax(bad)), column, what)
    out = x.astype(np.int64)
    zero = out == 0
    if zero.any():
        msg = (
            f"{t.path}: {int(zero.sum())} row(s) have {column}=0 (first at line "
            f"{t.lines[int(np.argmax(zero))]}); clamped to 1 output token"
        )
        warnings.warn(msg, TraceWarning, stacklevel=4)
        notes.append(msg)
        out[zero] = 1
    return out


def _seconds(t: Table, column: str, unit_s: float) -> np.ndarray:
    x = numbers_of(t.df[column]) * unit_s
    bad = ~np.isfinite(x) | (np.abs(x) > MAX_ABS_SECONDS)
    if bad.any():
        raise t.fail(int(np.argmax(bad)), column, "a number (a finite time within ±1e11 s)")
    return x


def _hash_ids(t: Table, column: str) -> tuple[tuple[int, ...], ...] | None:
    """Per-row block ids from JSON lists or CSV strings like ``"1 2 3"`` / ``"[1, 2, 3]"``."""
    if column not in t.df.columns:
        return None
    rows = []
    for i, v in enumerate(t.df[column].tolist()):
        if isinstance(v, str):
            try:
                v = [int(s) for s in v.strip().strip("[]").replace(",", " ").split()]
            except ValueError:
                v = None
        if not isinstance(v, list) or not all(type(h) is int and -(2**63) <= h < 2**63 for h in v):
            raise t.fail(i, column, "a list of integer block ids")
        rows.append(tuple(v))
    return tuple(rows)


def _check_hashes(t: Table, column: str, hashes, inp: np.ndarray) -> None:
    """A row cannot name more prefix blocks than its prompt fills (``HASH_BLOCK_TOKENS`` tokens each)."""
    if hashes is None:
        return
    blocks = np.fromiter((len(h) for h in hashes), dtype=np.int64, count=len(hashes))
    most = -(-inp // HASH_BLOCK_TOKENS)
    bad = blocks > most
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(
            f"{t.path} line {t.lines[i]}: {column} lists {blocks[i]} blocks but the prompt's "
            f"{inp[i]} tokens fill at most {most[i]} blocks of {HASH_BLOCK_TOKENS}; give one id per "
            f"{HASH_BLOCK_TOKENS}-token block of the prompt"
        )


def _finish(
    t: Table,
    arrival: np.ndarray,
    inp: np.ndarray,
    out: np.ndarray,
    hashes: tuple[tuple[int, ...], ...] | None,
    notes: list[str],
) -> Trace:
    """Sort stably by arrival if needed, shift to start at 0, and build the Trace."""
    backwards = np.diff(arrival) < 0
    if backwards.any():
        msg = (
            f"{t.path}: {int(backwards.sum())} arrival(s) earlier than the row before "
            f"(first at line {t.lines[int(np.argmax(backwards)) + 1]}); rows sorted by "
            f"arrival time, ties kept in file order"
        )
        warnings.warn(msg, TraceWarning, stacklevel=3)
        notes.append(msg)
        order = np.argsort(arrival, kind="stable")
        arrival, inp, out = arrival[order], inp[order], out[order]
        if hashes is not None:
            hashes = tuple(hashes[i] for i in order)
    return Trace(
        arrival_s=arrival - arrival[0],
        input_tokens=inp,
        output_tokens=out,
        hash_ids=hashes,
        hash_block_tokens=HASH_BLOCK_TOKENS if hashes is not None else None,
        source=t.path,
        notes=tuple(notes),
    )


def read_azure_csv(path: str | Path, limit: int | None = None) -> Trace:
    """Read an Azure LLM inference trace (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    ``limit`` reads at most that many rows.  Raises :class:`TraceError`.
    """
    import pandas as pd  # noqa: PLC0415 - heavy (pandas): the CLI starts without it

    expected = (
        "each row must be TIMESTAMP,ContextTokens,GeneratedTokens, e.g. "
        "'2023-11-16 18:15:46.6805900,374,44', below that header line"
    )
    t = read_csv_rows(Path(path), AZURE_COLUMNS, (), expected, limit)
    try:
        stamps = pd.to_datetime(t.df["TIMESTAMP"], format="ISO8601", errors="coerce")
    except (ValueError, TypeError, OverflowError) as exc:
        raise TraceError(
            f"{t.path}: the TIMESTAMP column cannot be read as one time line ({str(exc)[:160]}); "
            f"give every timestamp in the same time zone, or none; {expected}."
        ) from None
    if not isinstance(stamps.dtype, (np.dtype, pd.DatetimeTZDtype)) or stamps.dtype == object:
        raise TraceError(
            f"{t.path}: the TIMESTAMP column mixes time zones (or zone-less and zoned times); "
            f"give every timestamp in the same time zone, or none; {expected}."
        )
    bad = stamps.isna().to_numpy()
    if bad.any():
        raise t.fail(int(np.argmax(bad)), "TIMESTAMP", "a timestamp like 2023-11-16 18:15:46.6805900")
    arrival = ((stamps - stamps.iloc[0]) / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64)
    notes: list[str] = []
    inp = _tokens(t, "ContextTokens", "input", notes)
    out = _tokens(t, "GeneratedTokens", "output", notes)
    return _finish(t, arrival, inp, out, None, notes)


def read_mooncake_jsonl(path: str | Path, limit: int | None = None) -> Trace:
    """Read a Mooncake trace: JSONL, ``timestamp`` in ms, lengths in tokens, ``hash_ids``.

    ``limit`` reads at most that many requests.  Raises :class:`TraceError`.
    """
    expected = (
        'each line must be a JSON object like {"timestamp": 27482, "input_length": 6955, '
        '"output_length": 52, "hash_ids": [46, 47]} (timestamp in milliseconds)'
    )
    t = read_jsonl(Path(path), MOONCAKE_KEYS, ("hash_ids",), expected, limit)
    notes: list[str] = []
    arrival = _seconds(t, "timestamp", 1e-3)
    inp = _tokens(t, "input_length", "input", notes)
    out = _tokens(t, "output_length", "output", notes)
    hashes = _hash_ids(t, "hash_ids")
    _check_hashes(t, "hash_ids", hashes, inp)
    return _finish(t, arrival, inp, out, hashes, notes)


def read_plain(path: str | Path, limit: int | None = None) -> Trace:
    """Read a plain trace: CSV or JSONL with ``arrival_s,input_tokens,output_tokens[,hash_ids]``.

    JSONL is chosen by suffix (``.jsonl``, ``.json``, ``.ndjson``) or a first
    character ``{``; anything else is read as CSV.  Raises :class:`TraceError`.
    """
    path = Path(path)
    expected = "each row must give arrival_s (seconds), input_tokens and output_tokens (integers), optionally hash_ids"
    if _looks_jsonl(path):
        t = read_jsonl(path, PLAIN_COLUMNS, ("hash_ids",), expected, limit)
    else:
        t = read_csv_rows(path, PLAIN_COLUMNS, ("hash_ids",), expected, limit)
    notes: list[str] = []
    arrival = _seconds(t, "arrival_s", 1.0)
    inp = _tokens(t, "input_tokens", "input", notes)
    out = _tokens(t, "output_tokens", "output", notes)
    hashes = _hash_ids(t, "hash_ids")
    _check_hashes(t, "hash_ids", hashes, inp)
    return _finish(t, arrival, inp, out, hashes, notes)


def _first_line(path: Path) -> str:
    check_readable(path)
    with path.open(encoding="utf-8", errors="replace") as fh:
        for text in fh:
            if text.strip():
                return text.strip()
    raise TraceError(f"{path} is empty; a trace needs a header or JSON object per request.")


def _looks_jsonl(path: Path) -> bool:
    if path.suffix.lower() in _JSONL_SUFFIXES:
        return True
    return path.suffix.lower() != ".csv" and _first_line(path).startswith("{")


def detect_format(path: str | Path) -> Literal["azure", "mooncake", "plain"]:
    """Guess a trace's format from its first non-blank line.  Raises :class:`TraceError`."""
    path = Path(path)
    first = _first_line(path)
    if first.startswith("{"):
        try:
            keys = set(json.loads(first))
        except (json.JSONDecodeError, TypeError):
            keys = set()
    else:
        keys = {c.strip() for c in first.split(",")}
    if set(AZURE_COLUMNS) <= keys:
        return "azure"
    if set(MOONCAKE_KEYS) <= keys:
        return "mooncake"
    if set(PLAIN_COLUMNS) <= keys:
        return "plain"
    raise TraceError(
        f"{path}: cannot tell the trace format from its first line {first[:120]!r}; expected "
        f"an Azure CSV header ({','.join(AZURE_COLUMNS)}), Mooncake JSONL keys "
        f"({','.join(MOONCAKE_KEYS)}[,hash_ids]) or plain columns ({','.join(PLAIN_COLUMNS)}"
        f"[,hash_ids]); pass the format explicitly, or for a file of lengths without arrival "
        f"times use an empirical or pairs length distribution instead."
    )


_READERS = {"azure": read_azure_csv, "mooncake": read_mooncake_jsonl, "plain": read_plain}


def read_trace(path: str | Path, fmt: str = "auto", limit: int | None = None) -> Trace:
    """Read a trace in format ``fmt``, one of :data:`TraceFormat` (``"auto"`` detects it; another name is
    refused here, as a load shape's ``format`` is any text).  Raises :class:`TraceError`."""
    if fmt == "auto":
        fmt = detect_format(path)
    try:
        reader = _READERS[fmt]
    except KeyError:
        raise TraceError(f"unknown trace format {fmt!r}; use one of {', '.join(_READERS)} or 'auto'") from None
    return reader(path, limit=limit)


def read_token_columns(path: str | Path, columns: Mapping[str, Role]) -> dict[str, np.ndarray]:
    """Read whole columns of token counts (CSV, or JSONL by suffix) for length distributions.

    ``columns`` maps each column name to its role: ``"input"`` columns must
    hold integers >= 1; ``"output"`` columns integers >= 0, zeros clamped to 1
    with a :class:`TraceWarning`.  Returns int64 arrays in file order.
    Raises :class:`TraceError`.
    """
    path = Path(path)
    names = tuple(columns)
    expected = f"each row must give integer token counts in column(s) {','.join(names)}"
    read = read_jsonl if _looks_jsonl(path) else read_csv_rows
    t = read(path, names, (), expected, None)
    notes: list[str] = []
    return {name: _tokens(t, name, role, notes) for name, role in columns.items()}
