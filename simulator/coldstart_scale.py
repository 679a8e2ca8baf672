"""Cold starts at scale: the low / typical / high range of a start-up, and the sourced real start-ups.

The single-GPU fit (``hwdb/data/coldstart/vllm-v1.yaml``, 0.5-14B models on
one GPU) cannot see what multi-GPU and MoE starts spend their time on.
``hwdb/data/coldstart/vllm-scale.yaml`` adds, for each such phase, the range
that public measurements span (every number with its source):

==========================  ===================================================================
custom all-reduce P2P check ``pairs x s_per_pair`` (``tp (tp - 1) / 2`` pairs; 0 when a cached
                            ``gpu_p2p_access_cache`` file survives, i.e. on a warm ``~/.cache``)
distributed init            worker spawn + NCCL, when ``tp x pp > 1``
weights                     per-rank loader rate (each rank moves its shard; MoE experts alike)
Dynamo / Inductor           multipliers on the fitted per-layer formulas, dense and MoE apart
kernel JIT                  Triton / FlashInfer JIT of the first passes, cold cache only
DeepGEMM warm-up            FP8 MoE on Hopper / Blackwell, cold cache only
CUDA-graph capture          seconds per captured graph per layer (ranks capture concurrently);
                            graphs per size x mode from the vLLM version's capture rule
process start               imports, engine process, API server (host speed)
==========================  ===================================================================

``typical`` is what ``epdsim coldstart`` prints first; ``high`` sizes the
probe recommendations (``epdsim probes``, :func:`recommend_high`), so a slow
host or storage still starts inside the startupProbe.  :func:`check_cases`
re-predicts every sourced real start-up kept in the file.
"""
from __future__ import annotations

from dataclasses import dataclass

from hwdb.coldstart import ColdStartDB, StartupCase, load_coldstart
from simulator.coldstart import LEVELS, Breakdown, breakdown


def breakdown_range(dep, compile_cache: str = "miss", storage: str = "nvme", image_cached: bool = True,
                    **kw) -> dict[str, Breakdown]:
    """``{level: Breakdown}`` for low, typical and high (same arguments as :func:`breakdown`)."""
    return {lv: breakdown(dep, compile_cache, storage, image_cached, level=lv, **kw) for lv in LEVELS}


def recommend_high(dep, storage: str = "nvme", image_cached: bool = True, margin: float = 0.5, **kw):
    """Probe recommendation sized on the high end of a cold-cache start (see :mod:`simulator.k8s`)."""
    from simulator.k8s import recommend_probes
    path = kw.pop("path", "/health")
    port = kw.pop("port", 8000)
    return recommend_probes(breakdown(dep, "miss", storage, image_cached, level="high", **kw), margin=margin,
                            path=path, port=port)


@dataclass(frozen=True)
class CaseCheck:
    """One sourced real start-up beside the model's range (container start -> API answers)."""

    case: StartupCase
    predicted: dict[str, float]

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


def case_deployment(case: StartupCase, db=None):
    import hwdb
    from simulator.scenario import PoolConfig, deployment_for
    db = db or hwdb.load()
    return deployment_for(PoolConfig(gpu=case.gpu, tp=case.tp, dtype=case.dtype), db.model(case.model), db)


def case_breakdowns(case: StartupCase, cs: ColdStartDB | None = None, db=None) -> dict[str, Breakdown]:
    cs = cs or load_coldstart()
    return breakdown_range(case_deployment(case, db), case.compile_cache, case.storage, True,
                           vllm_version=case.vllm_version, capture_sizes_override=case.capture_sizes, db=cs)


def check_cases(cs: ColdStartDB | None = None, engine: str = "vllm-v1", db=None) -> list[CaseCheck]:
    """Every sourced real start-up of the scale set, predicted at low / typical / high."""
    cs = cs or load_coldstart()
    sc = cs.scale_ranges(engine)
    out = []
    for case in (sc.cases if sc is not None else ()):
        bds = case_breakdowns(case, cs, db)
        out.append(CaseCheck(case, {lv: b.container_s for lv, b in bds.items()}))
    return out


def cases_markdown(checks: list[CaseCheck]) -> str:
    """The docs/operations.md table: predicted range vs each sourced start-up, with the error."""
    rows = ["| start-up | config | observed | low / typical / high | checked at | error |",
            "|---|---|---|---|---|---|"]
    for c in checks:
        k = c.case
        cfg = (f"{k.model} {k.gpu} TP{k.tp} {k.dtype}, {k.storage}, cache {k.compile_cache}, "
               f"vLLM {k.vllm_version}" + (f", sizes {list(k.capture_sizes)}" if k.capture_sizes else ""))
        p = c.predicted
        rows.append(f"| {k.name} | {cfg} | {k.observed_s:.0f} s | {p['low']:.0f} / {p['typical']:.0f} / "
                    f"{p['high']:.0f} s | {k.level} | {c.error:+.0%} |")
    return "\n".join(rows)
