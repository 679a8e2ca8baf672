"""Baselines and their comparison with a fresh run.

A baseline is a JSON file: the suite's name, and for each entry the
fingerprint of its definition and its figure values.  It is written with
sorted keys and Python's round-trip float repr, so rewriting it from an
identical run gives identical bytes.  Comparing yields one :class:`Row` per
(entry, figure): ``held``, ``moved`` (beyond tolerance), ``new`` (not in the
baseline) or ``removed`` (in the baseline, no longer watched).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from simulator.inputs import read_json
from simulator.regress.figures import ALL_FIGURES
from simulator.regress.runner import Figures
from simulator.regress.suite import LoadedSuite, RegressError

if TYPE_CHECKING:
    import pandas as pd

FORMAT = "epdsim-regress-baseline/1"
FAILING = ("moved", "new")


@dataclass(frozen=True)
class Row:
    """One figure of one entry, old against new.

    ``change`` is new - old and ``rel_change`` (new - old) / |old|, None when
    either side is missing or non-finite.  ``redefined`` is True when the
    entry's definition changed since the baseline (so a move may be the
    question changing rather than the answer).
    """

    entry: str
    figure: str
    unit: str
    old: float | str | None
    new: float | str | None
    tolerance: str
    status: str
    redefined: bool = False

    @property
    def change(self) -> float | None:
        old, new = self.old, self.new
        if not isinstance(old, (int, float)) or not isinstance(new, (int, float)):
            return None  # absent, non-finite, or a label
        return new - old

    @property
    def rel_change(self) -> float | None:
        c, old = self.change, self.old
        # a change means both sides are numbers
        return None if c is None or not isinstance(old, (int, float)) or old == 0 else c / abs(old)

    @property
    def failed(self) -> bool:
        return self.status in FAILING


def _is_label(name: str) -> bool:
    """A figure whose value is a label (the planner's recommended layout), not a number."""
    fig = ALL_FIGURES.get(name)
    return fig is not None and fig.unit == "label"


def baseline_record(loaded: LoadedSuite, figures: dict[str, Figures]) -> dict:
    """The JSON-ready baseline of a run."""
    return {
        "format": FORMAT,
        "suite": loaded.name,
        "entries": {e.id: {"fingerprint": e.fingerprint, "figures": figures[e.id]} for e in loaded.entries},
    }


def write_baseline(path: str | Path, loaded: LoadedSuite, figures: dict[str, Figures]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(baseline_record(loaded, figures), indent=2, sort_keys=True) + "\n")
    return path


def read_baseline(path: str | Path, loaded: LoadedSuite, must_exist: bool = True) -> dict | None:
    """The baseline at ``path`` for ``loaded``'s suite (None if absent and not ``must_exist``).

    Raises :class:`RegressError` if it is not a baseline, or belongs to another suite.
    """
    path = Path(path)
    if not path.exists() and not must_exist:
        return None
    if not path.exists() and not any(a.is_file() for a in path.parents):
        raise RegressError(
            f"baseline '{path}' does not exist; create it from the current code with "
            f"`epdsim regress {loaded.path} --baseline {path} --update`"
        )
    data = read_json(path, RegressError, "regress baseline")  # a folder or a device is named as such
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise RegressError(
            f"baseline '{path}' is not an epdsim regress baseline (expected \"format\": "
            f'"{FORMAT}"); point --baseline at the file written by --update'
        )
    for eid, rec in data["entries"].items():
        figs = rec.get("figures") if isinstance(rec, dict) else None
        bad = (
            f"entries.{eid} is a {type(rec).__name__}, not a mapping"
            if not isinstance(rec, dict)
            else f"entries.{eid}.figures is missing or not a mapping"
            if not isinstance(figs, dict)
            else f"entries.{eid}.fingerprint is not a string"
            if not isinstance(rec.get("fingerprint", ""), str)
            else next(
                (
                    f"entries.{eid}.figures.{k}={v!r} is not a number"
                    for k, v in figs.items()
                    if v is not None
                    and (
                        isinstance(v, bool)
                        or not isinstance(v, (int, float, str))
                        or (isinstance(v, str) and not _is_label(k))
                    )
                ),
                None,
            )
        )
        if bad:
            raise RegressError(f"baseline '{path}': {bad}; restore it from git or rewrite it with --update")
    if data.get("suite") != loaded.name:
        raise RegressError(
            f"baseline '{path}' belongs to suite {data.get('suite')!r}, but {loaded.path} is suite "
            f"{loaded.name!r}; give the baseline of this suite, or create one with --update "
            "and a new --baseline path"
        )
    return data


def _unit(name: str) -> str:
    return ALL_FIGURES[name].unit if name in ALL_FIGURES else ""


def _tol_text(tol, unit: str) -> str:
    return "identical" if unit == "label" else tol.describe()


def compare(loaded: LoadedSuite, old: dict | None, new: dict[str, Figures], old_label: str = "baseline") -> list[Row]:
    """One row per watched figure (and per baseline figure no longer watched), in suite order."""
    base = (old or {}).get("entries", {})
    rows: list[Row] = []
    for e in loaded.entries:
        was = base.get(e.id, {})
        redefined = bool(was) and was.get("fingerprint") not in (None, e.fingerprint)
        old_figs = was.get("figures", {})
        for name, tol in e.tolerances.items():
            unit = _unit(name)
            if name not in old_figs:
                rows.append(Row(e.id, name, unit, None, new[e.id][name], _tol_text(tol, unit), "new", redefined))
                continue
            o, n = old_figs[name], new[e.id][name]
            rows.append(
                Row(e.id, name, unit, o, n, _tol_text(tol, unit), "held" if tol.holds(o, n) else "moved", redefined)
            )
        for name in sorted(set(old_figs) - set(e.tolerances)):
            rows.append(Row(e.id, name, _unit(name), old_figs[name], None, "", "removed", redefined))
    ids = {e.id for e in loaded.entries}
    for gone in sorted(set(base) - ids):
        for name, o in sorted(base[gone].get("figures", {}).items()):
            rows.append(Row(gone, name, _unit(name), o, None, "", "removed"))
    return rows


def rows_frame(rows: list[Row]) -> pd.DataFrame:
    """The comparison as a DataFrame (one row per figure, with change and rel_change)."""
    import pandas as pd  # noqa: PLC0415 - the CLI starts without pandas

    return pd.DataFrame(
        [asdict(r) | {"change": r.change, "rel_change": r.rel_change} for r in rows],
        columns=["entry", "figure", "unit", "old", "new", "change", "rel_change", "tolerance", "status", "redefined"],
    )
