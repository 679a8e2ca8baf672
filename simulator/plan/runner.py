"""``run_plan``: enumerate, screen, verify, rank; the :class:`PlanResult` it returns.

Stages (each reported to ``progress(done, total, stage)``):

1. ``enumerate``: memory fit per (GPU, TP), candidates per family;
2. ``screen``: the analytic estimate of every candidate (:mod:`simulator.plan.screen`);
3. ``verify``: the discrete-event simulation of the cheapest candidates the screen accepts and of a few
   cheaper ones it rejected narrowly, over several seeds, with a goodput search over rate.

The recommendation is the cheapest candidate whose simulated attainment at the target rate meets the
SLO (with ``constraints.slo_at_band_edge``, whose figures also meet it at the model error band's
pessimistic edge: :mod:`simulator.plan.bands`).  With ``out_dir`` every verified candidate is appended to
``verified.jsonl`` as it finishes, and a rerun with the same request reuses those lines (so an interrupted
plan resumes).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path

from simulator.outputs import write_failed
from simulator.plan.bands import band_frame, candidate_bands, edge_refusal, layout_statuses, verdict
from simulator.plan.candidates import PRE_SCREEN, build_context, to_scenario
from simulator.plan.executors import default_workers, interrupt_guard, run_local, run_ray
from simulator.plan.families import check_families, enumerate_candidates
from simulator.plan.rank import PlanResult, assemble
from simulator.plan.request import PlanError, PlanRequest
from simulator.plan.screen import Screen
from simulator.plan.verify import verify_task

Progress = Callable[[int, int, str], None]


def request_lifetime(req: PlanRequest, mean_out: float) -> float:
    """A request's expected lifetime at the SLO (seconds): TTFT target plus the output at the TPOT target."""
    ttft = req.slo.ttft_s if req.slo.ttft_s is not None else 1.0
    tpot = req.slo.tpot_s if req.slo.tpot_s is not None else 0.05
    return ttft + mean_out * tpot


def _request_key(req: PlanRequest) -> str:
    # Judging at the band's edge changes no simulation: a rerun with it reuses the verified lines.
    data = req.model_dump_json(exclude={"constraints": {"slo_at_band_edge"}})
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def _est_violation(row: dict, slo) -> float:
    """Screen latency over the SLO target at the target rate (the larger of TTFT and TPOT; 1 = on it)."""
    v = [row["est_ttft_s"] / slo.ttft_s if slo.ttft_s else 0.0, row["est_tpot_s"] / slo.tpot_s if slo.tpot_s else 0.0]
    return max(v)


def _choose_verify(rows: list[dict], req: PlanRequest) -> list[str]:
    """Cheapest candidates the screen accepts, cheaper ones it rejected narrowly, and the cheapest
    accepted candidate of each family."""
    if req.search.verify == 0:
        return []
    live = [r for r in rows if not r["rejected_reason"].startswith(PRE_SCREEN)]
    ok = sorted((r for r in live if r["est_meets_slo"]), key=lambda r: (r["cost_usd_per_hour"], -r["est_goodput_rps"]))
    chosen = [r["id"] for r in ok[: req.search.verify]]
    ceiling = ok[0]["cost_usd_per_hour"] if ok else math.inf
    near = sorted(
        (
            r
            for r in live
            if not r["est_meets_slo"]
            and r["cost_usd_per_hour"] < ceiling
            and r["est_goodput_rps"] >= 0.5 * req.target_rate
        ),
        key=lambda r: (-r["est_goodput_rps"], r["cost_usd_per_hour"]),
    )
    if not ok:  # nothing passes the screen: simulate the closest so that the answer is still checked
        near = sorted(live, key=lambda r: (-r["est_goodput_rps"], _est_violation(r, req.slo), r["cost_usd_per_hour"]))
    chosen += [r["id"] for r in near[: req.search.borderline if ok else max(req.search.borderline, 3)]]
    for fam in req.constraints.families:  # each family's best by the screen, so that its loss is simulated
        best = next((r for r in ok if r["family"] == fam), None)
        if best is not None:
            chosen.append(best["id"])
    return list(dict.fromkeys(chosen))


def run_plan(
    req: PlanRequest,
    progress: Progress | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
    out_dir: str | Path | None = None,
) -> PlanResult:
    """Plan ``req``: see the module docstring.  Raises PlanError for impossible input.  Ctrl-C during
    the simulations returns the plan built from what finished (``interrupted`` set)."""
    with interrupt_guard():
        return _run_plan(req, progress, workers, ray_address, out_dir)


def _run_plan(
    req: PlanRequest,
    progress: Progress | None,
    workers: int | None,
    ray_address: str | None,
    out_dir: str | Path | None,
) -> PlanResult:
    progress = progress or (lambda done, total, stage: None)
    check_families(req)  # before the hwdb is loaded and the workload sampled
    ctx = build_context(req)
    cands = enumerate_candidates(ctx)
    by_id = {c.id: c for c in cands}
    progress(len(cands), len(cands), "enumerate")
    screen = Screen(ctx)
    seen = layout_statuses(ctx.layouts)
    rels = {c.id: candidate_bands(req, c, ctx.model, ctx.db, seen) for c in cands}
    at_edge = req.constraints.slo_at_band_edge
    rows = []
    q = req.percentile
    for i, c in enumerate(cands):
        row = {
            "id": c.id,
            "family": c.family,
            "layout": c.layout,
            "gpus": c.gpus,
            "cost_usd_per_hour": c.cost_usd_per_hour,
            "percentile": q,
        }
        if c.rejected:
            row.update(
                est_ttft_s=math.inf,
                est_tpot_s=math.inf,
                est_goodput_rps=0.0,
                est_meets_slo=False,
                rejected_reason=c.rejected,
            )
        else:
            e = screen.estimate(c)
            row.update(
                est_ttft_s=e.ttft_s,
                est_tpot_s=e.tpot_s,
                est_goodput_rps=e.goodput_rps,
                est_meets_slo=not e.limit,
                rejected_reason=e.limit,
            )
            # Judged at the edge already here, so that the verify budget goes to candidates that may hold there.
            why = edge_refusal(e.ttft_s, e.tpot_s, rels[c.id], req.slo, q) if at_edge and not e.limit else ""
            if why:
                row.update(est_meets_slo=False, rejected_reason=why)
        rows.append(row)
        if i % 200 == 0:
            progress(i + 1, len(cands), "screen")
    progress(len(cands), len(cands), "screen")

    verify_ids = _choose_verify(rows, req)
    key = _request_key(req)
    done: dict[str, dict] = {}
    log = None
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        log = Path(out_dir) / "verified.jsonl"
        if log.exists():
            for line in log.read_text().splitlines():
                rec = json.loads(line)
                if rec.get("request_key") == key and rec["id"] in by_id:
                    done[rec["id"]] = rec
    est = {r["id"]: r for r in rows}
    lifetime = request_lifetime(req, ctx.stats.mean_out)
    planned = list(verify_ids)

    def task(cid: str) -> dict:
        return {
            "id": cid,
            "scenario": to_scenario(req, by_id[cid]).model_dump(mode="json"),
            "rate": req.target_rate,
            "replications": req.search.replications,
            "iterations": req.search.goodput_iterations,
            "hint": est[cid]["est_goodput_rps"],
            "max_rate": req.target_rate * req.search.goodput_max_factor,
            "lifetime_s": lifetime,
            "min_requests": req.search.requests or 1000,
        }

    def on_done(res: dict) -> None:
        res["request_key"] = key
        done[res["id"]] = res
        if log is not None:
            with log.open("a") as fh:
                fh.write(json.dumps(res) + "\n")
        progress(sum(c in done for c in planned), len(planned), "verify")

    def verify(ids: list[str]) -> bool:
        tasks = [task(cid) for cid in ids if cid not in done]
        progress(sum(c in done for c in planned), len(planned), "verify")
        if ray_address:
            return run_ray(verify_task, tasks, ray_address, on_done)
        return run_local(verify_task, tasks, workers or default_workers(), on_done)

    interrupted = verify(verify_ids)
    result = assemble(req, ctx, rows, done, by_id, rels)
    if not interrupted and req.search.verify_front:
        # Front points near the target that only the screen has seen: simulate them too, then re-rank.
        front = result.pareto
        extra = front[~front["verified"] & (front["goodput_rps"] >= 0.5 * req.target_rate)]["id"]
        extra = [cid for cid in extra if cid not in done][: req.search.verify_front]
        if extra:
            planned += extra
            interrupted = verify(extra)
            result = assemble(req, ctx, rows, done, by_id, rels)
    result.interrupted = interrupted
    result.notes[:0] = ctx.notes
    if result.recommended is not None:
        for gpu in sorted({p.gpu for p in by_id[result.recommended["id"]].pools}):
            if ctx.profile(gpu) is None:
                result.notes.append(
                    f"warning: the recommendation rests on {gpu}, which has no calibration profile: "
                    "its step times are datasheet peaks x default efficiencies, with no measured "
                    "error band; set constraints.prefer_calibrated: true to plan on calibrated GPUs"
                )
    if interrupted:
        result.notes.append(
            f"interrupted: {sum(c in done for c in planned)} of {len(planned)} verifications "
            "finished; the rest rely on the screen estimate"
        )
    if out_dir is not None:
        try:
            write_result(result, out_dir)
        except OSError as exc:  # a disk that filled during the run: name the folder, not a bare Errno
            raise PlanError(write_failed(exc, "--out", out_dir)) from None
    return result


def write_result(result: PlanResult, out_dir: str | Path) -> list[Path]:
    """Write candidates.csv, pareto.csv and recommended.json into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "candidates.csv", out / "pareto.csv", out / "recommended.json"]
    result.candidates.to_csv(paths[0], index=False)
    result.pareto.to_csv(paths[1], index=False)
    paths[2].write_text(
        json.dumps(
            {
                "recommended": result.recommended,
                "band_verdict": verdict(result, band_frame(result)),
                "notes": result.notes,
                "interrupted": result.interrupted,
            },
            indent=2,
            default=str,
        )
    )
    return paths
