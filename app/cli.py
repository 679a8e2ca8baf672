"""``epdsim app`` (start the Streamlit what-if planner) and ``epdsim report`` (HTML without the app).

Hooked into ``simulator/cli/commands.py`` by ``add_subparsers(sub)``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from simulator.outputs import OutputPathError, check_output, write_failed

HOME = Path(__file__).resolve().parent / "Home.py"


def cmd_app(args, con=None) -> int:
    """Run ``streamlit run app/Home.py``; returns its exit code."""
    # -P (Python 3.11+): the working directory is not put on sys.path, so a folder there named `app` cannot
    # shadow the installed package the pages import
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    cmd = [
        sys.executable,
        *safe_path,
        "-m",
        "streamlit",
        "run",
        str(HOME),
        "--server.port",
        str(args.port),
        "--server.address",
        args.address,
        "--server.headless",
        "true" if args.headless else "false",
        # no first-run email prompt: it waits on stdin before the server starts listening
        "--server.showEmailPrompt",
        "false",
        # viewer: no Deploy button (a Streamlit Cloud dialog) nor rerun/clear-cache developer items
        "--client.toolbarMode",
        "viewer",
        "--browser.gatherUsageStats",
        "false",
        "--server.maxUploadSize",
        "20",
    ]
    print(f"epdsim app on http://{args.address}:{args.port}", flush=True)
    proc = subprocess.Popen(cmd)
    return run_until_stopped(proc)


# SIGINT is handled like the others, not left to Python's KeyboardInterrupt: a shell script's background job
# starts with SIGINT ignored, which Python keeps, so `kill -INT` on it would do nothing.
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))


def run_until_stopped(proc: subprocess.Popen, grace_s: float = 20.0) -> int:
    """Wait for the Streamlit server ``proc``; a stop signal sent to epdsim alone (``kill PID``, a closed
    terminal, Ctrl-C or ``kill -INT``, also from a script that started epdsim in the background with SIGINT
    ignored) is passed on to it and epdsim waits for it to stop (``grace_s``, then it is killed), so no
    server is left holding the port.  Returns 0 after a requested stop, else the server's exit code."""
    stopped = []

    def forward(signum, frame):
        stopped.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    deadline = None
    try:
        while True:
            try:
                # woken each second: a stop that came in while waiting starts the grace period
                rc = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                if stopped and deadline is None:
                    deadline = time.monotonic() + grace_s
                if deadline is not None and time.monotonic() > deadline:
                    proc.kill()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return 0 if stopped else rc


def cmd_report(args, con=None) -> int:
    """``epdsim report validation VALIDATION.json --out FILE.html`` or ``epdsim report plan REQUEST.yaml --out
    FILE.html`` (runs the planner)."""
    from app.report import plan_html, validation_html, write  # noqa: PLC0415 - Plotly: loaded when a report is written
    from simulator.scenario import ScenarioError  # noqa: PLC0415 - parser hook: loads when `epdsim report` runs

    check_output(args.out, "--out", folder=False, error=OutputPathError)  # before the plan runs

    def write_out(text: str) -> Path:
        try:
            return write(args.out, text)
        except OSError as exc:
            raise OutputPathError(write_failed(exc, "--out", args.out)) from None

    if args.kind == "plan":
        from simulator.plan import PlanError, load_plan_request, run_plan  # noqa: PLC0415 - only `report plan` runs it

        def progress(done, total, stage):
            print(f"\r{stage}: {done}/{total}   ", end="", file=sys.stderr, flush=True)

        try:
            res = run_plan(load_plan_request(args.source), progress=progress)
        except PlanError as exc:  # a user error: exit 2 with the message, like the other commands
            raise ScenarioError(str(exc)) from None
        print(file=sys.stderr)
        print(f"wrote {write_out(plan_html(res, plotly=args.report_plotly))}")
        return 0
    src = Path(args.source)
    if src.is_dir():
        src = src / "validation.json"
    if not src.is_file():
        raise ScenarioError(
            f"{args.source}: no validation.json there; give the folder or file that "
            f"`epdsim calibrate validate` wrote (default BUNDLE/validation)"
        )
    try:
        data = json.loads(src.read_text())
    except json.JSONDecodeError as exc:
        raise ScenarioError(
            f"{src}: not JSON ({exc}); give the validation.json of `epdsim calibrate validate`"
        ) from None
    path = write_out(validation_html(data, plotly=args.report_plotly))
    print(f"wrote {path}")
    return 0


def write_simulation_report(res, path: str | Path, plotly: str = "inline") -> Path:
    """The HTML report of one run (``epdsim simulate ... --report FILE.html [--report-plotly cdn]``)."""
    from app.report import results_html, write  # noqa: PLC0415 - Plotly: loaded when a report is written

    return write(path, results_html(res, plotly=plotly))


def add_plotly_argument(parser) -> None:
    """``--report-plotly inline|cdn`` (for ``epdsim simulate`` and ``epdsim report``)."""
    parser.add_argument(
        "--report-plotly",
        choices=["inline", "cdn"],
        default="inline",
        help="inline (default): Plotly's JavaScript inside the report, which opens offline (~5 MB); "
        "cdn: a script tag loads it from cdn.plot.ly, for a report of kilobytes that needs "
        "the network when opened",
    )


def add_subparsers(sub) -> None:
    """Hook for ``simulator/cli/commands.py``: adds ``epdsim app`` and ``epdsim report``."""
    a = sub.add_parser("app", help="start the what-if planner (Streamlit) in the browser")
    a.add_argument("--port", type=int, default=8501)
    a.add_argument("--address", default="localhost")
    a.add_argument("--headless", action="store_true", help="do not open a browser")
    a.set_defaults(func=cmd_app)
    r = sub.add_parser("report", help="self-contained HTML report with the app's charts")
    r.add_argument(
        "kind",
        choices=["validation", "plan"],
        help="validation: a calibration validation; plan: run a plan request and report it",
    )
    r.add_argument("source", help="validation: validation.json or its folder; plan: a plan request YAML")
    r.add_argument("--out", required=True, help="HTML file to write")
    add_plotly_argument(r)
    r.set_defaults(func=cmd_report)
