"""A regression suite: scenarios and plan requests to run, the figures to watch on each, and their tolerances.

Read from YAML by :func:`load_suite`, which validates every field (the fields:
:mod:`simulator.regress.suite_schema`) and every scenario and plan request the
suite names, so that a bad suite fails before anything runs.  Relative scenario,
request and hwdb paths are relative to the suite file.  Errors are
:class:`RegressError` paragraphs naming the suite file, the field, the value
and the fix.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from simulator.errors import format_validation_error
from simulator.errors import models_in as _models_in
from simulator.inputs import read_yaml
from simulator.plan import PlanError, PlanRequest, parse_plan_request
from simulator.regress.suite_schema import E2EEntry, GoodputConfig, PlanEntry, ScenarioEntry, Suite, Tolerance
from simulator.scenario import Scenario, ScenarioError, parse_scenario


class RegressError(ValueError):
    """The suite, the baseline or a command-line choice is wrong (a user error, exit code 2)."""


@dataclass(frozen=True)
class Entry:
    """An entry ready to run: its validated scenario (kind scenario) or plan request (kind plan).

    ``seeds``, ``replications``, ``rate`` and ``goodput`` apply to scenarios
    only.  ``fingerprint`` hashes what determines the figures' values (the
    entry's settings and its scenario or request after overrides, not the
    tolerances), so a baseline can tell a moved answer from a changed question.
    """

    id: str
    kind: Literal["scenario", "plan", "e2e"]
    scenario: Scenario | None
    plan: PlanRequest | None
    seeds: tuple[int, ...]
    replications: int
    rate: float | None
    goodput: GoodputConfig | None
    tolerances: dict[str, Tolerance]
    fingerprint: str
    e2e: E2EEntry | None = None


@dataclass(frozen=True)
class LoadedSuite:
    path: Path
    suite: Suite
    entries: tuple[Entry, ...]

    @property
    def name(self) -> str:
        return self.suite.name


def _merge(base: dict, over: dict) -> dict:
    """``over`` laid onto ``base``: mappings merge key by key, anything else is replaced.

    A mapping that changes ``kind`` (an arrival or length distribution) replaces the old one whole,
    since the old kind's keys mean nothing to the new one.
    """
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        if isinstance(old, dict) and isinstance(v, dict) and v.get("kind", old.get("kind")) == old.get("kind"):
            out[k] = _merge(old, v)
        else:
            out[k] = v
    return out


def _loc(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).startswith(("function-", "nullable", "union")):
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _known_keys(loc: tuple) -> list[str]:
    """The keys allowed in the mapping at pydantic location ``loc`` of a suite ([] if unsure)."""
    if loc[-2:-1] == ("figures",):
        return sorted(Tolerance.model_fields)  # figures: {name: tolerance}
    tags: dict[str, type[BaseModel]] = {"scenario": ScenarioEntry, "plan": PlanEntry, "e2e": E2EEntry}
    model: type[BaseModel] | None = Suite
    for i, part in enumerate(loc):
        if isinstance(part, int):
            continue
        if loc[:1] == ("entries",) and i == 2 and part in tags:  # the entry's union tag
            model = tags[part]
            continue
        field = model.model_fields.get(part) if model is not None else None
        inner = [m for m in _models_in(field.annotation) if m not in tags.values()] if field else []
        model = inner[0] if len(inner) == 1 else None
    return sorted(model.model_fields) if model is not None else []


def _entry_loc(loc_: tuple, data) -> str:
    """``entries[2] (id 'chat').figures.x`` for a location inside an entry, else the plain location."""
    loc = _loc(loc_)
    if loc_[:1] == ("entries",) and len(loc_) > 1 and isinstance(loc_[1], int):
        try:
            ident = f" (id {data['entries'][loc_[1]]['id']!r})"
        except (KeyError, IndexError, TypeError):
            ident = ""
        tail = loc_[3:] if len(loc_) > 2 and loc_[2] in ("scenario", "plan") else loc_[2:]  # union tag
        rest = _loc(tail)
        loc = f"entries[{loc_[1]}]{ident}" + ("" if rest == "(top level)" else f".{rest}")
    return loc


def _format(origin: str, err: ValidationError, data) -> str:
    return format_validation_error(
        err,
        data,
        root=Suite,
        origin=origin,
        what="regression suite",
        docs="docs/ci.md",
        locate=lambda loc: _entry_loc(loc, data),
        known=_known_keys,
    )


def _read_yaml(path: Path, what: str):
    return read_yaml(path, RegressError, what.removeprefix("the "))


def _hwdb(suite: Suite, path: Path) -> tuple[str, ...]:
    return tuple(str(path.parent / d) if not Path(d).is_absolute() else d for d in suite.hwdb)


def _source(path: Path, i: int, e, field: str, what: str) -> tuple[Path, dict]:
    """The file an entry names (relative to the suite) and its mapping after the entry's override."""
    name = getattr(e, field)
    where = f"{path}: entries[{i}] (id {e.id!r}).{field}"
    src = (path.parent / name) if not Path(name).is_absolute() else Path(name)
    if not src.exists():
        near = sorted(p.name for p in src.parent.glob("*.yaml")) if src.parent.is_dir() else []
        raise RegressError(
            f"{where}: {what} file {name!r} does not exist (looked for {src}); "
            f"give a {what} YAML path relative to the suite file"
            + (f"; files in {src.parent}: {', '.join(near)}" if near else "")
        )
    data = _read_yaml(src, f"the {what}")
    if not isinstance(data, dict):
        raise RegressError(f"{where}: {src} is not a {what} (expected a mapping of {what} fields)")
    return src, _merge(data, e.override)


def _fingerprint(e, merged: dict, suite: Suite) -> str:
    key = json.dumps(
        {"entry": e.model_dump(mode="json", exclude={"figures"}), "source": merged, "hwdb": list(suite.hwdb)},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _plan_entry(path: Path, i: int, e: PlanEntry, suite: Suite) -> Entry:
    src, merged = _source(path, i, e, "request", "plan request")
    try:
        req = parse_plan_request(merged, f"{src} with entries[{i}].override", src.parent)
    except PlanError as exc:
        raise RegressError(f"{path}: entries[{i}] (id {e.id!r}).request: {exc}") from None
    if suite.hwdb:
        req = req.model_copy(update={"hwdb": tuple(req.hwdb) + _hwdb(suite, path)})
    tol = {name: t or suite.tolerance for name, t in e.figures.items()}
    return Entry(e.id, "plan", None, req, (), 0, None, None, tol, _fingerprint(e, merged, suite))


def _e2e_entry(path: Path, i: int, e: E2EEntry, suite: Suite) -> Entry:
    from calibration.e2e.rows import DEFAULT_TABLE  # noqa: PLC0415 - calibration sits above the simulator

    table = (
        Path(e.table)
        if e.table and Path(e.table).is_absolute()
        else (path.parent / e.table if e.table else DEFAULT_TABLE)
    )
    if not table.is_file():
        raise RegressError(
            f"{path}: entries[{i}] (id {e.id!r}).table: no measurement table at {table}; the e2e "
            f"entries need ../shared/data/e2e/serving_measurements.csv (CI has it)"
        )
    e = e.model_copy(update={"table": str(table)})
    tol = {name: t or suite.tolerance for name, t in e.figures.items()}
    digest = hashlib.sha256(table.read_bytes()).hexdigest()[:16]
    return Entry(
        e.id,
        "e2e",
        None,
        None,
        (),
        0,
        None,
        None,
        tol,
        _fingerprint(e.model_copy(update={"table": digest}), {}, suite),
        e,
    )


def _entry(path: Path, i: int, e: ScenarioEntry | PlanEntry | E2EEntry, suite: Suite) -> Entry:
    if isinstance(e, PlanEntry):
        return _plan_entry(path, i, e, suite)
    if isinstance(e, E2EEntry):
        return _e2e_entry(path, i, e, suite)
    src, merged = _source(path, i, e, "scenario", "scenario")
    try:
        scn = parse_scenario(merged, f"{src} with entries[{i}].override", src.parent)
    except ScenarioError as exc:
        raise RegressError(f"{path}: entries[{i}] (id {e.id!r}).scenario: {exc}") from None
    if suite.hwdb:
        scn = scn.model_copy(update={"hwdb": tuple(scn.hwdb) + _hwdb(suite, path)})
    kind = scn.workload.arrival.kind
    if e.rate is not None and kind not in ("poisson", "gamma"):
        raise RegressError(
            f"{path}: entries[{i}] (id {e.id!r}).rate={e.rate}: the scenario's arrival is "
            f"{kind!r}; a rate applies only to poisson or gamma arrivals: drop rate"
        )
    if e.goodput is not None and kind not in ("poisson", "gamma"):
        raise RegressError(
            f"{path}: entries[{i}] (id {e.id!r}).goodput: goodput searches over the arrival "
            f"rate but the scenario's arrival is {kind!r}; use a poisson or gamma scenario"
        )
    tol = {name: t or suite.tolerance for name, t in e.figures.items()}
    return Entry(
        e.id,
        "scenario",
        scn,
        None,
        e.seeds or (scn.seed,),
        e.replications or suite.replications,
        e.rate,
        e.goodput,
        tol,
        _fingerprint(e, merged, suite),
    )


def load_suite(path: str | Path) -> LoadedSuite:
    """Read and validate a suite and every scenario it names (raises :class:`RegressError`)."""
    path = Path(path)
    if not path.exists():
        raise RegressError(f"suite file '{path}' does not exist; give the path of a suite YAML (see docs/ci.md)")
    data = _read_yaml(path, "the suite")
    if not isinstance(data, dict):
        raise RegressError(
            f"{path}: expected a mapping with name and entries at the top level, got {type(data).__name__}"
        )
    try:
        suite = Suite.model_validate(data)
    except ValidationError as err:
        raise RegressError(_format(str(path), err, data)) from None
    return LoadedSuite(path, suite, tuple(_entry(path, i, e, suite) for i, e in enumerate(suite.entries)))


def finite(x: float) -> float | None:
    """``x`` as stored in a baseline: non-finite values (no data, infinite cost) become None."""
    return float(x) if x is not None and math.isfinite(x) else None
