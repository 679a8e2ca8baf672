"""The fields of a regression suite file, validated: the entries (scenarios, plan requests, end-to-end
validation subsets), the figures watched on each and their tolerances.

A tolerance's ``abs`` is in its figure's unit, ``rel`` a fraction of the baseline value.  The file is read,
and the scenarios and requests it names are checked, by :func:`simulator.regress.suite.load_suite`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator

from simulator.regress.figures import PLAN_FIGURES, SCENARIO_FIGURES
from simulator.strict_model import Folders, StrictModel


class Tolerance(StrictModel):
    """How far a figure may move before it counts as drift.

    A figure holds when ``|new - old| <= abs`` or ``|new - old| <= rel * |old|``
    (either bound suffices; an absent bound is not used).  ``abs`` is in the
    figure's unit, ``rel`` a fraction (0.05 = 5 %).
    """

    abs: float | None = Field(None, ge=0)
    rel: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_bound(self) -> Tolerance:
        if self.abs is None and self.rel is None:
            raise ValueError("a tolerance needs abs, rel or both, e.g. {rel: 0.05} or {abs: 0}")
        return self

    def holds(self, old: float | str | None, new: float | str | None) -> bool:
        """True if ``new`` is within tolerance of ``old``.

        Non-finite values (None) hold only against each other; labels (str) only if identical.
        """
        if old is None or new is None or isinstance(old, str) or isinstance(new, str):
            return old == new
        d = abs(new - old)
        return (self.abs is not None and d <= self.abs) or (self.rel is not None and d <= self.rel * abs(old))

    def describe(self) -> str:
        """``±0.01 or ±5%``: the bounds as a reader sees them."""
        parts = ([f"±{self.abs:g}"] if self.abs is not None else []) + (
            [f"±{self.rel * 100:g}%"] if self.rel is not None else []
        )
        return " or ".join(parts)


def _check_figures(v: dict, known, what: str = "") -> dict:
    """``v`` if every figure name is in ``known``, else the error naming the unknown ones and the choices."""
    unknown = sorted(set(v) - set(known))
    if unknown:
        raise ValueError(
            f"unknown {what}figure(s) {', '.join(map(repr, unknown))}; watchable {what}figures: {', '.join(known)}"
        )
    return v


class GoodputConfig(StrictModel):
    """Bisection bounds for ``goodput_rps``: the rate is searched in (0, rate_hi] req/s."""

    rate_hi: float = Field(gt=0)
    iterations: int = Field(6, ge=1, le=20)


class ScenarioEntry(StrictModel):
    """One scenario file, optionally adjusted, and the figures watched on it."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    kind: Literal["scenario"] = "scenario"
    scenario: str
    override: dict = {}
    rate: float | None = Field(None, gt=0)
    seeds: tuple[int, ...] | None = Field(None, min_length=1)
    replications: int | None = Field(None, ge=1, le=100)
    goodput: GoodputConfig | None = None
    figures: dict[str, Tolerance | None] = Field(min_length=1)

    @field_validator("figures")
    @classmethod
    def _known_figures(cls, v: dict) -> dict:
        return _check_figures(v, SCENARIO_FIGURES)

    @model_validator(mode="after")
    def _goodput_bounds(self) -> ScenarioEntry:
        if "goodput_rps" in self.figures and self.goodput is None:
            raise ValueError("figure goodput_rps needs goodput: {rate_hi: R} (the top of the search in req/s)")
        return self


class PlanEntry(StrictModel):
    """One plan request (simulator.plan), optionally adjusted, and the recommendation's figures watched.

    The request's ``search`` section sets the planner's seed, replications and effort.
    """

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    kind: Literal["plan"]
    request: str
    override: dict = {}
    figures: dict[str, Tolerance | None] = Field(min_length=1)

    @field_validator("figures")
    @classmethod
    def _known_figures(cls, v: dict) -> dict:
        return _check_figures(v, PLAN_FIGURES, "plan ")


E2E_FIGURES = {
    "ttft_mape": "mean |relative error| of mean TTFT over the rows",
    "tpot_mape": "mean |relative error| of mean TPOT",
    "ttft_bias": "mean signed relative error of TTFT",
    "tpot_bias": "mean signed relative error of TPOT",
    "rows": "rows simulated",
}


class E2EEntry(StrictModel):
    """A fixed subset of the measured serving runs (calibration.e2e.score): the validation's error is the figure.

    ``table``: the measurement CSV (default ``../shared/data/e2e/serving_measurements.csv``);
    ``engines``: table backends kept; ``split``: 'held-out', 'fit' or 'all' rows; ``sample``: every
    K-th kept row.  A change to a model that worsens accuracy moves ``ttft_mape``/``tpot_mape``.
    """

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    kind: Literal["e2e"]
    table: str | None = None
    engines: tuple[Literal["vllm", "sglang", "trtllm"], ...] = ("vllm",)
    split: Literal["held-out", "fit", "all"] = "all"
    sample: int = Field(4, ge=1, le=1000)
    figures: dict[str, Tolerance | None] = Field(min_length=1)

    @field_validator("figures")
    @classmethod
    def _known_figures(cls, v: dict) -> dict:
        return _check_figures(v, E2E_FIGURES, "e2e ")


def _kind(v) -> str:
    return (v.get("kind", "scenario") if isinstance(v, dict) else getattr(v, "kind", "scenario")) or "scenario"


AnyEntry = Annotated[
    Annotated[ScenarioEntry, Tag("scenario")] | Annotated[PlanEntry, Tag("plan")] | Annotated[E2EEntry, Tag("e2e")],
    Discriminator(
        _kind, custom_error_type="entry_kind", custom_error_message="kind must be scenario (the default), plan or e2e"
    ),
]


class Suite(StrictModel):
    """A named list of entries; ``tolerance`` applies to every figure given without its own."""

    name: str = Field(min_length=1)
    description: str = ""
    hwdb: Folders = ()
    replications: int = Field(1, ge=1, le=100)
    tolerance: Tolerance = Tolerance(rel=0.02)
    entries: tuple[AnyEntry, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> Suite:
        ids = [e.id for e in self.entries]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"entry ids must be unique; repeated: {', '.join(dup)}")
        return self
