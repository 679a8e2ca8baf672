"""Reading trace files safely: headed CSV and JSON Lines into raw string/object columns with line numbers.

The format readers (:mod:`simulator.traces`, image catalogues in :mod:`simulator.epd.multimodal`) turn a
:class:`Table` into typed arrays; everything here only checks that the file is readable text, finds the
columns or keys, and names the first bad line (file, line, what was expected) in a :class:`TraceError`.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simulator.inputs import check_file, decode

if TYPE_CHECKING:
    import pandas as pd


class TraceError(ValueError):
    """A trace or length file cannot be read; the message names file, line, column and fix."""


@dataclass(frozen=True)
class Table:
    """Raw columns of a file: ``df`` (str for CSV, Python objects for JSONL) and 1-based ``lines``."""

    path: str
    df: pd.DataFrame
    lines: np.ndarray
    expected: str

    def fail(self, i: int, column: str, what: str) -> TraceError:
        raw = self.df[column].iloc[i]
        return TraceError(f"{self.path} line {self.lines[i]}: {column}={raw!r} is not {what}; {self.expected}.")


def _missing_file(path: Path) -> TraceError:
    """The error for a path that is not a readable text file (missing, a folder, binary, UTF-16)."""
    try:
        check_file(path, TraceError, "trace")
        with path.open("rb") as fh:
            decode(
                fh.read(65536).rsplit(b"\n", 1)[0] if path.stat().st_size > 65536 else fh.read(),
                str(path),
                TraceError,
                "trace",
            )
    except TraceError as exc:
        return exc
    return TraceError(f"{path}: cannot be read as a trace; check the path")


def check_readable(path: Path) -> None:
    """Raise the :func:`_missing_file` error unless ``path`` is a file that starts as UTF-8 text."""
    if not path.is_file():
        raise _missing_file(path)
    with path.open("rb") as fh:
        head = fh.read(65536)
    if head[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in head:
        raise _missing_file(path)


def read_csv_rows(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...], expected: str, limit: int | None
) -> Table:
    """Read a headed CSV as strings, keeping each row's line number (header = line 1)."""
    import pandas as pd  # noqa: PLC0415 - heavy (pandas): the CLI starts without it

    check_readable(path)
    try:
        with warnings.catch_warnings():  # a too-wide first row is only a ParserWarning
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(
                path,
                dtype=str,
                keep_default_na=False,
                skip_blank_lines=False,
                nrows=limit,
                skipinitialspace=True,
                index_col=False,
            )
    except pd.errors.EmptyDataError:
        raise TraceError(f"{path} is empty; {expected}.") from None
    except UnicodeDecodeError:
        raise TraceError(
            f"{path}{_bad_utf8_line(path)}: not UTF-8 text (latin-1 or another legacy encoding?); "
            f"save the trace as UTF-8"
        ) from None
    except (pd.errors.ParserError, pd.errors.ParserWarning) as exc:
        where = _wide_row(path) or f": not a readable CSV ({str(exc).strip()})"
        raise TraceError(f"{path}{where}; {expected}.") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise TraceError(
            f"{path} line 1: header lacks column(s) {','.join(missing)} (found {','.join(df.columns)}); {expected}."
        )
    lines = np.arange(2, len(df) + 2)
    blank = (df == "").all(axis=1).to_numpy()
    if blank.any():  # blank lines (often trailing) are skipped, line numbers kept
        df, lines = df.loc[~blank].reset_index(drop=True), lines[~blank]
    if len(df) == 0:
        raise TraceError(f"{path} has a header but no rows; {expected}.")
    keep = [c for c in (*required, *optional) if c in df.columns]
    return Table(str(path), df[keep], lines, expected)


def _bad_utf8_line(path: Path) -> str:
    """' line N' for the first line of ``path`` that is not UTF-8, else ''."""
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return f" line {lineno}"
    return ""


def _wide_row(path: Path) -> str:
    """' line N: ...' for the first row with more comma-separated fields than the header, else ''."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        width = None
        for lineno, text in enumerate(fh, start=1):
            fields = text.count(",") + 1
            if width is None:
                width = fields
            elif fields > width and text.strip():
                return f" line {lineno}: {fields} fields but the header has {width}"
    return ""


def read_jsonl(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...], expected: str, limit: int | None
) -> Table:
    """Read JSON Lines, one object per non-blank line, keeping line numbers (stops after ``limit``)."""
    import pandas as pd  # noqa: PLC0415 - heavy (pandas): the CLI starts without it

    check_readable(path)
    records: list[dict] = []
    lines: list[int] = []
    with path.open(encoding="utf-8", errors="surrogateescape") as fh:
        for lineno, text in enumerate(fh, start=1):
            if any("\udc80" <= ch <= "\udcff" for ch in text):
                raise TraceError(
                    f"{path} line {lineno}: not UTF-8 text (latin-1 or another legacy "
                    f"encoding?); save the trace as UTF-8"
                )
            if not text.strip():
                continue
            if limit is not None and len(records) >= limit:
                break
            try:
                rec = json.loads(text, parse_constant=_reject_constant)
            except RecursionError:
                raise TraceError(f"{path} line {lineno}: nested too deeply; {expected}.") from None
            except ValueError as exc:
                if not isinstance(exc, json.JSONDecodeError):
                    raise TraceError(f"{path} line {lineno}: {exc}; {expected}.") from None
                raise TraceError(f"{path} line {lineno}: not valid JSON ({exc.msg}); {expected}.") from None
            if not isinstance(rec, dict):
                raise TraceError(f"{path} line {lineno}: expected a JSON object, got {type(rec).__name__}; {expected}.")
            missing = [k for k in required if k not in rec]
            if missing:
                raise TraceError(f"{path} line {lineno}: missing key(s) {','.join(missing)}; {expected}.")
            records.append(rec)
            lines.append(lineno)
    if not records:
        raise TraceError(f"{path} is empty; {expected}.")
    cols = {
        k: [r.get(k) for r in records] for k in (*required, *optional) if k in required or any(k in r for r in records)
    }
    df = pd.DataFrame({k: pd.Series(v, dtype=object) for k, v in cols.items()})
    return Table(str(path), df, np.asarray(lines), expected)


def numbers_of(col: pd.Series) -> np.ndarray:
    """Column as float64; anything that is not a number (or is a bool) becomes NaN."""
    import pandas as pd  # noqa: PLC0415 - heavy (pandas): the CLI starts without it

    if col.dtype == object:
        col = col.map(lambda v: v if isinstance(v, (int, float, str)) and not isinstance(v, bool) else None)
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")
