"""The strict pydantic base of every configuration schema (scenario, plan request, regress suite,
operations block, hardware-database files).

:class:`StrictModel` refuses unknown keys, infinite and NaN numbers, ``true``/``false`` given for a
number (:class:`NoBoolNumbers`) and control characters in names and text, and freezes its instances;
:data:`Folders` reads a list of folders that may be given as one.  Like :mod:`simulator.inputs`, this
module imports nothing from the project, so the hardware database below the simulator builds on it.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, get_args

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator


def _allows_bool(ann) -> bool:
    if ann is bool or ann is Any or ann is object:
        return True
    return any(_allows_bool(a) for a in get_args(ann) if isinstance(a, type) or get_args(a))


class NoBoolNumbers(BaseModel):
    """Base of the project's schemas: ``true``/``false`` is not accepted for a number field (pydantic's
    lax mode would read ``rate: true`` as 1 and answer nonsense)."""

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data):
        if isinstance(data, dict):
            for key, v in data.items():
                # A yes/no inside a list of numbers (tp: [1, true]) is as wrong as one on its own.
                flag = isinstance(v, bool) or (isinstance(v, (list, tuple)) and any(isinstance(x, bool) for x in v))
                field = cls.model_fields.get(key) if flag else None
                if field is not None and not _allows_bool(field.annotation):
                    if isinstance(v, bool):
                        raise ValueError(
                            f"{key}: {str(v).lower()} is a yes/no value, not what {key} takes; "
                            f"give a number (or the value the field documents)"
                        )
                    raise ValueError(
                        f"{key}: {v!r} holds a yes/no value, not what {key} takes; "
                        f"give numbers (or the values the field documents)"
                    )
        return data


# Control characters other than tab and newline (C0, DEL, C1): printed raw, ESC and BEL sequences
# retitle a terminal, move its cursor or hide what follows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _texts(key, value):
    """(where, text) for ``key`` and each string of ``value``: itself, a list's items, a mapping's keys
    and values (nested mappings are models that check their own)."""
    yield "a key", key
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, (list, tuple)):
        yield from ((f"{key}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield f"{key}: a key", k
            yield f"{key}.{k}", v


def _one_or_more(value):
    return (value,) if isinstance(value, str) else value


Folders = Annotated[tuple[str, ...], BeforeValidator(_one_or_more)]
"""A list of folders (``hwdb: [a, b]``); one folder may be given alone (``hwdb: a``), never read letter by
letter."""


class StrictModel(NoBoolNumbers):
    """Base of every validated, frozen configuration block: unknown keys, infinite and NaN numbers,
    yes/no given for a number and control characters in names and text are refused; instances cannot
    be changed once made."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _no_control_characters(cls, data):
        if isinstance(data, dict):
            for key, value in data.items():
                for where, text in _texts(key, value):
                    hit = _CONTROL.search(text) if isinstance(text, str) else None
                    if hit:
                        where = where if isinstance(where, str) and not _CONTROL.search(where) else "a key"
                        raise ValueError(
                            f"{where}: {text!r} holds the control character {hit.group()!r}, which "
                            f"a terminal would act on when the name is printed; remove it"
                        )
        return data
