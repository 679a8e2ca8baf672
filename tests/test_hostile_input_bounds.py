"""Hostile input, part 3: every number a user gives has a physical range, and a value outside it is
refused with the range in the message.

The fields are found by walking the schemas (``model_fields``, recursively through nested models,
unions, tuples and mappings) of the scenario, the plan request and every kind of hardware-database
file, so a new field is covered without a new test; a numeric field without a declared range
(:mod:`simulator.bounds`) fails :func:`test_every_numeric_field_declares_a_range`.  Each field is then
given, on its own model, the hostile values that lie outside its range (0 where 0 is outside,
negatives, 1e308, infinities, NaN, 1e-300) and must be refused there with its range stated.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import Annotated, Literal, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

import hwdb.coldstart
from hwdb.loader import FILE_SCHEMAS
from hwdb.schema import ModelSidecar
from simulator.bounds import NicRate, Range, count, range_of
from simulator.plan.request import PlanRequest
from simulator.scenario import Scenario

# The cold-start file's kinds: every model its module defines (nested ones are walked anyway).
COLDSTART = [
    v
    for v in vars(hwdb.coldstart).values()
    if isinstance(v, type) and issubclass(v, BaseModel) and v.__module__ == hwdb.coldstart.__name__
]
ROOTS = (Scenario, PlanRequest, ModelSidecar, *FILE_SCHEMAS.values(), *COLDSTART)
HOSTILE = (0, -1, -1e308, 1e308, math.inf, -math.inf, math.nan, 1e-300)


@dataclass(frozen=True)
class NumberField:
    """A number somewhere in ``model.<field>``: the field itself, or inside it (``steps``: "item" of a
    tuple or list, "value" or "key" of a mapping), plus its range (None: undeclared) and whether it is
    a hardware figure (its range bounds ``.value``)."""

    model: type[BaseModel]
    field: str
    steps: tuple[str, ...]
    range: Range | None
    figure: bool
    key_type: object = None  # for a mapping: the type of its keys (a valid key is needed)

    @property
    def name(self) -> str:
        return f"{self.model.__name__}.{self.field}" + "".join(f"[{s}]" for s in self.steps)


def _numbers(model, field, ann, steps=(), metas=(), key_type=None):
    """The NumberFields of annotation ``ann`` of ``model.field``, and the models it holds."""
    if get_origin(ann) is Annotated:
        base, *more = get_args(ann)
        yield from _numbers(model, field, base, steps, (*metas, *more), key_type)
        return
    rng = next((m for m in metas if isinstance(m, Range)), None)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        if "value" in ann.model_fields and ann.__name__ == "Figure":
            yield NumberField(model, field, steps, rng, True, key_type)
        else:
            yield ann
        return
    origin = get_origin(ann)
    if origin in (Union, types.UnionType):
        for a in get_args(ann):
            yield from _numbers(model, field, a, steps, metas, key_type)
    elif origin in (tuple, list):
        for a in get_args(ann):
            if a is not Ellipsis:
                yield from _numbers(model, field, a, (*steps, "item"))
    elif origin is dict:
        k, v = get_args(ann)
        yield from _numbers(model, field, k, (*steps, "key"))
        yield from _numbers(model, field, v, (*steps, "value"), key_type=k)
    elif ann in (int, float):
        yield NumberField(model, field, steps, rng, False, key_type)


def number_fields() -> list[NumberField]:
    """Every number of the roots' schemas, each model once."""
    out, seen, todo = [], set(), list(ROOTS)
    while todo:
        model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        for name, info in model.model_fields.items():
            for hit in _numbers(model, name, info.annotation, metas=tuple(info.metadata)):
                (out.append if isinstance(hit, NumberField) else todo.append)(hit)
    return sorted(out, key=lambda f: f.name)


FIELDS = number_fields()


def _a_key(key_type):
    """A valid key of a mapping whose keys are ``key_type``."""
    if get_origin(key_type) is Literal:
        return get_args(key_type)[0]
    if get_origin(key_type) is Annotated:
        rng = next(m for m in get_args(key_type)[1:] if isinstance(m, Range))
        return int(rng.lo) + (1 if rng.lo_open else 0)
    return "k"


def _payload(f: NumberField, bad):
    """``{field: ...}`` holding ``bad`` where ``f`` is, and the location its error must have."""
    value = {"value": bad, "source": "a test source"} if f.figure else bad
    loc: tuple = ()
    for step in reversed(f.steps):
        if step == "item":
            value, loc = [value], (0, *loc)
        elif step == "value":
            key = _a_key(f.key_type)
            value, loc = {key: value}, (key, *loc)
        else:
            value, loc = {value: None}, (value, "[key]", *loc)
    return {f.field: value}, (f.field, *loc, *(("value",) if f.figure else ()))


def _same(a: tuple, b: tuple) -> bool:
    """Locations equal, a NaN key matching itself."""
    return len(a) == len(b) and all(
        x == y or (x != x and y != y) or str(x) == str(y) for x, y in zip(a, b, strict=True)
    )


def test_the_walk_finds_the_fields_of_the_issue():
    names = {f.name for f in FIELDS}
    for expected in (
        "KVTransferConfig.nic_Bps",
        "KVTransferConfig.oversubscription",
        "GpuOffer.price_usd_per_hour",
        "GPU.peak_flops[value]",
        "Constraints.tp[item]",
        "EncoderConfig.tp_efficiency[key]",
        "Poisson.rate",
        "NetworkLayout.nic_Bps",
    ):
        assert expected in names, sorted(names)
    assert len(FIELDS) > 150


def test_every_numeric_field_declares_a_range():
    """A number without a range lets 1e308, 1e-300 or a typo through as an answer: declare one with
    :func:`simulator.bounds.between` or :func:`simulator.bounds.count` (a figure: :func:`hwdb.schema.sourced`)."""
    missing = [f.name for f in FIELDS if f.range is None]
    assert not missing, "numeric fields without a declared range: " + ", ".join(missing)


@pytest.mark.parametrize("field", [f for f in FIELDS if f.range is not None], ids=lambda f: f.name)
def test_values_outside_the_range_are_refused_with_the_range(field):
    rng = field.range
    outside = [v for v in HOSTILE if not rng.contains(v)]
    assert any(v != v for v in outside) and math.inf in outside  # NaN and infinity always are
    for bad in outside:
        data, loc = _payload(field, bad)
        with pytest.raises(ValidationError) as info:
            field.model.model_validate(data)
        hits = [e for e in info.value.errors() if _same(e["loc"], loc)]
        assert hits, f"{field.name}={bad!r}: no error at {loc}: {info.value.errors()}"
        assert rng.text() in hits[0]["msg"], f"{field.name}={bad!r}: {hits[0]['msg']}"


def test_a_range_reads_as_a_sentence():
    assert range_of(NicRate).text() == "from 1e8 to 1e12 bytes/s"
    assert range_of(count(1, 72, "GPUs")).message().startswith("must be a whole number from 1 to 72 GPUs;")
