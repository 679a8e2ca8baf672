"""Leave-one-source-out check of the cold-start ranges against the sourced real start-ups.

Several range ends in ``hwdb/data/coldstart/vllm-scale.yaml`` are read from the very start-ups
:func:`calibration.coldstart.cases.check_cases` compares them with (``feeds`` of each case), so
those comparisons are partly fitted on themselves.  Here every such range is re-derived from its
measurements by the rule the YAML states (``typical`` = median of the sourced measurements, ``low``
and ``high`` = their extremes, widened by the bounds that are not measurements: a skipped phase,
a neutral weight), once from every source and once without the run a case comes from; the case is
then predicted again with the re-derived ranges (:func:`held_out_checks`).

The runs are the logs each case cites: vLLM issue #19824, each anyscale terminal log
(github.com/anyscale/ray-serve-llm-perf-examples, ``replica_initialization/
experiment_terminal_output/``, one p5.48xlarge with 8x H100, vLLM 0.11 dev; their figures are
:mod:`calibration.coldstart.anyscale`'s), the tensorfuse blog, the Foundry paper.  The anyscale runs
share one host and release, so holding one of them out leaves its siblings in; ``by="publication"``
holds out every run of the same publication and shows what the ranges are worth without that host at
all.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from dataclasses import dataclass

from calibration.coldstart.anyscale import ANYSCALE_RUNS, GIB, LAYERS, RANK_BYTES
from calibration.coldstart.cases import CaseCheck, case_breakdowns, case_deployment, compared_seconds
from hwdb.coldstart import ColdStartDB, ScaleRanges, StartupCase, load_coldstart
from simulator.ops.coldstart_formulas import (
    capture_seconds,
    capture_sizes,
    captured_graphs,
    compile_seconds,
    dynamo_seconds,
)

# A case's run, from the first match in its `source`.
_RUN_PATTERNS = (
    (r"experiment_terminal_output/([\w.-]+)\.txt", "anyscale/{}"),
    (r"vllm/issues/(\d+)", "vllm#{}"),
    (r"tensorfuse", "tensorfuse"),
    (r"arXiv (\d{4}\.\d{4,5})", "arXiv {}"),
)


def case_run(case: StartupCase) -> str:
    """The run (log, report) a case comes from: what holding its source out removes."""
    for pattern, fmt in _RUN_PATTERNS:
        m = re.search(pattern, case.source)
        if m:
            return fmt.format(*m.groups())
    raise ValueError(f"case {case.name!r}: no run found in its source; add a pattern to _RUN_PATTERNS")


def publication(run: str) -> str:
    return run.split("/")[0]


@dataclass(frozen=True)
class Derived:
    """A range re-derived from its measurements: the ends and the sources that remained."""

    low: float
    typical: float
    high: float
    points: tuple[tuple[float, str], ...]  # (value, runs joined by '+') of the measurements and bounds used

    @property
    def runs(self) -> set[str]:
        return {r for _, joined in self.points for r in joined.split("+") if r}


def _span(points, bounds=(), fallback: float | None = None, rate: bool = False) -> Derived | None:
    """typical = median of the measurements (``fallback`` without any); low/high = the extremes of
    the measurements and the ``bounds`` (ends that are no measurement); a rate's fast end is low."""
    vals = [v for v, _ in points]
    if vals:
        typical = statistics.median(vals)
    elif fallback is not None:
        typical = fallback
    else:
        return None
    ends = vals + [v for v, _ in bounds] + [typical]
    lo, hi = (max(ends), min(ends)) if rate else (min(ends), max(ends))
    return Derived(lo, typical, hi, tuple(points) + tuple(bounds))


def _mid(r: tuple[float, float]) -> float:
    return (r[0] + r[1]) / 2.0


def _group(runs: dict, model: str, field: str) -> tuple[float, list[str]] | None:
    """Median over the kept runs of one model of a per-run figure (midpoint over the ranks)."""
    got = [(n, getattr(r, field)) for n, r in runs.items() if r.model == model and getattr(r, field) is not None]
    if not got:
        return None
    vals = [_mid(v) if isinstance(v, tuple) else v for _, v in got]
    return statistics.median(vals), [n for n, _ in got]


def scale_set(cs: ColdStartDB, engine: str = "vllm-v1") -> ScaleRanges:
    """The scale-range set of start-up set ``engine``; ValueError when the database has none."""
    sc = cs.scale_ranges(engine)
    if sc is None:
        raise ValueError(f"the cold-start database has no scale-range set for {engine!r} (kind: scale in coldstart/)")
    return sc


def _capture_fixed(case: StartupCase, cs: ColdStartDB) -> tuple[float, float]:
    """(seconds of capture that do not scale with graph-layers, graphs captured) for ``case``."""
    coef = cs.coefficients("vllm-v1")
    rules = scale_set(cs).version(case.vllm_version)
    dep = case_deployment(case)
    k, a = dep.knobs, dep.arch
    sizes = capture_sizes(k.max_cudagraph_capture_size, k.max_num_batched_tokens, rules.capture_rule)
    n, s = captured_graphs(sizes, k.max_num_seqs, rules.cudagraph_mode, coef.full_graph_relative_cost.value)
    p_rank = (a.active_params if a.is_moe else a.total_params) / (dep.tp * dep.pp)
    return capture_seconds(coef, n, s, 0.0, p_rank, dep.gpu.flops(dep.weight_dtype), g1=0.0), n


def derive_ranges(
    exclude: frozenset[str] | set[str] = frozenset(), cs: ColdStartDB | None = None
) -> dict[str, Derived]:
    """Every range some case's run feeds, re-derived without the runs in ``exclude``.

    Each measurement carries the run it was read from ('' for sources that are no case's); the
    anyscale figures are medians over the kept runs of one model.  Ranges nobody measured any more
    fall back to the neutral value (weights x1, the fitted constants), as the model without them.
    """
    cs = cs or load_coldstart()
    coef = cs.coefficients("vllm-v1")
    sc = scale_set(cs)
    runs = {n: r for n, r in ANYSCALE_RUNS.items() if n not in exclude}

    def pts(*items):
        return [(v, run) for v, run in items if v is not None and run not in exclude]

    def joined(g):
        return None if g is None else "+".join(g[1])

    def scaled(g: tuple[float, list[str]] | None, per: float) -> tuple[float | None, str | None]:
        """(a group's median / ``per``, its runs): the group's figure against the model's own."""
        return (None if g is None else g[0] / per, joined(g))

    out: dict[str, Derived | None] = {}

    # distributed init: the line through the TP4 and TP8 medians of engine start -> weight loading
    tp = {
        t: statistics.median([r.init_s for r in runs.values() if r.tp == t])
        for t in (4, 8)
        if any(r.tp == t for r in runs.values())
    }
    line_runs = "+".join(n for n, r in runs.items())
    slope = (tp[8] - tp[4]) / 4.0 if len(tp) == 2 else None
    base = tp[4] - 4.0 * slope if slope is not None else None
    out["distributed_init_s_per_rank"] = _span(
        pts(
            (3.0, ""),  # worker spawn to NCCL ready ~6 s at TP2 (vllm issue #22303)
            (slope, line_runs),
            (15.0, ""),
        )
    )  # NCCL / TP2 set-up ~30 s on a consumer host (talos-argocd-proxmox PR #1848)
    out["distributed_init_s_base"] = _span(
        pts((base, line_runs)), bounds=[(0.0, "")], fallback=coef.distributed_init_s.value
    )
    out["p2p_check_s_per_pair"] = _span(
        pts(
            (30.0 / 28, ""),  # ~30 s for tp=8, 28 pairs (vllm PR #8911)
            (60.0 / 28, "vllm#19824"),
        )
    )  # ~60 s at TP8 (vllm issue #19824)

    def rate(model):
        g = _group(runs, model, "weights_s")
        return (None, "") if g is None else (RANK_BYTES[model] / g[0], joined(g))

    out["loader_Bps_per_rank"] = _span(
        pts(
            (54.92 * GIB / 19.0, ""),  # Qwen3-235B TP8 54.92 GiB/rank in 18.4-19.6 s (vllm issue #18446)
            (coef.coef("weights_page_cache", "loader_Bps"), ""),  # single-GPU page-cache fit (vllm-v1.yaml)
            rate("qwen235b"),
            rate("llama70b"),
            (8.8e9 / 10.0, "vllm#19824"),
        ),
        rate=True,
    )  # 8.8 GB/rank in ~10 s from a hot page cache

    dyn = {m: _group(runs, m, "dynamo_s") for m in LAYERS}
    llama_dyn = dyn["llama70b"]
    out["dynamo_multiplier"] = _span(
        pts(
            scaled(llama_dyn, dynamo_seconds(coef, 80)),
            (1.0, ""),  # the fit (vllm-v1.yaml)
            (10.0 / dynamo_seconds(coef, 32), "tensorfuse"),
        )
    )  # Llama-3.1-8B on an L40S node: 10 s
    qwen_dyn = dyn["qwen235b"]
    moe_dyn = None if qwen_dyn is None or llama_dyn is None else (qwen_dyn[0] / 94) / (llama_dyn[0] / 80)
    out["dynamo_moe_layer_weight"] = _span(
        pts((moe_dyn, f"{joined(qwen_dyn)}+{joined(llama_dyn)}")), bounds=[(1.0, "")], fallback=1.0
    )

    # Inductor on a miss, against the piece formula at x1 (simulator.ops.coldstart_formulas.compile_seconds)
    piece = {"llama70b": compile_seconds(coef, 80, "miss"), "qwen235b": compile_seconds(coef, 94, "miss", unique=95)}
    comp = {m: _group(runs, m, "compile_s") for m in LAYERS}
    out["compile_miss_multiplier"] = _span(
        pts(
            *[scaled(comp[m], piece[m]) for m in ("qwen235b", "llama70b")],
            # Qwen3-8B (36 layers) TP8 'torch.compile takes 27.3 s' (Dynamo + Inductor; vllm PR #25493)
            (27.3 / (dynamo_seconds(coef, 36) + compile_seconds(coef, 36, "miss")), ""),
            (70.0 / piece["llama70b"], "vllm#19824"),
        )
    )  # ~70 s torch.compile, Llama-70B FP8 TP8

    hit = {m: _group(runs, m, "hit_s") for m in LAYERS}
    out["compile_hit_multiplier"] = _span(
        pts(
            *[scaled(hit[m], compile_seconds(coef, LAYERS[m], "hit")) for m in ("llama70b", "qwen235b")],
            (1.0, ""),  # the fit (vLLM 0.10.1)
            (sc.ranges["compile_hit_multiplier"].high, ""),
        )
    )  # DeepSeek-V3.2 TP8 B200 warm 26.7 s (vllm issue #26511)

    # capture per graph-layer: (capture - fixed part) / (graphs x layers), on the anyscale host
    cases = {case_run(c): c for c in sc.cases}
    per_gl = {}
    for m, name in (("llama70b", "anyscale/llama70b-base"), ("qwen235b", "anyscale/qwen235B-base")):
        g = _group(runs, m, "capture_s")
        if g is not None:
            fixed, n = _capture_fixed(cases[name], cs)
            per_gl[m] = ((g[0] - fixed) / (n * LAYERS[m]), joined(g))
    fit_g1 = coef.coef("cuda_graphs", "g1_s_per_graph_layer")
    out["capture_s_per_graph_layer"] = _span(
        pts(
            (fit_g1, ""),  # single-GPU fit (vllm-v1.yaml)
            ((2.0 - 0.34) / (67 * 28), ""),  # Qwen3-0.6B, 67 sizes in 2 s with gc frozen (vllm PR #21146)
            per_gl.get("llama70b", (None, "")),
        )
    )
    moe_cap = (
        None
        if len(per_gl) < 2
        else (per_gl["qwen235b"][0] / per_gl["llama70b"][0], f"{per_gl['qwen235b'][1]}+{per_gl['llama70b'][1]}")
    )
    out["capture_moe_layer_weight"] = _span(pts(moe_cap or (None, "")), bounds=[(1.0, "")], fallback=1.0)

    out["jit_kernels_s"] = _span(
        pts((5.0, "")),  # Triton JIT 5 s, Meta-Llama-3-8B (vllm PR #11005)
        bounds=pts(
            (0.0, ""),  # nothing to compile with a kept ~/.cache
            (60.0, "tensorfuse"),
        ),
    )  # init + imports 94 -> 34 s with a kept cache
    return {k: v for k, v in out.items() if v is not None}


def with_ranges(cs: ColdStartDB, derived: dict[str, Derived], engine: str = "vllm-v1") -> ColdStartDB:
    """``cs`` with the scale set's ranges replaced by ``derived`` (the others as in the file)."""
    sc = scale_set(cs, engine)
    ranges = {
        k: (
            r.model_copy(update=dict(low=derived[k].low, typical=derived[k].typical, high=derived[k].high))
            if k in derived
            else r
        )
        for k, r in sc.ranges.items()
    }
    return dataclasses.replace(cs, scale={**cs.scale, sc.name: sc.model_copy(update={"ranges": ranges})})


def _check(case: StartupCase, cs: ColdStartDB) -> CaseCheck:
    bds = case_breakdowns(case, cs)
    names = case.observed_phases or [p.name for p in bds["typical"].container_phases()]
    return CaseCheck(
        case, {lv: compared_seconds(b, case) for lv, b in bds.items()}, {n: bds["typical"].seconds(n) for n in names}
    )


@dataclass(frozen=True)
class HeldOut:
    """One case predicted with the file's ranges and with the ranges re-derived without its run."""

    run: str
    fitted: CaseCheck
    held: CaseCheck
    moved: dict[str, tuple[float, float]]  # range -> (file's value, held-out value) at the case's level

    @property
    def case(self) -> StartupCase:
        return self.fitted.case


def held_out_checks(cs: ColdStartDB | None = None, by: str = "run") -> list[HeldOut]:
    """Every case of the scale set, predicted without its own run (``by="run"``) or publication."""
    if by not in ("run", "publication"):
        raise ValueError(f"by={by!r} is unknown; use 'run' or 'publication'")
    cs = cs or load_coldstart()
    sc = scale_set(cs)
    runs = {c.name: case_run(c) for c in sc.cases}
    out = []
    for case in sc.cases:
        own = runs[case.name]
        exclude = frozenset(
            r
            for r in set(runs.values()) | set(ANYSCALE_RUNS)
            if r == own or (by == "publication" and publication(r) == publication(own))
        )
        derived = derive_ranges(exclude, cs)
        lv = case.level
        moved = {
            k: (sc.ranges[k].at(lv), getattr(d, lv))
            for k, d in derived.items()
            if abs(getattr(d, lv) - sc.ranges[k].at(lv)) > 0.01 * max(abs(sc.ranges[k].at(lv)), 1e-12)
        }
        out.append(HeldOut(own, _check(case, cs), _check(case, with_ranges(cs, derived)), moved))
    return out


_SHORT = {
    "distributed_init_s_base": "init base",
    "distributed_init_s_per_rank": "init/rank",
    "p2p_check_s_per_pair": "P2P/pair",
    "loader_Bps_per_rank": "loader",
    "dynamo_multiplier": "Dynamo x",
    "dynamo_moe_layer_weight": "Dynamo MoE x",
    "compile_miss_multiplier": "Inductor x",
    "compile_hit_multiplier": "cache load x",
    "capture_s_per_graph_layer": "capture/graph-layer",
    "capture_moe_layer_weight": "capture MoE x",
    "jit_kernels_s": "JIT",
}


def _fmt(key: str, v: float) -> str:
    if key == "loader_Bps_per_rank":
        return f"{v / 1e9:.2f} GB/s"
    if key == "capture_s_per_graph_layer":
        return f"{v * 1e3:.2f} ms"
    if key.endswith("_s") or "_s_" in key:
        return f"{v:.2f} s"
    return f"{v:.2f}"


def holdout_markdown(held: list[HeldOut], publication_level: list[HeldOut] | None = None) -> str:
    """The docs/operations.md table: each case fitted on all sources vs with its own run held out."""
    pub = {h.case.name: h for h in publication_level or ()}
    rows = [
        "| start-up | its run | ranges that move (all sources -> held out) | observed | fitted on all | held out"
        + (" | publication held out" if pub else "")
        + " | checked at |",
        "|---|---|---|---|---|---" + ("|---" if pub else "") + "|---|",
    ]

    def cell(c: CaseCheck) -> str:
        return f"{c.checked_s:.0f} s ({c.error:+.0%})"

    for h in held:
        moved = "; ".join(f"{_SHORT.get(k, k)} {_fmt(k, a)} -> {_fmt(k, b)}" for k, (a, b) in h.moved.items()) or "none"
        rows.append(
            f"| {h.case.name} | {h.run} | {moved} | {h.case.observed_s:.0f} s | {cell(h.fitted)} | "
            f"{cell(h.held)}" + (f" | {cell(pub[h.case.name].held)}" if pub else "") + f" | {h.case.level} |"
        )
    return "\n".join(rows)


def fed_ranges(cs: ColdStartDB | None = None) -> dict[str, list[str]]:
    """Case name -> the ranges its run is a source of, in the file's order (what its ``feeds`` lists)."""
    cs = cs or load_coldstart()
    sc = scale_set(cs)
    full = derive_ranges(cs=cs)
    return {c.name: [k for k in sc.ranges if k in full and case_run(c) in full[k].runs] for c in sc.cases}
