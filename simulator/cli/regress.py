"""``epdsim regress``: sizing regression of a suite against a baseline, or between two calibration profiles.

Hooked into ``simulator/cli/commands.py`` by ``add_subparsers(sub)``.  Exit codes:
0 every figure held (or the baseline was rewritten with ``--update``),
1 a figure moved beyond its tolerance or has no baseline, 2 a user error
(bad suite, scenario, baseline or hwdb folder), printed as one paragraph.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import hwdb
from simulator.console import print_notes, wide_tables
from simulator.errors import print_user_error
from simulator.inputs import read_yaml
from simulator.outputs import check_output, write_failed
from simulator.perf import FitError
from simulator.plan import PlanError
from simulator.regress.compare import Row, baseline_record, compare, read_baseline, write_baseline
from simulator.regress.report import explain, fmt, fmt_change, markdown, write_junit
from simulator.regress.runner import run_suite
from simulator.regress.suite import LoadedSuite, RegressError, load_suite
from simulator.scenario import ScenarioError

REGRESS_ERRORS = (RegressError, PlanError, ScenarioError, hwdb.HwdbError, FitError, ValidationError)
_STYLE = {"held": "green", "moved": "bold red", "new": "bold red", "removed": "yellow"}


# The most characters a row's name (entry, figure and unit) and its change take before they wrap at spaces.
NAME_WIDTH, CHANGE_WIDTH = 20, 10


def _tables(rows: list[Row], title: str, old_label: str, new_label: str, width: int) -> list[Table]:
    """The figures as tables within ``width``: each row named "entry: figure [unit]" (wrapped at spaces,
    never cut), and the columns that do not fit in further tables that repeat the name (``wide_tables``).
    The value columns are headed by the labels' first words (OLD/NEW, baseline/new); a label's file name
    is printed above the tables, so a long one neither widens the columns nor is cut."""
    old, new = old_label.split(" ", 1)[0], new_label.split(" ", 1)[0]
    heads = ["figure", old, new, "change", "tolerance", "status"]
    cells = [
        [
            escape(f"{r.entry}: {r.figure} [{r.unit}]"),
            fmt(r.old),
            fmt(r.new),
            fmt_change(r),
            r.tolerance,
            f"[{_STYLE[r.status]}]{r.status}{' (entry redefined)' if r.redefined else ''}[/]",
        ]
        for r in rows
    ]
    return wide_tables(
        title,
        heads,
        cells,
        width,
        justify={old: "right", new: "right", "change": "right"},
        wrap={"figure": NAME_WIDTH, "change": CHANGE_WIDTH},
    )


def _profile_folder(arg: str, tmp: Path, label: str, copies: dict[str, str]) -> str:
    """A hwdb folder holding ``arg``: the folder itself, or a temporary one around a profile YAML file
    (recorded in ``copies``, copy path -> the user's path, so that messages name the user's file)."""
    p = Path(arg)
    if p.is_dir():
        return str(p)
    if p.is_file() and p.suffix in (".yaml", ".yml"):
        d = tmp / label / "profiles"
        d.mkdir(parents=True)
        shutil.copy(p, d / p.name)
        copies[str(d / p.name)] = copies[str(d.parent)] = arg
        return str(d.parent)
    raise RegressError(
        f"--compare-profiles: {label} '{arg}' is neither a hwdb folder nor a profile .yaml file; "
        "give a calibration profile (like hwdb/data/profiles/*.yaml) or a folder with profiles/"
    )


def _as_given(exc: Exception, copies: dict[str, str]) -> Exception:
    """``exc`` with the temporary copies of profile files named as the user gave them."""
    text = str(exc)
    if not any(c in text for c in copies):
        return exc
    for copy in sorted(copies, key=len, reverse=True):  # the file before its folder
        text = text.replace(copy, copies[copy])
    return RegressError(text)


def _check_selected(folders: tuple[str, ...], label: str, require: bool = False) -> hwdb.HardwareDB:
    """Every profile in ``folders`` must be the one the simulator picks for the key it is stored under
    (GPU, engine, engine version, model where given; same name as the one it replaces, or newest), else
    a run would silently use another.  Returns the database of those folders."""
    db = hwdb.load(folders)  # validates the files, with errors naming file and field
    for folder in folders:
        files = sorted((Path(folder) / "profiles").glob("*.yaml"))
        mine = [
            db.profiles[n]
            for n in (read_yaml(f, RegressError, "profile").get("name") for f in files)
            if n in db.profiles
        ]
        if require and not mine:
            raise RegressError(f"{label} '{folder}' holds no calibration profile (profiles/*.yaml)")
        for p in mine:
            chosen = db.profile_for(p.gpu, p.engine, p.engine_version, p.model)
            assert chosen is not None, "p itself matches its own key"
            if chosen.name != p.name:
                key = f"{p.gpu}, {p.engine} {p.engine_version}" + (f", {p.model}" if p.model else "")
                raise RegressError(
                    f"{label}: profile {p.name!r} in {folder} (created {p.created}) would not be "
                    f"used: profile {chosen.name!r} for {key} is newer (created {chosen.created}); "
                    "give it the same name as the profile it replaces, or a later created date"
                )
    return db


def _report(
    args, con: Console, loaded: LoadedSuite, rows: list[Row], elapsed: float, old_label: str, new_label: str
) -> int:
    if " " in old_label or " " in new_label:
        con.print(f"comparing {escape(old_label)} with {escape(new_label)}", highlight=False)
    for t in _tables(rows, f"epdsim regress {loaded.name}", old_label, new_label, con.width):
        con.print(t)
    failed = [r for r in rows if r.failed]
    for r in failed:
        con.print(f"[red]drift[/] {escape(r.entry)}: {escape(explain(r, old_label))}", highlight=False)
    held = sum(r.status == "held" for r in rows)
    con.print(
        f"{held} held, {len(failed)} moved or new, "
        f"{sum(r.status == 'removed' for r in rows)} removed ({elapsed:.1f} s)",
        highlight=False,
    )
    if args.junit:
        try:
            written = write_junit(args.junit, rows, loaded.name, elapsed, old_label)
        except OSError as exc:
            raise RegressError(write_failed(exc, "--junit", args.junit)) from None
        con.print(f"wrote {written}")
    if args.markdown:
        try:
            Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
            Path(args.markdown).write_text(markdown(rows, loaded.name, old_label, new_label))
        except OSError as exc:
            raise RegressError(write_failed(exc, "--markdown", args.markdown)) from None
        con.print(f"wrote {args.markdown}")
    return 1 if failed else 0


def _run(args, con: Console) -> int:
    if args.jobs is not None and args.jobs < 1:
        raise RegressError(f"--jobs {args.jobs}: give at least 1 worker process (1 runs in this process)")
    if args.compare_profiles and (args.update or args.baseline):
        raise RegressError(
            "--compare-profiles compares two profiles with each other, not with a baseline: "
            "drop --baseline/--update, or run those without --compare-profiles"
        )
    loaded = load_suite(args.suite)
    for option, path in (("--junit", args.junit), ("--markdown", args.markdown)):
        if path:
            check_output(path, option, folder=False, error=RegressError)
    extra = tuple(args.hwdb)
    notes = dict.fromkeys(_check_selected(extra, "--hwdb").notes)  # also: a missing folder is a clear HwdbError
    # each entry runs on its own folders with --hwdb's after them (tasks_for): say what those replace, once
    for own in dict.fromkeys(tuple(x.hwdb) for e in loaded.entries for x in (e.scenario, e.plan) if x and x.hwdb):
        notes.update(dict.fromkeys(hwdb.load((*own, *extra)).notes))
    print_notes(notes)
    t0 = time.perf_counter()
    if args.compare_profiles:
        old_arg, new_arg = args.compare_profiles
        copies: dict[str, str] = {}
        with tempfile.TemporaryDirectory(prefix="epdsim-regress-") as tmp:
            old_dir = _profile_folder(old_arg, Path(tmp), "OLD", copies)
            new_dir = _profile_folder(new_arg, Path(tmp), "NEW", copies)
            try:
                _check_selected((*extra, old_dir), "--compare-profiles OLD", require=True)
                _check_selected((*extra, new_dir), "--compare-profiles NEW", require=True)
                before = run_suite(loaded, (*extra, old_dir), args.jobs)
                after = run_suite(loaded, (*extra, new_dir), args.jobs)
            except REGRESS_ERRORS as exc:
                raise _as_given(exc, copies) from None
        rows = compare(loaded, baseline_record(loaded, before), after)
        return _report(
            args, con, loaded, rows, time.perf_counter() - t0, f"OLD {Path(old_arg).name}", f"NEW {Path(new_arg).name}"
        )
    if not args.baseline:
        raise RegressError(
            "epdsim regress: give --baseline FILE (the figures to compare with), or --compare-profiles OLD NEW"
        )
    if args.update:
        check_output(args.baseline, "--baseline", folder=False, error=RegressError)
    old = read_baseline(args.baseline, loaded, must_exist=not args.update)
    new = run_suite(loaded, extra, args.jobs)
    rows = compare(loaded, old, new)
    if args.update:
        for t in _tables(rows, f"epdsim regress {loaded.name} (updating the baseline)", "baseline", "new", con.width):
            con.print(t)
        con.print(
            f"wrote baseline {write_baseline(args.baseline, loaded, new)} "
            f"({sum(len(v) for v in new.values())} figures, {time.perf_counter() - t0:.1f} s)"
        )
        return 0
    return _report(args, con, loaded, rows, time.perf_counter() - t0, "baseline", "new")


def cmd_regress(args, con: Console) -> int:
    try:
        return _run(args, con)
    except REGRESS_ERRORS as exc:
        return print_user_error(exc)


def add_subparsers(sub) -> None:
    r = sub.add_parser("regress", help="compare a suite's sizing figures with a baseline; exit 1 on drift")
    r.add_argument("suite", help="suite YAML (scenarios, figures, tolerances; see docs/ci.md)")
    r.add_argument("--baseline", help="baseline JSON to compare with (written by --update)")
    r.add_argument(
        "--update", action="store_true", help="rewrite the baseline from this run (after a deliberate change)"
    )
    r.add_argument(
        "--compare-profiles",
        nargs=2,
        metavar=("OLD", "NEW"),
        help="run the suite under two calibration profiles (profile .yaml files or hwdb folders) and show what moved",
    )
    r.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder (repeatable)")
    r.add_argument("--jobs", type=int, default=None, help="worker processes (default: the usable CPUs)")
    r.add_argument("--junit", help="write JUnit XML here (one test case per figure)")
    r.add_argument("--markdown", help="write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")
    r.set_defaults(func=cmd_regress)
