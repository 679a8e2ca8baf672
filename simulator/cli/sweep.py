"""``epdsim sweep SCENARIO.yaml``: the scenario at a list of offered rates, or with one knob varied.

Hooked into ``simulator/cli/commands.py`` by ``add_subparsers(sub)``.  Prints one row per point and,
for a rate sweep, the knee (docs/sweep.md); ``--out DIR`` writes ``sweep.csv`` and ``sweep.html``.
The points run on the planner's executors (local worker processes, or Ray with ``--ray``), with n/N
and the time left on stderr.  User errors (an unknown knob, a value of the wrong type, a rate that is
not positive) print one paragraph on stderr and exit 2; Ctrl-C keeps the finished points, prints and
writes them, and exits 130.
"""

from __future__ import annotations

import math
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

import hwdb
from app.cli import add_plotly_argument
from simulator import fmt
from simulator.console import print_notes, wide_tables
from simulator.errors import print_user_error
from simulator.inputs import float_arg, int_arg
from simulator.outputs import check_output, write_failed
from simulator.plan.executors import ExecutorError
from simulator.scenario import ScenarioError, load_scenario
from simulator.sweep.knee import FACTOR, TOLERANCE
from simulator.sweep.ladder import POINTS
from simulator.sweep.points import MAX_POINTS, RATE, SweepError

INTERRUPTED = 130  # the shell's code for a run ended by Ctrl-C
COLUMNS = (
    ("offered_rps", "offered req/s", fmt.number),
    ("achieved_rps", "achieved req/s", fmt.number),
    ("output_tok_s", "tok/s", lambda x: fmt.number(x, 0)),
    *(
        (f"{m}_{p}_s", f"{lab} {p}", fmt.duration)
        for m, lab in (("ttft", "TTFT"), ("tpot", "TPOT"))
        for p in ("p50", "p90", "p99")
    ),
    ("e2e_p90_s", "E2E p90", fmt.duration),
    ("slo_attainment", "SLO att.", fmt.percent),
    ("goodput_rps", "goodput req/s", fmt.number),
    ("cost_usd_per_hour", "$/h", fmt.usd),
)


def sweep_tables(res, width: int) -> list:
    """The points of ``res`` (:class:`simulator.sweep.run.SweepResult`) as rich tables (split into column
    groups that fit ``width``), the knee's row marked."""
    knee = res.knee
    first = "offered req/s" if res.knob == RATE else res.knob
    headers = [first] + [h for key, h, _ in COLUMNS if not (res.knob == RATE and key == "offered_rps")]
    rows = []
    for r in res.rows:
        mark = ""
        if knee is not None:
            mark = (
                " ◀ knee"
                if r["offered_rps"] == knee.rate_rps
                else " ◀ saturated"
                if r["offered_rps"] == knee.saturation_rps
                else ""
            )
        lead = fmt.number(r["offered_rps"]) if res.knob == RATE else str(r["value"])
        cells = [
            f(r[key]) if not (isinstance(r[key], float) and math.isnan(r[key])) else "-"
            for key, _, f in COLUMNS
            if not (res.knob == RATE and key == "offered_rps")
        ]
        rows.append([escape(lead + mark), *cells])
    right = dict.fromkeys(headers, "right")
    return wide_tables(
        f"sweep of {res.name} over {'the offered rate' if res.knob == RATE else res.knob}", headers, rows, width, right
    )


def write_outputs(res, out: str, plotly: str) -> list[Path]:
    """``sweep.csv`` (the records, SI units) and ``sweep.html`` (charts, knee, table) in folder ``out``."""
    from app.sweep_charts import sweep_html  # noqa: PLC0415 - Plotly: only when files are written

    folder = Path(out)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        csv = folder / "sweep.csv"
        res.frame().to_csv(csv, index=False)
        page = folder / "sweep.html"
        page.write_text(sweep_html(res, plotly=plotly), encoding="utf-8")
    except OSError as exc:
        raise SweepError(write_failed(exc, "--out", out)) from None
    return [csv, page]


def cmd_sweep(args, con: Console) -> int:
    # pandas and the simulator load when a sweep runs, not when `epdsim --help` builds the parser
    from simulator.sweep.prepare import prepare  # noqa: PLC0415 - pandas and the simulator: not at start-up
    from simulator.sweep.run import run_sweep  # noqa: PLC0415 - pandas and the simulator: not at start-up

    if args.out:
        check_output(args.out, "--out", folder=True, error=SweepError)
    scn = load_scenario(args.scenario)
    if args.seed is not None:
        scn = scn.model_copy(update={"seed": args.seed})
    db = hwdb.load(scn.hwdb)
    print_notes(db.notes)
    prep = prepare(scn, rates=args.rates, knob=args.knob, points=args.points, num_requests=args.num_requests, db=db)
    if prep.capacity_rps is not None and not args.quiet:
        con.print(
            f"estimated capacity {prep.capacity_rps:.3g} req/s: rates {', '.join(p.label for p in prep.points)}",
            highlight=False,
        )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=args.quiet,
    ) as bar:
        task = bar.add_task("sweep", total=len(prep.points))

        def progress(done: int, total: int, stage: str) -> None:
            bar.update(task, completed=done, total=total, description=f"sweep: {escape(stage)}")

        res = run_sweep(
            scn.name,
            prep.knob,
            list(prep.points),
            list(prep.scenarios),
            workers=args.workers,
            ray_address=args.ray,
            progress=progress,
            auto=prep.auto,
            db=db,
            knee_factor=args.knee_factor,
            knee_tolerance=args.knee_tolerance,
        )
    for t in sweep_tables(res, con.width):
        con.print(t)
    if res.knee is not None:
        con.print(f"[bold]{escape(res.knee.text())}[/]", highlight=False)
    for note in res.notes:
        con.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    if args.out and res.rows:
        paths = write_outputs(res, args.out, args.report_plotly)
        con.print(f"wrote {', '.join(str(p) for p in paths)}", highlight=False)
    return INTERRUPTED if res.interrupted else 0


def add_subparsers(sub) -> None:
    """Hook for ``simulator/cli/commands.py``: adds ``epdsim sweep``."""
    s = sub.add_parser("sweep", help="run a scenario at several offered rates (or one knob's values); find the knee")
    s.add_argument("scenario", help="scenario YAML (see docs/scenario.md)")
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--rates",
        metavar="R1,R2,...|auto",
        help="offered request rates (req/s), or auto: a geometric ladder around the scenario's "
        "estimated capacity, extended while its top still keeps up",
    )
    what.add_argument(
        "--knob",
        metavar="PATH=V1,V2,...",
        help="one scenario field and its values, e.g. pools[0].tp=1,2,4 or "
        "operations.startup.compile_cache=none,persistent (docs/sweep.md)",
    )
    s.add_argument("--points", type=int_arg(2, MAX_POINTS), default=POINTS, help="rates of --rates auto")
    s.add_argument(
        "--num-requests", type=int_arg(1, 10_000_000), default=None, help="requests per point (default: the scenario's)"
    )
    s.add_argument("--seed", type=int_arg(0, 2**63 - 1), default=None, help="override the scenario's seed")
    s.add_argument(
        "--knee-factor",
        type=float_arg(1.0, 1e6, lo_open=True),
        default=FACTOR,
        help=f"the knee's latency rule: TTFT p90 within this multiple of its lowest-rate value (default {FACTOR:g})",
    )
    s.add_argument(
        "--knee-tolerance",
        type=float_arg(0.0, 0.99),
        default=TOLERANCE,
        help=f"the knee's throughput rule: requests complete at no less than 1 - this share of the "
        f"rate they arrive at (default {TOLERANCE:g})",
    )
    s.add_argument(
        "--workers", type=int_arg(1, 4096), default=None, help="local worker processes (default: usable cores)"
    )
    s.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run the points on a Ray cluster (needs the 'ray' extra); 'local' starts one here",
    )
    s.add_argument("--out", metavar="DIR", help="folder for sweep.csv and sweep.html")
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    add_plotly_argument(s)
    s.set_defaults(func=_run)


def _run(args, con: Console | None = None) -> int:
    try:
        return cmd_sweep(args, con or Console())
    except (SweepError, ScenarioError, ExecutorError, hwdb.HwdbError) as exc:
        return print_user_error(exc)
