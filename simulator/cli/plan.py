"""``epdsim plan REQUEST.yaml``: the cheapest deployment meeting the SLOs, the Pareto front, artefacts.

Hooked into ``simulator/cli/commands.py`` by ``add_subparsers(sub)``.  User errors
(bad request, impossible constraints, unknown GPU, Ray unavailable) print one
paragraph on stderr and exit 2.  Ctrl-C during verification keeps what has
finished: the tables are printed and written from the verified part.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

import hwdb
from simulator import fmt
from simulator.console import print_notes, wide_tables
from simulator.errors import print_user_error
from simulator.inputs import int_arg
from simulator.outputs import check_output, write_failed
from simulator.perf import FitError
from simulator.plan import PlanError, artefacts, load_plan_request
from simulator.plan.executors import ExecutorError
from simulator.scenario import ScenarioError

PLAN_ERRORS = (PlanError, ExecutorError, ScenarioError, hwdb.HwdbError, FitError, ValidationError, FileNotFoundError)


def _f(x: float | None, unit: str = "") -> str:
    if x is None or x != x:
        return "-"
    if math.isinf(x):
        return "∞"
    if unit == "s":
        return f"{x * 1e3:.0f} ms" if x < 1 else f"{x:.2f} s"
    return f"{x:,.2f}{unit}"


# The most characters a layout takes in a row before it wraps at spaces; names stay whole.
LAYOUT_WIDTH = 30


def candidate_tables(title: str, df, q: int, width: int, full_reason: bool = False) -> list[Table]:
    """Candidates as tables that fit ``width``: figures never wrap, the layout and the reason wrap at
    spaces, and columns that do not fit go to further tables repeating the layout (``wide_tables``)."""
    # two-line headers keep the layout and the figures within 80 columns, the reason in a second table
    heads = ["candidate", "$/h", "$/M\ntok", "goodput\nreq/s", f"p{q}\nTTFT", f"p{q}\nTPOT", "sim", "why not"]
    rows = []
    for r in df.to_dict("records"):
        why = r["rejected_reason"] or "recommended"
        # a goodput search that reached its upper bound only knows a lower bound
        goodput = ("≥ " if r.get("goodput_capped") else "") + _f(r["goodput_rps"])
        rows.append(
            [
                escape(r["layout"]),
                _f(r["cost_usd_per_hour"]),
                _f(r["cost_usd_per_million_tokens"]),
                goodput,
                _f(r["ttft_s"], "s"),
                _f(r["tpot_s"], "s"),
                "yes" if r["verified"] else "est",
                escape(why if full_reason else why.split(":")[0]),
            ]
        )
    return wide_tables(title, heads, rows, width, wrap={"candidate": LAYOUT_WIDTH, "why not": _rest(width)})


def _rest(width: int) -> int:
    """Characters left for a wrapped text column beside the layout column and one short column such as
    "sim" (borders and padding: 11, that column: 3), so the two share a table when the figures do not."""
    return max(20, width - LAYOUT_WIDTH - 14)


def cmd_plan(args, con: Console) -> int:
    req = load_plan_request(args.request)
    if args.slo_at_band_edge:
        req = req.model_copy(update={"constraints": req.constraints.model_copy(update={"slo_at_band_edge": True})})
    if req.hwdb:
        print_notes(hwdb.load(req.hwdb).notes)
    for option, path in (("--out", args.out), ("--artefacts", args.artefacts)):
        if path:
            check_output(path, option, folder=True, error=PlanError)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=args.quiet,
    ) as bar:
        tasks: dict[str, TaskID] = {}

        def progress(done: int, total: int, stage: str) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        from simulator.plan import run_plan  # noqa: PLC0415 - pandas and the simulator: not at start-up
        from simulator.plan.bands import band_frame, verdict  # noqa: PLC0415 - pandas: not at start-up

        res = run_plan(req, progress=progress, workers=args.workers, ray_address=args.ray, out_dir=args.out)
    q = req.percentile
    df = res.candidates
    con.print(
        f"[bold]{req.name}[/]: {len(df)} candidates, {int(df['verified'].sum())} simulated "
        f"({req.search.replications} seeds each), target {req.target_rate:g} req/s, SLO p{q} "
        f"TTFT <= {_f(req.slo.ttft_s, 's')}, TPOT <= {_f(req.slo.tpot_s, 's')}"
        + (", judged at the model error band's pessimistic edge" if req.constraints.slo_at_band_edge else ""),
        highlight=False,
    )
    verified = df[df["verified"]].sort_values("cost_usd_per_hour")
    for t in (
        *candidate_tables("Pareto front (cost vs goodput vs TTFT)", res.pareto.head(args.top), q, con.width),
        *candidate_tables("simulated candidates", verified, q, con.width, full_reason=True),
    ):
        con.print(t)
    fam = [
        [
            escape(r["family"]),
            escape(r["layout"]) if isinstance(r["layout"], str) else "-",
            _f(r["cost_usd_per_hour"]),
            _f(r["goodput_rps"]),
            escape(str(r["lost_because"])),
        ]
        for r in res.families.to_dict("records")
    ]
    for t in wide_tables(
        "families",
        ["family", "best", "$/h", "goodput\nreq/s", "lost because"],
        fam,
        con.width,
        wrap={"best": LAYOUT_WIDTH, "lost because": max(30, con.width - LAYOUT_WIDTH - 40)},
    ):
        con.print(t)
    for note in res.notes:
        con.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    rec = res.recommended
    if rec is None:
        for t in candidate_tables(
            "closest candidates (nothing meets the SLO)", res.closest, q, con.width, full_reason=True
        ):
            con.print(t)
        return 1
    at_least = "≥ " if rec.get("goodput_capped") else ""  # the goodput search stopped at its upper bound
    con.print(
        f"[bold green]recommended:[/] {rec['layout']} — ${rec['cost_usd_per_hour']:,.2f}/h, simulated goodput "
        f"{at_least}{rec['goodput_rps']:.3g} req/s (headroom {at_least}{rec['headroom_rate']:+.0%} "
        f"over {req.target_rate:g}), "
        f"attainment {fmt.attainment(rec['attainment'], rec['attainment_ci95'], req.search.replications)} "
        "at the target rate",
        highlight=False,
    )
    edge = rec.get("meets_slo_at_band_edge")
    colour = "green" if edge is True else "yellow"
    con.print(f"[{colour}]model error band:[/] {escape(verdict(res, band_frame(res)))}", highlight=False)
    if args.artefacts:
        out = Path(args.artefacts)
        try:
            for name, text in artefacts(res).items():
                path = out / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        except OSError as exc:
            raise PlanError(write_failed(exc, "--artefacts", out)) from None
        con.print(f"wrote deployment artefacts to {out}")
    return 0


def _run(args, con: Console | None = None) -> int:
    con = con or Console()
    try:
        return cmd_plan(args, con)
    except PLAN_ERRORS as exc:
        return print_user_error(exc)


def add_subparsers(sub) -> None:
    """Hook for ``simulator/cli/commands.py``: adds ``epdsim plan``."""
    p = sub.add_parser("plan", help="search deployments for the cheapest one meeting the SLOs; emit artefacts")
    p.add_argument("request", help="plan request YAML (see docs/planner.md, examples/plan_*.yaml)")
    p.add_argument(
        "--workers", type=int_arg(1, 4096), default=None, help="local worker processes (default: usable cores)"
    )
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run simulations on a Ray cluster (needs the 'ray' extra); 'local' starts one here",
    )
    p.add_argument("--out", help="folder for verified.jsonl (incremental, resumable), candidates.csv, pareto.csv")
    p.add_argument("--artefacts", metavar="DIR", help="write vLLM/SGLang commands, Kubernetes YAML, router config")
    p.add_argument(
        "--slo-at-band-edge",
        action="store_true",
        help="plan at the model error band's pessimistic edge: a candidate meets the SLO only if its "
        "TTFT/TPOT x (1 + band) do; one without a band is refused (constraints.slo_at_band_edge)",
    )
    p.add_argument("--top", type=int_arg(0, 100_000), default=15, help="rows of the Pareto front to print")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
