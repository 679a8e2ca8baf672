"""``epdsim calibrate``: measure a real vLLM server into a bundle, and show a bundle.

    epdsim calibrate run --out BUNDLE [--attach URL | --launch] [--resume] [--quick] ...
    epdsim calibrate run --pd --out BUNDLE [--connector example|nixl] ... (a prefill/decode pair: calibration/pd/cli.py)
    epdsim calibrate show BUNDLE                                      (calibration/harness/show.py)
    epdsim calibrate fit BUNDLE [--out HWDB_DIR]                      (calibration/fit/command.py)
    epdsim calibrate validate BUNDLE --profile HWDB_DIR [--tolerance 0.25] [--client-tolerance 0.25]
                                                                      (calibration/validation/command.py)

Also runs standalone: ``python -m calibration.cli run --out BUNDLE --launch --quick``.
Exit codes: 0 done, 2 user error (bad arguments, bundle missing or inconsistent),
3 server error (the server died, never became ready, or stopped answering).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

import hwdb
from calibration.harness.affinity import parse_pin
from calibration.harness.bundle import Bundle, BundleError
from calibration.harness.cli_options import PHASE_KINDS, add_run_options, parse_env
from calibration.harness.interrupt import interruptible
from calibration.harness.trace_gen import add_make_trace_parser
from calibration.pd.options import add_pd_options, check_not_pd_options
from simulator.console import print_notes, stdout_console
from simulator.errors import print_user_error

# The probe, client and server modules (httpx) are imported when a command runs, so that
# building the ``epdsim`` parser stays cheap.


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``run`` and ``show`` actions to a ``calibrate`` parser."""
    sub = p.add_subparsers(dest="calibrate_cmd", required=True)
    r = sub.add_parser(
        "run",
        help="measure a vLLM server (launched here or attached) into a bundle",
        description="Run the probe phases (prefill sweep, decode sweep, load tests) against a real "
        "vLLM server and append every measurement to a bundle directory.",
    )
    add_run_options(r)
    pd = r.add_argument_group(
        "prefill/decode pair (--pd)",
        "a prefill and a decode server joined by a vLLM KV "
        "connector, one Poisson load test through our router (--load-requests, --load-rates, "
        "--load-output); show and validate read the bundle (docs/calibration.md)",
    )
    pd.add_argument(
        "--pd", action="store_true", help="measure a disaggregated prefill/decode pair instead of one server"
    )
    add_pd_options(pd)
    r.set_defaults(calibrate_func=cmd_run)
    s = sub.add_parser("show", help="summarise a bundle")
    s.add_argument("bundle")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")
    s.set_defaults(calibrate_func=cmd_show)
    f = sub.add_parser(
        "fit",
        help="fit a calibration profile (efficiencies, step overhead) to a bundle",
        description="Fit the simulator's step-time parameters (compute and memory efficiency, "
        "prefill-attention efficiency, per-step overhead) to a bundle's prefill and "
        "decode sweeps, and write the profile into a hwdb folder.",
    )
    f.add_argument("bundle")
    f.add_argument("--out", help="hwdb folder to write profiles/, models/ and fits/ into (default BUNDLE/hwdb)")
    _sim_options(f)
    f.set_defaults(calibrate_func=_cmd_fit)
    v = sub.add_parser(
        "validate",
        help="replay a bundle's load tests in the simulator and compare",
        description="Replay every load test of a bundle (same send times, lengths and engine "
        "arguments) in the simulator with a calibrated profile, and write a report of "
        "measured vs predicted TTFT, TPOT, ITL and E2E.",
    )
    v.add_argument("bundle")
    v.add_argument("--profile", required=True, help="hwdb folder written by `calibrate fit` (or a profile YAML in it)")
    v.add_argument("--tolerance", type=float, default=0.25, help="relative error a check may have (0.25)")
    v.add_argument(
        "--client-tolerance",
        type=float,
        default=0.25,
        help="relative error of the client-side TTFT p50/p90 checks, made when the profile's calibrated "
        "engine has a fitted front end (0.25)",
    )
    v.add_argument("--out", help="report folder (default BUNDLE/validation)")
    v.add_argument("--phases", help="comma list of load phases to replay (default: all)")
    v.add_argument("--strict", action="store_true", help="exit with code 1 when a check fails")
    v.add_argument(
        "--without-overhead",
        action="store_true",
        help="replay without the fitted per-step host cost (the engine's defaults), for comparison",
    )
    _sim_options(v)
    v.set_defaults(calibrate_func=_cmd_validate)
    add_make_trace_parser(sub)
    return p


def _sim_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", help="hwdb GPU the server ran on (default: CPU-host for a vLLM CPU server)")
    p.add_argument("--model", help="model name or folder (default: the bundle's model folder or its config.json)")
    p.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder (repeatable)")
    p.add_argument("--max-num-seqs", type=int, help="override the engine's max_num_seqs read from the bundle")
    p.add_argument("--max-num-batched-tokens", type=int, help="override max_num_batched_tokens")
    p.add_argument("--block-size", type=int, help="override the KV block size")


def _cmd_fit(a, con: Console) -> int:
    from calibration.fit.command import cmd_fit  # noqa: PLC0415 - keeps `epdsim --help` fast

    return cmd_fit(a, con)


def _cmd_validate(a, con: Console) -> int:
    from calibration.pd import cli as pd_cli  # noqa: PLC0415 - keeps `epdsim --help` fast

    if pd_cli.is_pd_bundle(a.bundle):
        return pd_cli.cmd_validate(a, con)
    from calibration.validation.command import cmd_validate  # noqa: PLC0415 - keeps `epdsim --help` fast

    return cmd_validate(a, con)


def add_subparser(subparsers) -> argparse.ArgumentParser:
    """Hook for ``simulator/cli/commands.py``: ``add_subparser(sub)`` adds ``epdsim calibrate``."""
    p = subparsers.add_parser(
        "calibrate", help="measure a real vLLM server into a calibration bundle", description=__doc__.splitlines()[0]
    )
    configure(p)
    p.set_defaults(func=cmd_calibrate)
    return p


def cmd_calibrate(args, con: Console | None = None) -> int:
    """Entry point for ``args.func(args, con)``; handles its own errors (exit codes 2 and 3)."""
    from calibration.harness.server import ServerError  # noqa: PLC0415 - keeps `epdsim --help` fast

    con = con or stdout_console()  # the pipe's or the terminal's width (simulator/console.py)
    err = Console(stderr=True)
    try:
        if getattr(args, "hwdb", None):  # a user folder that replaces shipped hardware changes the answer
            print_notes(hwdb.load(args.hwdb).notes)
        return args.calibrate_func(args, con)
    except (BundleError, hwdb.HwdbError) as exc:
        return print_user_error(exc)
    except ServerError as exc:
        print_user_error(exc, "server error")
        return 3
    except KeyboardInterrupt:
        err.print("[red]interrupted[/]: the bundle keeps every completed request; continue with --resume")
        return 130


def _plan_options(a):
    from calibration.harness.probes import PlanOptions  # noqa: PLC0415 - keeps `epdsim --help` fast

    kinds = tuple(k.strip() for k in a.phases.split(",") if k.strip())
    bad = [k for k in kinds if k not in PHASE_KINDS]
    if bad:
        raise BundleError(f"--phases: unknown {', '.join(bad)} (choose from {', '.join(PHASE_KINDS)})")
    return PlanOptions(
        quick=a.quick,
        seed=a.seed,
        kinds=kinds,
        prefill_lengths=a.prefill_lengths,
        decode_rounds=a.decode_rounds,
        prefill_repeats=a.prefill_repeats,
        decode_concurrency=a.decode_concurrency,
        decode_prompt=a.decode_prompt,
        decode_output=a.decode_output,
        load_fractions=a.load_fractions,
        load_rates=a.load_rates,
        load_requests=a.load_requests,
        load_prompt=a.load_prompt,
        load_output=a.load_output,
        closed_concurrency=a.closed_concurrency,
        trace=a.trace,
        trace_format=a.trace_format,
        trace_limit=a.trace_limit,
    ).checked()


def cmd_run(a, con: Console) -> int:
    if a.pd:
        from calibration.pd import cli as pd_cli  # noqa: PLC0415 - keeps `epdsim --help` fast

        return pd_cli.cmd_run(a, con)
    check_not_pd_options(a)
    from calibration.harness.runner import CalibrationRun, RunOptions  # noqa: PLC0415 - keeps `epdsim --help` fast
    from calibration.harness.show import show_bundle  # noqa: PLC0415 - keeps `epdsim --help` fast

    try:
        env = parse_env(a.env)
    except argparse.ArgumentTypeError as exc:
        raise BundleError(str(exc)) from None
    out = Path(a.out)
    pin = None
    if a.pin:
        if a.attach:
            raise BundleError(
                f"--pin {a.pin}: an attached server's processes are not this harness's to move; launch "
                "it pinned yourself (docs/calibration.md, 'On a small host') or use --launch"
            )
        try:
            pin = parse_pin(a.pin)
        except ValueError as exc:
            raise BundleError(str(exc)) from None
    if a.trace and not a.resume:  # a bad file fails here, before a server is launched
        from calibration.harness.trace_plan import read  # noqa: PLC0415 - keeps `epdsim --help` fast

        read(a.trace, a.trace_format, a.trace_limit)
        kinds = {k.strip() for k in a.phases.split(",")}
        if "load" not in kinds:
            raise BundleError(f"--trace {a.trace}: the trace is the load test, but --phases {a.phases} has no load")
        if kinds & {"prefill", "decode"}:  # said before the launch: they take minutes before the trace starts
            sweeps = " and ".join(k for k in ("prefill", "decode") if k in kinds)
            Console(stderr=True).print(
                f"note: --phases {escape(a.phases)}: the {sweeps} sweeps run before the trace "
                f"(several minutes); --phases load replays the trace alone"
            )
    blocker = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:  # before any server is launched or attached
        raise BundleError(f"--out {out}: {blocker} is a file, not a folder; give a bundle folder path")
    opts = RunOptions(
        out=out,
        attach=a.attach,
        serve_cmd=shlex.split(a.serve_cmd) if a.serve_cmd else None,
        url=a.url,
        port=a.port,
        vllm_python=a.vllm_python,
        model_dir=a.model_dir,
        served_model_name=a.served_model_name,
        engine_args=a.engine_arg,
        env=env,
        enforce_eager=not a.no_enforce_eager,
        ready_timeout=a.ready_timeout,
        model=a.model,
        api_key=a.api_key,
        resume=a.resume,
        plan=_plan_options(a),
        server_hardware=a.server_hardware,
        server_log=a.server_log,
        argv=list(sys.argv),
        pin=pin,
    )
    with interruptible():  # Ctrl-C, kill -INT (even from a script) and SIGTERM stop the launched server
        b = CalibrationRun(opts).run()
    show_bundle(b, con)
    return 0


def cmd_show(a, con: Console) -> int:
    from calibration.pd import cli as pd_cli  # noqa: PLC0415 - keeps `epdsim --help` fast

    if pd_cli.is_pd_bundle(a.bundle):
        return pd_cli.cmd_show(a, con)
    from calibration.harness.show import bundle_summary, show_bundle  # noqa: PLC0415 - keeps `epdsim --help` fast

    b = Bundle.open(a.bundle, complete=True)
    try:
        summary = bundle_summary(b)
        if a.json:
            print(json.dumps(summary, indent=2, default=str))
        else:
            show_bundle(b, con)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # a hand-edited bundle: the manifest and records passed the shape checks but hold values of another kind
        raise BundleError(
            f"{b.path}: the bundle holds a value of an unexpected type or lacks a field "
            f"({type(exc).__name__}: {str(exc)[:160]}); restore the files the harness wrote"
        ) from None
    return 0


def build_parser() -> argparse.ArgumentParser:
    return configure(argparse.ArgumentParser(prog="epdsim calibrate", description=__doc__.splitlines()[0]))


def main(argv: list[str] | None = None) -> int:
    """``epdsim calibrate`` without the ``calibrate`` word: ``main(["run", "--out", ...])``."""
    args = build_parser().parse_args(argv)
    return cmd_calibrate(args)


if __name__ == "__main__":
    sys.exit(main())
