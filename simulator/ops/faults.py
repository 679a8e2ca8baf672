"""Fault processes: FP8 activation-outlier crashes, node failures, link degradation episodes.

Each is a SimPy process that receives the environment and calls back into
the operations engine (:class:`simulator.engine.opsengine.OpsRun`) when a fault
strikes; what a crash does to requests and KV is decided there.

FP8 crash hazard
    An instance whose weights are FP8 crashes at rate
    ``h(t) = r x sum_i max(0, L_i(t) - onset)`` per second, where ``L_i`` is
    the KV length of decoding sequence ``i`` (prompt plus tokens generated so
    far): a hazard that grows with context length.  Defaults ``r`` and
    ``onset`` are in ``hwdb/data/faults/fp8-activation-outliers.yaml``
    (assumptions, with the reports they lean on).  Sampled exactly by
    thinning: candidate times come at the bound ``r x KV capacity in tokens``
    (``sum_i L_i`` never exceeds the KV cache) and are accepted with
    probability ``h(t) / bound``, so the per-step engine loop is untouched
    and only candidates cost O(batch).
Node failure
    Exponential time to failure of mean ``mtbf_s`` per instance (one node
    per instance); the replacement starts ``mttr_s`` later.
Link degradation
    Per PD link side, exponential healthy periods (mean ``mtbf_s``) and
    degraded periods (mean ``duration_s``) at ``bandwidth_factor`` of the
    link's bandwidth; transfers in flight are re-rated at each change.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hwdb.db import find
from hwdb.files import parse_file
from hwdb.loader import load_kind
from hwdb.schema import Figure, StrictModel

# The hwdb ``faults/`` entry holding the FP8 hazard's defaults.
FP8_NAME = "fp8-activation-outliers"


@dataclass(frozen=True)
class FP8Hazard:
    """``rate_per_token_s`` (1/(s x token)) and ``onset_tokens`` of the FP8 crash hazard."""

    rate_per_token_s: float
    onset_tokens: int
    source: str = ""


class FP8HazardFile(StrictModel):
    """An hwdb ``faults/<name>.yaml`` file of the FP8 crash hazard: its two figures, each with its source."""

    name: str
    rate_per_token_s: Figure
    onset_tokens: Figure


@dataclass(frozen=True)
class FaultEntry:
    """A ``faults/`` entry as loaded: its name and the hazard it gives (its source names the file)."""

    name: str
    hazard: FP8Hazard


def read_fault_file(path: Path) -> FaultEntry:
    f = parse_file(path, FP8HazardFile)
    hz = FP8Hazard(f.rate_per_token_s.value, int(f.onset_tokens.value), f"{path.name}: {f.rate_per_token_s.source}")
    return FaultEntry(f.name, hz)


def fp8_defaults(user_dirs: Iterable[str | Path] = ()) -> FP8Hazard:
    """The default hazard of hwdb ``faults/`` (shipped, or a user folder's entry of the same name, by the rules
    of :func:`hwdb.load`), every figure checked to carry a source."""
    tables, _ = load_kind("faults", read_fault_file, user_dirs)
    return find(
        "fault", tables.get("faults", {}), FP8_NAME, "Add it as faults/<name>.yaml in a user hwdb folder (--hwdb DIR)."
    ).hazard


def fp8_hazard(cfg, pools, hwdb_dirs: Iterable[str | Path] = ()) -> dict[str, FP8Hazard]:
    """Per pool name, the FP8 hazard that applies (FP8 pools, or the pools ``cfg`` names); ``hwdb_dirs``: the
    user hwdb folders whose ``faults/`` may replace the shipped defaults."""
    if cfg is None:
        return {}
    base = fp8_defaults(hwdb_dirs)
    hz = FP8Hazard(
        base.rate_per_token_s if cfg.rate_per_token_s is None else cfg.rate_per_token_s,
        base.onset_tokens if cfg.onset_tokens is None else cfg.onset_tokens,
        base.source if cfg.rate_per_token_s is None else "scenario",
    )
    names = set(cfg.pools) if cfg.pools else {p.name for p in pools if p.dtype == "fp8"}
    return dict.fromkeys(names, hz)


def context_excess(inst, onset: int) -> float:
    """``sum_i max(0, L_i - onset)`` over the decoding sequences of ``inst`` (tokens)."""
    total = 0.0
    for length in inst.decode_contexts():
        excess = length - onset
        if excess > 0:
            total += excess
    return total


def fp8_crash_process(env, inst, hazard: FP8Hazard, rng, crash):
    """Crash ``inst`` (``crash(inst, why)``) at the first event of its FP8 hazard; ends when it dies."""
    bound = hazard.rate_per_token_s * inst.kv_total * inst.block
    if bound <= 0:
        return
    while True:
        yield env.timeout(float(rng.exponential(1.0 / bound)))
        if inst.dead:
            return
        h = hazard.rate_per_token_s * context_excess(inst, hazard.onset_tokens)
        if rng.random() * bound < h:
            crash(
                inst,
                f"FP8 activation-outlier crash (hazard {h * 3600:.2g}/h at "
                f"{h / hazard.rate_per_token_s:,.0f} context tokens beyond {hazard.onset_tokens})",
                "fp8",
            )
            return


def node_failure_process(env, inst, mtbf_s: float, rng, crash):
    """Fail ``inst``'s node after an exponential time of mean ``mtbf_s`` (unless it dies first)."""
    yield env.timeout(float(rng.exponential(mtbf_s)))
    if not inst.dead:
        crash(inst, f"node failure (MTBF {mtbf_s:g} s)", "node")


def link_degradation_process(env, fabric, link, cfg, healthy: float, rng, log):
    """Alternate healthy and degraded periods on ``link``; ``log(t, link, factor)`` records each change."""
    while True:
        yield env.timeout(float(rng.exponential(cfg.mtbf_s)))
        fabric.set_bandwidth_factor(link, healthy * cfg.bandwidth_factor)
        log(env.now, link.name, link.bandwidth_factor)
        yield env.timeout(float(rng.exponential(cfg.duration_s)))
        fabric.set_bandwidth_factor(link, healthy)
        log(env.now, link.name, healthy)
