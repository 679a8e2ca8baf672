"""Cold starts at scale: the low / typical / high range of a start-up, and the sourced real start-ups.

The single-GPU fit (``hwdb/data/coldstart/vllm-v1.yaml``, 0.5-14B models on
one GPU) cannot see what multi-GPU and MoE starts spend their time on.
``hwdb/data/coldstart/vllm-scale.yaml`` adds, for each such phase, the range
of the per-unit rate that public logs span (every number with its source),
and per vLLM release the behaviours that switch phases on or off:

==========================  ===================================================================
distributed init            ``base + per_rank * ranks`` (worker start, NCCL), when ``tp x pp > 1``
custom all-reduce P2P check ``s_per_pair * tp (tp - 1) / 2`` on a cold ``~/.cache``, where the
                            release runs it (<= 0.10) or ``VLLM_SKIP_P2P_CHECK=0`` (level high)
weights                     per-rank loader rate (each rank moves its shard; MoE experts alike)
Dynamo                      host multiplier; MoE layers weigh more (Qwen3-235B vs Llama-3-70B)
Inductor                    distinct pieces x a fitted per-piece time (+ repeated pieces where
                            the release still re-runs AOTAutograd), times a host multiplier
kernel JIT / DeepGEMM       constants on a cold cache (DeepGEMM: FP8 MoE, Hopper or later)
CUDA-graph capture          seconds per captured graph per layer (MoE layers weigh more), plus
                            gc.collect once per graph on releases before gc was frozen
process start               imports, engine process (host speed)
==========================  ===================================================================

``typical`` is what ``epdsim coldstart`` prints first; ``high`` sizes the
probe recommendations (``epdsim probes``, :func:`recommend_high`), so a slow
host or storage still starts inside the startupProbe.  :func:`check_cases`
re-predicts every sourced real start-up kept in the file, over the phases the
source timed (``observed_phases``), at the release it ran (``vllm_version``);
:func:`calibration.coldstart_holdout.held_out_checks` predicts each again with
the ranges re-derived without the case's own source.
"""
from __future__ import annotations

from dataclasses import dataclass

import hwdb
from hwdb.coldstart import ColdStartDB, StartupCase, load_coldstart
from simulator.ops.coldstart import LEVELS, PHASE_LABELS, PHASES, Breakdown, ColdStartError, breakdown
from simulator.ops.k8s import recommend_probes
from simulator.scenario import PoolConfig, deployment_for


def breakdown_range(dep, compile_cache: str = "miss", storage: str = "nvme", image_cached: bool = True,
                    **kw) -> dict[str, Breakdown]:
    """``{level: Breakdown}`` for low, typical and high (same arguments as :func:`breakdown`)."""
    return {lv: breakdown(dep, compile_cache, storage, image_cached, level=lv, **kw) for lv in LEVELS}


def recommend_high(dep, storage: str = "nvme", image_cached: bool = True, margin: float = 0.5, **kw):
    """Probe recommendation sized on the high end of a cold-cache start (see :mod:`simulator.ops.k8s`)."""
    path = kw.pop("path", "/health")
    port = kw.pop("port", 8000)
    return recommend_probes(breakdown(dep, "miss", storage, image_cached, level="high", **kw), margin=margin,
                            path=path, port=port)


@dataclass(frozen=True)
class CaseCheck:
    """One sourced real start-up beside the model's range, over the phases the source timed."""

    case: StartupCase
    predicted: dict[str, float]                  # level -> seconds over case.observed_phases
    phases: dict[str, float]                     # phase -> typical seconds (the phases compared)

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
    return breakdown_range(case_deployment(case, db), case.compile_cache, case.storage, True,
                           vllm_version=case.vllm_version, capture_sizes_override=case.capture_sizes, db=cs)


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
    for case in (sc.cases if sc is not None else ()):
        bds = case_breakdowns(case, cs, db)
        names = case.observed_phases or [p.name for p in bds["typical"].container_phases()]
        out.append(CaseCheck(case, {lv: compared_seconds(b, case) for lv, b in bds.items()},
                             {n: bds["typical"].seconds(n) for n in names}))
    return out


def cases_markdown(checks: list[CaseCheck]) -> str:
    """The docs/operations.md table: predicted range vs each sourced start-up, with the error."""
    rows = ["| start-up | config | compared | observed | low / typical / high | checked at | error |",
            "|---|---|---|---|---|---|---|"]
    for c in checks:
        k = c.case
        cfg = (f"{k.model} {k.gpu} TP{k.tp} {k.dtype}, {k.storage}, cache {k.compile_cache}, "
               f"vLLM {k.vllm_version}" + (f", sizes {list(k.capture_sizes)}" if k.capture_sizes else ""))
        obs = k.observed_phases
        what = ("container start -> API" if obs is None else
                "engine start -> API" if "api_ready" in obs and "process_start" not in obs else ", ".join(obs))
        p = c.predicted
        rows.append(f"| {k.name} | {cfg} | {what} | {k.observed_s:.0f} s | {p['low']:.0f} / {p['typical']:.0f} / "
                    f"{p['high']:.0f} s | {k.level} | {c.error:+.0%} |")
    return "\n".join(rows)


def phases_markdown(checks: list[CaseCheck]) -> str:
    """Per-phase typical prediction vs what each source logged, with the error (cases with logged phases)."""
    names = [n for n in PHASES if any(n in c.case.logged for c in checks)]
    rows = ["| start-up | " + " | ".join(PHASE_LABELS[n] for n in names) + " |",
            "|---|" + "---|" * len(names)]
    for c in checks:
        if not c.case.logged:
            continue
        err = c.phase_errors()
        cells = [f"{c.phases.get(n, 0.0):.0f} / {c.case.logged[n]:.0f} s ({err[n]:+.0%})" if n in c.case.logged
                 else "" for n in names]
        rows.append(f"| {c.case.name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)
