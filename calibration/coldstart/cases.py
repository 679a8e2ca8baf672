"""The cold-start-at-scale ranges checked against every sourced real start-up.

:func:`check_cases` predicts each start-up kept in ``hwdb/data/coldstart/vllm-scale.yaml`` at low,
typical and high (:func:`simulator.ops.coldstart_scale.breakdown_range`) over the phases its source
timed, at the release it ran; :mod:`calibration.coldstart.holdout` repeats it with the ranges
re-derived without the case's own source.  The tables go to ``docs/operations.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import hwdb
from hwdb.coldstart import ColdStartDB, StartupCase, load_coldstart
from simulator.ops.coldstart import PHASE_LABELS, PHASES, Breakdown
from simulator.ops.coldstart_formulas import ColdStartError
from simulator.ops.coldstart_scale import breakdown_range
from simulator.scenario import PoolConfig, deployment_for


@dataclass(frozen=True)
class CaseCheck:
    """One sourced real start-up beside the model's range, over the phases the source timed."""

    case: StartupCase
    predicted: dict[str, float]  # level -> seconds over case.observed_phases
    phases: dict[str, float]  # phase -> typical seconds (the phases compared)

    @property
    def observed_s(self) -> float:
        return self.case.observed_s

    @property
    def checked_s(self) -> float:
        """The prediction at the end of the range the case is checked against (``case.level``)."""
        return self.predicted[self.case.level]

    @property
    def error(self) -> float:
        """Relative error of :attr:`checked_s` against the observed start."""
        return self.checked_s / self.observed_s - 1.0

    @property
    def in_range(self) -> bool:
        return self.predicted["low"] <= self.observed_s <= self.predicted["high"]

    def phase_errors(self) -> dict[str, float]:
        """Relative error of the typical prediction per phase the source logged on its own."""
        return {n: self.phases.get(n, 0.0) / v - 1.0 for n, v in self.case.logged.items() if v > 0}


def case_deployment(case: StartupCase, db=None):
    db = db or hwdb.load()
    return deployment_for(PoolConfig(gpu=case.gpu, tp=case.tp, dtype=case.dtype), db.model(case.model), db)


def case_breakdowns(case: StartupCase, cs: ColdStartDB | None = None, db=None) -> dict[str, Breakdown]:
    cs = cs or load_coldstart()
    return breakdown_range(
        case_deployment(case, db),
        case.compile_cache,
        case.storage,
        True,
        vllm_version=case.vllm_version,
        capture_sizes_override=case.capture_sizes,
        db=cs,
    )


def compared_seconds(bd: Breakdown, case: StartupCase) -> float:
    """Seconds of ``bd`` over the phases ``case`` timed (all container phases when it names none)."""
    if case.observed_phases is None:
        return bd.container_s
    unknown = sorted(set(case.observed_phases) - set(PHASES))
    if unknown:
        raise ColdStartError(f"case {case.name!r}: observed_phases names {unknown}; phases are {', '.join(PHASES)}")
    return sum(bd.seconds(n) for n in case.observed_phases)


def check_cases(cs: ColdStartDB | None = None, engine: str = "vllm-v1", db=None) -> list[CaseCheck]:
    """Every sourced real start-up of the scale set, predicted at low / typical / high."""
    cs = cs or load_coldstart()
    sc = cs.scale_ranges(engine)
    out = []
    for case in sc.cases if sc is not None else ():
        bds = case_breakdowns(case, cs, db)
        names = case.observed_phases or [p.name for p in bds["typical"].container_phases()]
        out.append(
            CaseCheck(
                case,
                {lv: compared_seconds(b, case) for lv, b in bds.items()},
                {n: bds["typical"].seconds(n) for n in names},
            )
        )
    return out


def cases_markdown(checks: list[CaseCheck]) -> str:
    """The docs/operations.md table: predicted range vs each sourced start-up, with the error."""
    rows = [
        "| start-up | config | compared | observed | low / typical / high | checked at | error |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        k = c.case
        cfg = f"{k.model} {k.gpu} TP{k.tp} {k.dtype}, {k.storage}, cache {k.compile_cache}, vLLM {k.vllm_version}" + (
            f", sizes {list(k.capture_sizes)}" if k.capture_sizes else ""
        )
        obs = k.observed_phases
        what = (
            "container start -> API"
            if obs is None
            else "engine start -> API"
            if "api_ready" in obs and "process_start" not in obs
            else ", ".join(obs)
        )
        p = c.predicted
        rows.append(
            f"| {k.name} | {cfg} | {what} | {k.observed_s:.0f} s | {p['low']:.0f} / {p['typical']:.0f} / "
            f"{p['high']:.0f} s | {k.level} | {c.error:+.0%} |"
        )
    return "\n".join(rows)


def phases_markdown(checks: list[CaseCheck]) -> str:
    """Per-phase typical prediction vs what each source logged, with the error (cases with logged phases)."""
    names = [n for n in PHASES if any(n in c.case.logged for c in checks)]
    rows = ["| start-up | " + " | ".join(PHASE_LABELS[n] for n in names) + " |", "|---|" + "---|" * len(names)]
    for c in checks:
        if not c.case.logged:
            continue
        err = c.phase_errors()
        cells = [
            f"{c.phases.get(n, 0.0):.0f} / {c.case.logged[n]:.0f} s ({err[n]:+.0%})" if n in c.case.logged else ""
            for n in names
        ]
        rows.append(f"| {c.case.name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
