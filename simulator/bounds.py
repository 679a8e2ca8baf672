"""The physical range of every number a user gives, as annotated types that every schema shares.

A number in a scenario, a plan request or a hardware file is declared with an annotated type,
``Annotated[float, Range(lo, hi, unit, fix=...)]`` (a count: ``Annotated[int, Range(..., whole=True)]``),
or with a named quantity declared so (``nic_Bps: NicRate | None = None``); its :class:`Range` refuses
a value outside the range, infinity, NaN and text with one message that names the range, the unit
and the fix: ``kv_transfer.nic_Bps: must be a number from 1e8 to 1e12 bytes/s; give one NIC's line
rate ... (got 1e-300)``, where the location and the value come from the schema's error formatter
(:func:`simulator.errors.format_validation_error`).  The same range on a hardware
:class:`~hwdb.schema.Figure` field (``Annotated[Figure, Range(...)]``) bounds the figure's ``value``.
:func:`between` and :func:`count` build the same types from numbers at runtime; a type checker reads
only the written ``Annotated`` form (it does not evaluate a call in an annotation).

Ranges are generous around real hardware and workloads: they refuse typos (a zero, 1e-300, a
figure in GB instead of bytes) and values that would stall a simulation or make its answer
meaningless (a link of 1 byte/s, a 1e308 price), never a deployment that exists.  This module
imports nothing from the project, so every package may use it (tests/test_import_structure.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, get_args

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema


def _num(x: float) -> str:
    """``x`` as a reader writes it: 72, 0.5, 1e8, 1e-3, 9.2e18."""
    if float(x).is_integer() and abs(x) < 1e6:
        return str(int(x))
    text = f"{x:.3g}"
    mant, _, exp = text.partition("e")
    return f"{mant}e{int(exp)}" if exp else text


@dataclass(frozen=True)
class Range:
    """The interval a number must lie in: from ``lo`` to ``hi`` in ``unit``, ``lo`` itself excluded
    when ``lo_open``; ``whole`` for counts (no fraction).  ``fix`` says what to give instead.

    Put in a field's annotation (through :func:`between`), it wraps the field's own validation: any
    failure of it (text, NaN, infinity, a fraction for a count) and any value outside the interval
    becomes one ``out_of_range`` error stating the range.  On a model with a ``value`` field (a hardware
    figure), the range applies to that value and the error is the value's."""

    lo: float
    hi: float
    unit: str = ""
    lo_open: bool = False
    whole: bool = False
    fix: str = ""

    def text(self) -> str:
        """``from 1 to 72 GPUs`` or ``above 0 up to 1``."""
        head = f"above {_num(self.lo)} up to" if self.lo_open else f"from {_num(self.lo)} to"
        return f"{head} {_num(self.hi)}{' ' + self.unit if self.unit else ''}"

    def contains(self, x) -> bool:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            return False
        if not math.isfinite(x) or x > self.hi:
            return False
        return x > self.lo if self.lo_open else x >= self.lo

    def message(self) -> str:
        """``must be a number from 1e8 to 1e12 bytes/s; <fix>``."""
        what = "a whole number" if self.whole else "a number"
        return f"must be {what} {self.text()}; {self.fix or 'give a value in that range (SI units)'}"

    def __get_pydantic_core_schema__(self, source, handler):
        inner = handler(source)
        figure = isinstance(source, type) and issubclass(source, BaseModel) and "value" in source.model_fields
        return core_schema.no_info_wrap_validator_function(self._figure if figure else self._number, inner)

    def __get_pydantic_json_schema__(self, schema, handler):
        out = handler(schema)
        if "type" in out:  # a plain number (a figure's schema is a reference)
            out.update({"exclusiveMinimum" if self.lo_open else "minimum": self.lo, "maximum": self.hi})
        return out

    def _refusal(self) -> PydanticCustomError:
        return PydanticCustomError("out_of_range", "{message}", {"message": self.message()})

    def _number(self, value, handler):
        try:
            x = handler(value)
        except ValidationError:
            raise self._refusal() from None
        if not self.contains(x):
            raise self._refusal()
        return x

    def _figure(self, value, handler):
        """A figure's own checks, then its value's range, reported at ``<field>.value``."""
        try:
            fig = handler(value)
        except ValidationError as exc:
            bad = [e for e in exc.errors() if e["loc"][:1] == ("value",)]
            if not bad:
                raise
            raw = bad[0].get("input")
        else:
            if self.contains(fig.value):
                return fig
            raw = fig.value
        raise ValidationError.from_exception_data(
            "figure", [InitErrorDetails(type=self._refusal(), loc=("value",), input=raw)]
        ) from None


def between(lo: float, hi: float, unit: str = "", *, lo_open: bool = False, fix: str = "", whole: bool = False) -> Any:
    """A float (``whole``: int) field type bounded to [lo, hi] (``lo_open``: (lo, hi]) in ``unit``."""
    return Annotated[int if whole else float, Range(lo, hi, unit, lo_open, whole, fix)]


def count(lo: int, hi: int, unit: str = "", fix: str = "") -> Any:
    """A whole-number field type from ``lo`` to ``hi``."""
    return between(lo, hi, unit, whole=True, fix=fix)


def range_of(quantity) -> Range:
    """The :class:`Range` of a type made by :func:`between` or :func:`count`."""
    return next(m for m in get_args(quantity)[1:] if isinstance(m, Range))


def on_value(model: type, quantity) -> Any:
    """``model`` (a hardware figure: a model with a ``value``) with its value bounded like ``quantity``."""
    return Annotated[model, range_of(quantity)]


# ---------------------------------------------------------------- quantities shared by several schemas

MAX_REQUESTS = 50_000_000
"""Upper bound on requests one workload may generate (about 2 GB of arrays)."""
MAX_TOKENS = 10_000_000  # longest prompt or output one request may have (tokens)
MIN_RATE, MAX_RATE = 1e-6, 1e7  # requests/s: one a fortnight .. ten million a second
MAX_SECONDS = 1e9  # durations and times: about 30 years

Fraction = Annotated[float, Range(0, 1, lo_open=True, fix="give a fraction such as 0.9")]
Share = Annotated[float, Range(0, 1, fix="give a fraction from 0 to 1")]
Rate = Annotated[float, Range(MIN_RATE, MAX_RATE, "requests/s", fix="give the arrival rate in requests per second")]
RateOrZero = Annotated[float, Range(0, MAX_RATE, "requests/s", fix="give the arrival rate in requests per second")]
Tokens = Annotated[int, Range(1, MAX_TOKENS, "tokens", whole=True)]
Requests = Annotated[int, Range(1, MAX_REQUESTS, "requests", whole=True)]
Duration = Annotated[float, Range(0, MAX_SECONDS, "s", lo_open=True, fix="give seconds")]
Delay = Annotated[float, Range(0, MAX_SECONDS, "s", fix="give seconds")]
Seed = Annotated[int, Range(0, 2**63 - 1, whole=True, fix="give a seed from 0 to 2**63 - 1")]
Price = Annotated[float, Range(0, 1e4, "US dollars per GPU-hour", fix="give the price of one GPU for one hour")]
Bytes = Annotated[float, Range(0, 1e15, "bytes", fix="give bytes (4 GiB = 4294967296)")]
LinkRate = Annotated[float, Range(1e3, 1e15, "bytes/s", fix="give bytes per second per direction (100 Gb/s = 12.5e9)")]
NicRate = Annotated[
    float,
    Range(1e8, 1e12, "bytes/s", fix="give one NIC's line rate in bytes per second per direction (400 Gb/s = 50e9)"),
]
# One instance's what-if bandwidth: from a slow disk that a file-based connector stages KV through
# (10 MB/s) to all 72 GPUs of an NVL72 domain (72 x 900 GB/s); below it one KV transfer takes hours.
InstanceRate = Annotated[
    float,
    Range(
        1e7,
        1e14,
        "bytes/s",
        fix="give one instance's bandwidth in bytes per second per direction (8 NICs of 400 Gb/s = 400e9)",
    ),
]
# A degraded link's remaining share of its bandwidth: below 0.1% the link is down, not slow, and one
# transfer would outlast any run (at 1e-300 a benchmark would last 1e300 s).
BandwidthLeft = Annotated[
    float,
    Range(1e-3, 1, fix="give the fraction of the bandwidth left, e.g. 0.25; model a link with less as down (faults)"),
]
