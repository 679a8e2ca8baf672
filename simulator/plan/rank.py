"""From screened and simulated figures to the final table: meets_slo, goodput, cost per token, the
recommendation with its headroom, the reason each other candidate lost, the Pareto front, and the
closest candidates when nothing meets the SLO."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from simulator import fmt
from simulator.plan.bands import NO_BAND, edge_columns, edge_refusal
from simulator.plan.candidates import PRE_SCREEN, Candidate, to_scenario
from simulator.plan.pareto import pareto_front
from simulator.plan.request import PlanRequest
from simulator.scenario import Scenario


@dataclass
class PlanResult:
    """A finished (or interrupted) plan.

    ``candidates``: one row per candidate (columns in docs/planner.md); ``pareto``: the rows on the
    cost/goodput/TTFT front; ``recommended``: the chosen candidate's record with its headroom, or None
    when nothing meets the SLO (then ``closest`` holds the nearest candidates and what limits them);
    ``families``: per family, its representative (the cheapest candidate that meets the SLO, simulated
    if one does, else by the screen; the closest one when none does), on what ``basis`` it was chosen,
    and why it lost.
    """

    request: PlanRequest
    candidates: pd.DataFrame
    pareto: pd.DataFrame
    recommended: dict | None
    closest: pd.DataFrame
    families: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    _cands: dict[str, Candidate] = field(default_factory=dict, repr=False)

    def candidate(self, candidate_id: str) -> Candidate:
        try:
            return self._cands[candidate_id]
        except KeyError:
            raise KeyError(f"no candidate {candidate_id!r} in this plan") from None

    def to_scenario(self, candidate_id: str, rate: float | None = None) -> Scenario:
        """The scenario that simulates a candidate under the planned workload (at ``rate`` if given)."""
        return to_scenario(self.request, self.candidate(candidate_id), rate)


def _per_million(cost_h: float, rps: float, out_tokens: float) -> float:
    """Dollars per million output tokens when serving ``rps`` requests/s of ``out_tokens`` each."""
    return cost_h / (rps * out_tokens * 3600.0) * 1e6 if rps > 0 else math.inf


def _violation(row: dict, slo) -> float:
    """How far a candidate is from the SLO at the target rate: max of latency / target (1 = on it)."""
    v = []
    if slo.ttft_s is not None:
        v.append(row["ttft_s"] / slo.ttft_s)
    if slo.tpot_s is not None:
        v.append(row["tpot_s"] / slo.tpot_s)
    return max(v) if v else 0.0


def _family_pick(sub: pd.DataFrame, rec: dict | None, slo) -> tuple[dict, str, str]:
    """One family's representative row, its basis and the verdict text.

    Basis ``simulated``: the cheapest candidate whose simulation meets the SLO.  ``screen``: none of
    the family's simulated candidates meets it, so the cheapest that passes the screen (its figures
    are estimates).  ``none``: nothing in the family meets the SLO either way; the closest candidate
    (highest goodput, simulated first, nearest the latency targets, cheapest) stands in for it.
    """
    recs = sub.to_dict("records")

    def by_cost(r: dict) -> tuple:
        # The recommendation's own order, so that the recommendation is its family's representative.
        return r["cost_usd_per_hour"], -r["goodput_rps"]

    sim_ok = [r for r in recs if r["verified"] and r["meets_slo"]]
    if sim_ok:
        b = min(sim_ok, key=by_cost)
        if rec is not None and b["id"] == rec["id"]:
            return b, "simulated", "recommended"
        return b, "simulated", f"meets the SLO (simulated); lost on {b['rejected_reason'] or 'cost'}"
    # A simulated failure outranks the screen's optimism: such a row does not pass (meets_slo is False).
    screen_ok = [r for r in recs if not r["verified"] and r["meets_slo"]]
    if screen_ok:
        b = min(screen_ok, key=by_cost)
        if rec is None:
            why = "raise search.verify to simulate it"
        elif b["cost_usd_per_hour"] >= rec["cost_usd_per_hour"]:
            why = f"lost on cost: ${b['cost_usd_per_hour'] - rec['cost_usd_per_hour']:,.2f}/h more (screen estimate)"
        else:
            why = "cheaper than the recommendation but beyond the verify budget (raise search.verify)"
        return b, "screen", f"passes the screen, not simulated; {why}"
    # Rows ruled out before screening have no figures: the closest is taken among the others if any.
    live = [r for r in recs if not r["rejected_reason"].startswith(PRE_SCREEN)] or recs
    b = min(live, key=lambda r: (-r["goodput_rps"], not r["verified"], _violation(r, slo), r["cost_usd_per_hour"]))
    return (
        b,
        "none",
        (
            f"no {b['family']} candidate meets the SLO (simulated or screen); the closest is limited by: "
            f"{b['rejected_reason'] or 'not simulated'}"
        ),
    )


def _families(req, df: pd.DataFrame, rec: dict | None) -> pd.DataFrame:
    """Per allowed family: ``best_id``, ``layout``, ``cost_usd_per_hour`` ($/h), ``goodput_rps`` (req/s),
    ``basis`` (simulated / screen / none, see :func:`_family_pick`) and ``lost_because`` (the verdict)."""
    fam_rows = []
    for fam in req.constraints.families:
        sub = df[df["family"] == fam]
        if not len(sub):
            fam_rows.append(
                {
                    "family": fam,
                    "best_id": None,
                    "layout": None,
                    "cost_usd_per_hour": np.nan,
                    "goodput_rps": np.nan,
                    "basis": None,
                    "lost_because": "no candidates",
                }
            )
            continue
        b, basis, why = _family_pick(sub, rec, req.slo)
        fam_rows.append(
            {
                "family": fam,
                "best_id": b["id"],
                "layout": b["layout"],
                "cost_usd_per_hour": b["cost_usd_per_hour"],
                "goodput_rps": b["goodput_rps"],
                "basis": basis,
                "lost_because": why,
            }
        )
    return pd.DataFrame(fam_rows)


def assemble(
    req, ctx, rows: list[dict], done: dict[str, dict], by_id: dict, rels: dict[str, dict] | None = None
) -> PlanResult:
    """The ranked plan from the screened ``rows`` and the simulations ``done``; ``rels``: each candidate's
    relative model error bands (:func:`simulator.plan.bands.candidate_bands`; none given: no band)."""
    out_tok = ctx.stats.mean_out
    rows = [dict(r) for r in rows]
    rels = rels or {}
    at_edge = req.constraints.slo_at_band_edge
    refused_at_edge = 0
    for r in rows:
        d = done.get(r["id"])
        r["verified"] = d is not None
        if d is not None:
            r.update(
                ttft_s=d["des_ttft_s"],
                tpot_s=d["des_tpot_s"],
                goodput_rps=d["des_goodput_rps"],
                meets_slo=bool(d["des_meets_slo"]),
                attainment=d["des_attainment"],
                attainment_ci95=d["des_attainment_ci95"],
                goodput_capped=bool(d["des_goodput_capped"]),
                des_runs=int(d["des_runs"]),
            )
            if not r["meets_slo"]:
                judged = (
                    f"attainment "
                    f"{fmt.attainment(d['des_attainment'], d['des_attainment_ci95'], req.search.replications)}"
                    f" < {fmt.percent(req.slo.attainment, 0)}"
                    if req.slo.percentile is None
                    else "percentiles over the targets"
                )
                r["rejected_reason"] = (
                    f"simulated: {judged} at {req.target_rate:g} req/s; p{r['percentile']} TTFT "
                    f"{d['des_ttft_s']:.3g} s, TPOT {d['des_tpot_s']:.3g} s"
                )
            elif r["rejected_reason"]:
                r["rejected_reason"] = ""  # the screen was pessimistic; the simulation decides
        else:
            r.update(
                ttft_s=r["est_ttft_s"],
                tpot_s=r["est_tpot_s"],
                goodput_rps=r["est_goodput_rps"],
                meets_slo=bool(r["est_meets_slo"]),
                attainment=np.nan,
                attainment_ci95=np.nan,
                goodput_capped=False,
                des_runs=0,
            )
        r["cost_usd_per_million_tokens"] = _per_million(r["cost_usd_per_hour"], r["goodput_rps"], out_tok)
        rel = rels.get(r["id"], NO_BAND)
        q = r["percentile"]
        why = edge_refusal(r["ttft_s"], r["tpot_s"], rel, req.slo, q) if at_edge and r["meets_slo"] else ""
        if why:
            r.update(meets_slo=False, rejected_reason=why)
        refused_at_edge += r["rejected_reason"].startswith("band edge")
        r.update(edge_columns(r["ttft_s"], r["tpot_s"], rel, r["meets_slo"], req.slo))
    ok = [r for r in rows if r["verified"] and r["meets_slo"]]
    ok.sort(key=lambda r: (r["cost_usd_per_hour"], -r["goodput_rps"]))
    rec = ok[0] if ok else None
    notes: list[str] = []
    if rec is not None:
        for r in rows:
            if r is rec or r["rejected_reason"]:
                continue
            if r["verified"]:
                r["rejected_reason"] = f"cost: ${r['cost_usd_per_hour'] - rec['cost_usd_per_hour']:,.2f}/h more"
            elif r["cost_usd_per_hour"] >= rec["cost_usd_per_hour"]:
                r["rejected_reason"] = (
                    f"cost: ${r['cost_usd_per_hour'] - rec['cost_usd_per_hour']:,.2f}/h more "
                    "(screen estimate, not simulated)"
                )
            else:
                r["rejected_reason"] = "unverified: cheaper and passes the screen, but beyond the verify budget"
    df = pd.DataFrame(rows)
    front = pareto_front(df[~df["rejected_reason"].str.startswith(PRE_SCREEN)])
    df["on_pareto"] = df["id"].isin(front["id"])
    recommended = None
    if rec is not None:
        recommended = dict(rec)
        recommended.update(
            headroom_rate=rec["goodput_rps"] / req.target_rate - 1.0,
            headroom_ttft=(1.0 - rec["ttft_s"] / req.slo.ttft_s) if req.slo.ttft_s else None,
            headroom_tpot=(1.0 - rec["tpot_s"] / req.slo.tpot_s) if req.slo.tpot_s else None,
            target_rate_rps=req.target_rate,
            cost_usd_per_million_tokens_at_target=_per_million(rec["cost_usd_per_hour"], req.target_rate, out_tok),
        )
        if rec["meets_slo_at_band_edge"] is False:
            notes.append(
                "warning: the recommendation meets the SLO at its predicted figures, but not at the model "
                "error band's pessimistic edge (its headroom is inside the band); set "
                "constraints.slo_at_band_edge: true (epdsim plan --slo-at-band-edge) to plan at the edge"
            )
    if at_edge:
        notes.append(
            f"planned at the model error band's pessimistic edge (constraints.slo_at_band_edge): "
            f"{refused_at_edge} candidate(s) meeting the SLO at their predicted figures were refused "
            "there; one with no band for a targeted figure (a datasheet-only GPU) is refused as "
            "unverifiable"
        )
    live = df[~df["rejected_reason"].str.startswith(PRE_SCREEN)].copy()
    closest = live.iloc[0:0]
    if rec is None:
        unseen = live[live["meets_slo"] & ~live["verified"]].sort_values("cost_usd_per_hour")
        if len(unseen):
            # The screen accepts these but the simulation never ran them: not "nothing meets the SLO".
            df.loc[df["id"].isin(unseen["id"]), "rejected_reason"] = (
                "unverified: passes the screen, not simulated (raise search.verify)"
            )
            closest = df[df["id"].isin(unseen["id"])].sort_values("cost_usd_per_hour").head(5).reset_index(drop=True)
            notes.append(
                f"no simulated candidate meets the SLO, but {len(unseen)} that the screen accepts were not "
                f"simulated; the cheapest is {closest.iloc[0]['layout']} "
                f"(${closest.iloc[0]['cost_usd_per_hour']:,.2f}/h). "
                "Fix: raise search.verify (or let an interrupted plan finish) to confirm one."
            )
        else:
            live["slo_violation"] = [_violation(r, req.slo) for r in live.to_dict("records")]
            live = live.sort_values(
                ["goodput_rps", "verified", "slo_violation", "cost_usd_per_hour"], ascending=[False, False, True, True]
            )
            closest = live.head(5).reset_index(drop=True)
            best = closest.iloc[0] if len(closest) else None
            notes.append(
                "no candidate meets the SLO at the target rate"
                + (
                    f"; the closest is {best['layout']} (goodput {best['goodput_rps']:.3g} req/s of "
                    f"{req.target_rate:g}; limited by: {best['rejected_reason']})"
                    if best is not None
                    else ""
                )
                + ". Fix: relax the SLO, lower the rate, raise constraints.max_gpus, or offer faster GPUs"
                + (" or calibrated ones (the SLO is judged at the band's edge)." if at_edge else ".")
            )
    # The front's rows as the table now holds them: reasons set above (unverified) appear there too.
    front = front[["id"]].merge(df.drop(columns="on_pareto"), on="id", how="left")
    return PlanResult(req, df, front, recommended, closest, _families(req, df, rec), notes, _cands=by_id)
