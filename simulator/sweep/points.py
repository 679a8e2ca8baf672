"""The points of a sweep: a scenario at each offered rate, or with one knob set to each value.

Everything here works on the scenario's data (the YAML shape, ``Scenario.model_dump(mode="json")``)
and hands every varied copy to the one scenario validator (:func:`simulator.scenario.parse_scenario`)
and to :func:`simulator.resolved.resolve` (does it fit the GPUs?), so a value a sweep sets is refused
exactly as the same value written in the YAML, under the option that set it.

A knob is a dotted path into that data: ``pools[0].tp``, ``pools[decode].instances`` (a pool by index
or by name), ``operations.startup.compile_cache``, ``operations.autoscale.main.target_queue``.  Only
a field holding one value (a number, a word, true/false, or null) can be swept.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

import hwdb
from simulator.resolved import resolve
from simulator.scenario import Scenario, ScenarioError, parse_scenario

MAX_POINTS = 64  # more points than this is a typo or a job for `epdsim plan`
RATE = "rate"  # the knob name of a sweep over the offered request rate
RATE_PATH = "workload.arrival.rate"
OPEN_LOOP = ("poisson", "gamma", "trace")
SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)((?:\[[^\[\]]+\])*)$")
INDEX = re.compile(r"\[([^\[\]]+)\]")


class SweepError(ScenarioError):
    """A sweep that cannot run as asked: one paragraph naming the option, the value and the fix."""


@dataclass(frozen=True)
class Point:
    """One point of a sweep: ``value`` (req/s for a rate sweep, else the knob's value) as the user wrote
    it (``label``) and the scenario data with it set."""

    label: str
    value: object
    data: dict
    origin: str  # how errors name it: "--knob pools[0].tp=3", "--rates 4"


def split_values(text: str, option: str) -> list[str]:
    """``"1, 2,4"`` -> ``["1", "2", "4"]``; an empty list or an empty item is an error under ``option``."""
    items = [t.strip() for t in str(text).split(",")]
    if not text or not text.strip() or not any(items):
        raise SweepError(f"{option} {text!r}: no values; give a comma-separated list, e.g. {option} 1,2,4")
    if not all(items):
        raise SweepError(f"{option} {text!r}: an empty item between commas; give values such as 1,2,4")
    if len(items) > MAX_POINTS:
        raise SweepError(
            f"{option}: {len(items)} values, more than the {MAX_POINTS} a sweep runs; "
            f"give fewer values (split the range into several sweeps)"
        )
    dup = sorted({v for v in items if items.count(v) > 1})
    if dup:
        raise SweepError(f"{option} {text!r}: {', '.join(dup)} given more than once; give each value once")
    return items


def parse_rates(text: str, option: str = "--rates") -> list[float] | None:
    """Offered rates (req/s) in ascending order from ``"1,2,4"``; None for ``"auto"``."""
    if str(text).strip().lower() == "auto":
        return None
    rates = []
    for item in split_values(text, option):
        try:
            r = float(item)
        except ValueError:
            raise SweepError(
                f"{option} {item!r}: not a number; give request rates in requests per second, "
                f"e.g. {option} 1,2,4,8, or {option} auto"
            ) from None
        if not (math.isfinite(r) and r > 0):
            raise SweepError(
                f"{option} {item}: a rate must be a positive, finite number of requests per second; "
                f"drop it or give e.g. 0.5"
            )
        rates.append(r)
    return sorted(rates)


def parse_knob(text: str, option: str = "--knob") -> tuple[str, list[str]]:
    """``"pools[0].tp=1,2,4"`` -> ``("pools[0].tp", ["1", "2", "4"])``."""
    path, eq, values = str(text).partition("=")
    if not eq or not path.strip():
        raise SweepError(
            f"{option} {text!r}: give PATH=V1,V2,..., e.g. {option} pools[0].tp=1,2,4 "
            f"(docs/sweep.md lists common knobs)"
        )
    path = path.strip()
    if not values.strip():
        raise SweepError(
            f"{option} {path}=: no values after '='; give a comma-separated list, e.g. {option} {path}=1,2,4"
        )
    return path, split_values(values, f"{option} {path}=")


def _segments(path: str, option: str) -> list[str | int]:
    keys: list[str | int] = []
    for part in path.split("."):
        m = SEGMENT.match(part)
        if not m:
            raise SweepError(
                f"{option} {path}: {part!r} is not a field name; write a dotted path such as "
                f"pools[0].tp or operations.startup.compile_cache"
            )
        keys.append(m.group(1))
        keys += [int(i) if i.isdigit() else i for i in INDEX.findall(m.group(2))]
    return keys


def _child(node, key, where: str, path: str, option: str):
    """``node[key]`` (a list item by index, or by its ``name``), or the error naming what exists there."""
    if isinstance(node, list):
        if isinstance(key, int):
            if key >= len(node):
                many = f"{len(node)} entries" if len(node) != 1 else "1 entry"
                raise SweepError(
                    f"{option} {path}: {where} has {many}, so [{key}] is out of range; give an index below {len(node)}"
                )
            return key
        names = [str(e.get("name")) for e in node if isinstance(e, dict)]
        if key in names:
            return names.index(key)
        raise SweepError(
            f"{option} {path}: {where} has no entry named {key!r}; the names are "
            f"{', '.join(names) or 'none'} (or give an index, e.g. [0])"
        )
    if isinstance(node, dict):
        if isinstance(key, str) and key in node:
            return key
        fields = sorted(map(str, node))
        near = difflib.get_close_matches(str(key), fields, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise SweepError(
            f"{option} {path}: {where or 'the scenario'} has no field {key!r}{hint}; the fields "
            f"there are {', '.join(fields) or 'none (an empty section: add an entry in the YAML first)'}"
        )
    if node is None:
        raise SweepError(
            f"{option} {path}: {where} is not set in this scenario (null); write that section in the "
            f"scenario YAML first, then sweep one of its fields"
        )
    raise SweepError(f"{option} {path}: {where} is a single value ({node!r}), not a section with fields")


def _locate(data: dict, path: str, option: str) -> tuple[Any, Any, Any]:
    """(the container holding the knob, its key, the knob's current value)."""
    keys = _segments(path, option)
    node, where = data, ""
    for key in keys[:-1]:
        k = _child(node, key, where, path, option)
        node = node[k]
        where = f"{where}[{k}]" if isinstance(k, int) else (f"{where}.{k}" if where else k)
    k = _child(node, keys[-1], where, path, option)
    current = node[k]
    if isinstance(current, dict):
        raise SweepError(
            f"{option} {path}: a section, not one value; sweep one of its fields: "
            f"{', '.join(sorted(map(str, current))) or 'none yet (add them in the YAML first)'}"
        )
    if isinstance(current, list):
        raise SweepError(f"{option} {path}: a list, not one value; sweep a field of one entry, e.g. {path}[0].FIELD")
    return node, k, current


def parse_value(raw: str, current, path: str, option: str):
    """A value as the YAML would read it, kept as text where the field holds text (a GPU named ``8``)."""
    if isinstance(current, str):
        return raw
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    if isinstance(value, (dict, list)):
        raise SweepError(f"{option} {path}={raw}: one value per point, not a list or mapping")
    if isinstance(current, (int, float)) and not isinstance(current, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SweepError(
                f"{option} {path}={raw}: {path} holds a number (now {current!r}); {raw!r} is not one. "
                f"Give numbers, e.g. {path}=1,2,4"
            )
        if not math.isfinite(value):
            raise SweepError(f"{option} {path}={raw}: not a finite number; give finite values")
    if isinstance(current, bool) and not isinstance(value, bool):
        raise SweepError(
            f"{option} {path}={raw}: {path} is true or false (now {str(current).lower()}); give {path}=false,true"
        )
    return value


def knob_points(data: dict, path: str, raw: list[str], option: str = "--knob") -> list[Point]:
    """The scenario data with the knob at ``path`` set to each value of ``raw`` (not yet validated)."""
    if path in (RATE_PATH, RATE):
        rates = parse_rates(",".join(raw), f"{option} {path}=")
        if rates is None:
            raise SweepError(
                f"{option} {path}=auto: the auto ladder is --rates auto; give rates here, e.g. {option} {path}=1,2,4"
            )
        return rate_points(data, rates, f"{option} {path}=")
    _, _, current = _locate(data, path, option)
    out = []
    for text in raw:
        value = parse_value(text, current, path, option)
        d = copy.deepcopy(data)
        node, key, _ = _locate(d, path, option)
        node[key] = value
        out.append(Point(text, value, d, f"{option} {path}={text}"))
    return out


def arrival_kind(data: dict) -> str:
    return str(((data.get("workload") or {}).get("arrival") or {}).get("kind", "poisson"))


def rate_points(data: dict, rates: list[float], option: str = "--rates") -> list[Point]:
    """The scenario data at each offered rate (req/s): an open loop's ``rate`` (a trace is rescaled to it)."""
    kind = arrival_kind(data)
    if kind not in OPEN_LOOP:
        why = (
            "a closed loop of users has no arrival rate; sweep its users instead, e.g. --knob "
            "workload.arrival.concurrency=8,16,32,64"
            if kind == "closed"
            else "its arrival rate follows a shape over time (workload.arrival.shape); sweep a knob instead"
        )
        raise SweepError(f"{option}: the scenario's arrivals are kind {kind!r}: {why}")
    out = []
    for r in rates:
        d = copy.deepcopy(data)
        arrival = d["workload"]["arrival"]
        arrival["rate"] = r
        if kind == "trace":
            arrival["time_scale"] = 1.0  # a trace's rate replaces its time scale
        out.append(Point(f"{r:g}", r, d, f"{option}{'' if option.endswith('=') else ' '}{r:g}"))
    return out


def with_requests(data: dict, n: int | None) -> dict:
    """``data`` with ``n`` requests per point (None: the scenario's own count or duration)."""
    if n is None:
        return data
    d = copy.deepcopy(data)
    d["workload"]["num_requests"] = int(n)
    if arrival_kind(d) != "closed":
        d["workload"]["duration_s"] = None  # the count decides, not the scenario's duration
    return d


def check_points(points: list[Point], option: str, db: hwdb.HardwareDB | None = None) -> list[Scenario]:
    """Each point's scenario through the scenario validator and :func:`resolve` (the model fits the GPUs,
    the TP divides the heads, ...); the first refusal is a :class:`SweepError` naming ``option`` and the
    value."""
    if not points:
        raise SweepError(f"{option}: no points to run; give at least one value")
    if len(points) > MAX_POINTS:
        raise SweepError(f"{option}: {len(points)} points, more than the {MAX_POINTS} a sweep runs; give fewer")
    out = []
    for p in points:
        origin = p.origin
        try:
            scn = parse_scenario(copy.deepcopy(p.data), origin)
            resolve(scn, db)
        except SweepError:
            raise
        except ScenarioError as exc:
            text = str(exc)
            raise SweepError(text if text.startswith(origin) else f"{origin}: {text}") from None
        except hwdb.HwdbError as exc:
            raise SweepError(f"{origin}: {exc}") from None
        out.append(scn)
    return out
