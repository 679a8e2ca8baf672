"""``epdsim calibrate``: measure a real vLLM server into a bundle, and show a bundle.

    epdsim calibrate run --out BUNDLE [--attach URL | --launch] [--resume] [--quick] ...
    epdsim calibrate run --pd --out BUNDLE [--connector example|nixl] ... (a prefill/decode pair: calibration/pd/cli.py)
    epdsim calibrate show BUNDLE
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
import math
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

import hwdb
from calibration.harness.affinity import cpu_list, parse_pin
from calibration.harness.bundle import Bundle, BundleError
from calibration.harness.env import server_cores
from calibration.harness.interrupt import interruptible
from calibration.harness.trace_gen import add_make_trace_parser
from calibration.pd.options import add_pd_options, check_not_pd_options
from simulator.console import print_notes, stdout_console, wide_tables
from simulator.errors import print_user_error
from simulator.inputs import float_arg

# The probe, client and server modules (httpx) are imported when a command runs, so that
# building the ``epdsim`` parser stays cheap.
PHASE_KINDS = ("prefill", "decode", "load")  # == calibration.harness.probes.PHASE_KINDS


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _range(s: str) -> tuple[int, int]:
    lo, _, hi = s.partition(":")
    return int(lo), int(hi or lo)


def _env(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--env wants KEY=VALUE, got {it!r}")
        out[k] = v
    return out


def configure(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``run`` and ``show`` actions to a ``calibrate`` parser."""
    sub = p.add_subparsers(dest="calibrate_cmd", required=True)
    r = sub.add_parser(
        "run",
        help="measure a vLLM server (launched here or attached) into a bundle",
        description="Run the probe phases (prefill sweep, decode sweep, load tests) against a real "
        "vLLM server and append every measurement to a bundle directory.",
    )
    r.add_argument("--out", required=True, help="bundle directory")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--attach", metavar="URL", help="use a running server (e.g. http://vllm:8000); launch nothing")
    g.add_argument(
        "--launch",
        action="store_true",
        help="start the server here (default): the tiny test model with --vllm-python, or --serve-cmd",
    )
    r.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted bundle: skip completed phases and completed requests",
    )
    r.add_argument("--quick", action="store_true", help="a short plan (a few minutes on 2 CPU cores)")
    srv = r.add_argument_group("launch")
    srv.add_argument(
        "--serve-cmd",
        help="full server command, e.g. 'vllm serve meta-llama/Llama-3.1-8B-Instruct "
        "--port 8000 --enable-per-request-metrics' (then give --url)",
    )
    srv.add_argument("--url", help="where the --serve-cmd server listens (default http://127.0.0.1:PORT)")
    srv.add_argument("--port", type=int, help="port (default launch: a free port; --serve-cmd: 8000)")
    srv.add_argument(
        "--vllm-python",
        help="Python with vLLM for the default launch (default: $EPDSIM_VLLM_PYTHON, else .venv-vllm/bin/python)",
    )
    srv.add_argument(
        "--model-dir",
        help="model folder for the default launch (default: BUNDLE/model, a tiny "
        "random-weight Llama made on first use)",
    )
    srv.add_argument("--served-model-name", help="default launch: name to serve the model under")
    srv.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for the default launch command (repeatable, e.g. --engine-arg=--max-num-seqs=64)",
    )
    srv.add_argument("--no-enforce-eager", action="store_true", help="default launch without --enforce-eager")
    srv.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="server environment (repeatable)")
    srv.add_argument(
        "--pin",
        metavar="ENGINE:FRONT",
        help="small hosts: the engine core and worker on the ENGINE "
        "CPUs, the API server and this harness on the FRONT CPUs, e.g. 0:1 (docs/calibration.md)",
    )
    srv.add_argument(
        "--ready-timeout",
        type=float_arg(0, 7 * 86400, lo_open=True),
        default=900.0,
        help="seconds to wait for readiness (900)",
    )
    att = r.add_argument_group("attach")
    att.add_argument("--model", help="model id to measure (default: the first of /v1/models)")
    att.add_argument("--api-key", help="bearer token for the server")
    att.add_argument("--server-hardware", help="attach mode: a note on the server's hardware for the manifest")
    att.add_argument(
        "--server-log",
        help="attach mode: the server's saved log (e.g. `kubectl logs POD > f`) to "
        "read start-up phases from (the log's own 1-s clock)",
    )
    pl = r.add_argument_group("plan")
    pl.add_argument("--phases", default=",".join(PHASE_KINDS), help="phase kinds to run (prefill,decode,load)")
    pl.add_argument("--seed", type=int, default=0)
    pl.add_argument("--prefill-lengths", type=_ints, help="comma list of prompt lengths")
    pl.add_argument("--prefill-repeats", type=int)
    pl.add_argument("--decode-concurrency", type=_ints, help="comma list of concurrency levels")
    pl.add_argument(
        "--decode-prompt",
        type=_ints,
        help="comma list of decode prompt lengths: a decode sweep at "
        "each (two or more let the fit see the KV stream's cost)",
    )
    pl.add_argument("--decode-output", type=int)
    pl.add_argument("--decode-rounds", type=int, default=2, help="requests per user at each decode level (2)")
    pl.add_argument("--load-fractions", type=_floats, help="Poisson rates as fractions of the decode capacity")
    pl.add_argument("--load-rates", type=_floats, help="absolute Poisson rates (req/s); replace the fractions")
    pl.add_argument("--load-requests", type=int)
    pl.add_argument("--load-prompt", type=_range, help="LO:HI prompt lengths of load requests")
    pl.add_argument("--load-output", type=_range, help="LO:HI output lengths of load requests")
    pl.add_argument("--closed-concurrency", type=_ints, help="closed-loop load levels (comma list)")
    pl.add_argument(
        "--trace",
        metavar="FILE",
        help="replay a trace file as the load test (arrivals and lengths as "
        "recorded; the formats `epdsim simulate` reads) instead of the "
        "Poisson and closed-loop loads",
    )
    pl.add_argument("--trace-format", default="auto", help="azure, mooncake, plain or auto (default)")
    pl.add_argument("--trace-limit", type=int, help="replay only the first N requests of the trace")
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

    try:
        env = _env(a.env)
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
    _show(b, con)
    return 0


def _fmt_s(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def bundle_summary(b: Bundle) -> dict:
    from calibration.harness.probes import summarize_phase  # noqa: PLC0415 - keeps `epdsim --help` fast

    m = b.manifest
    launches = [
        {
            "index": ln.get("index"),
            "ready_s": ln.get("ready_s"),
            "exit_code": ln.get("exit_code"),
            "startup": ln.get("startup", {}).get("summary", {}),
            "pin": ln.get("pin"),
        }
        for ln in m.get("launches", [])
    ]
    launches += [
        {
            "index": f"attached {a.get('url')}",
            "ready_s": a["startup"]["summary"].get("api_ready_t"),
            "exit_code": None,
            "startup": a["startup"]["summary"],
        }
        for a in m.get("attachments", [])
        if a.get("startup")
    ]
    return {
        "path": str(b.path),
        "model": m["model"].get("served_name"),
        "mode": m.get("mode"),
        "vllm": m.get("versions", {}).get("vllm"),
        "created": m.get("created"),
        "runs": [
            {k: r.get(k) for k in ("started", "finished", "status", "resume", "conditions", "interrupted_by")}
            for r in m.get("runs", [])
        ],
        "host": _host(m),
        "launches": launches,
        "phases": [summarize_phase(b, p) for p in b.phases()],
    }


def _host(m: dict) -> dict | None:
    """The server host as recorded (launch mode): CPU, ISA features, cores."""
    hw = (m.get("hardware") or {}).get("server")
    if not isinstance(hw, dict):
        return {"note": hw} if hw else None
    cpu = hw.get("cpu") or {}
    cores, basis = server_cores(m)
    return {
        "cpu": cpu.get("model_name") or hw.get("cpu_model"),
        "vendor": cpu.get("vendor"),
        "family": cpu.get("family"),
        "isa": cpu.get("isa"),
        "cores": cores,
        "cores_basis": basis,
        "host_cpus": hw.get("cpu_count"),
    }


def _load_text(runs: list[dict]) -> str:
    parts = []
    for i, r in enumerate(runs):
        c = r.get("conditions") or {}
        la = [(c.get(k) or {}).get("loadavg") for k in ("before", "after")]
        if any(la):
            parts.append(f"run {i} " + " / ".join(f"{x[0]:.2f}" if x else "-" for x in la))
    return ("1-min load before / after: " + ", ".join(parts)) if parts else ""


def _show(b: Bundle, con: Console) -> None:
    s = bundle_summary(b)
    con.print(
        f"[bold]{escape(s['path'])}[/]: model {escape(str(s['model']))}, vLLM {s['vllm']}, {s['mode']} mode, "
        f"{len(s['runs'])} run(s), last status {s['runs'][-1]['status'] if s['runs'] else '-'}"
    )
    h = s.get("host") or {}
    if h.get("cpu") or h.get("note"):
        isa = f"; {', '.join(h['isa'])}" if h.get("isa") else "; ISA not recorded"
        cores = (
            f"{h.get('cores')} cores ({h.get('cores_basis')}; the host has {h.get('host_cpus')})"
            if h.get("host_cpus") and h.get("cores")
            else f"{h.get('cores')} cores"
        )
        con.print(
            f"server host: {escape(str(h.get('cpu') or h.get('note')))}"
            + (f" ({h.get('vendor')} family {h.get('family')}{isa}), {escape(cores)}" if h.get("cpu") else "")
        )
    if _load_text(s["runs"]):
        con.print(_load_text(s["runs"]))
    for ln in s["launches"]:
        st = ln["startup"]
        parts = [f"ready {ln['ready_s']:.1f} s" if ln.get("ready_s") is not None else "not ready"]
        for k, label in (
            ("weights_load_s", "weights"),
            ("torch_compile_s", "torch.compile"),
            ("cuda_graph_capture_s", "CUDA graphs"),
            ("engine_init_s", "engine init"),
        ):
            if k in st:
                parts.append(f"{label} {st[k]:.2f} s")
        if "kv_cache_tokens" in st:
            parts.append(f"KV cache {st['kv_cache_tokens']:,} tokens")
        if ln.get("pin"):
            parts.append(
                f"pinned: engine on CPU {cpu_list(ln['pin']['engine_cpus'])}, front end on CPU "
                f"{cpu_list(ln['pin']['front_cpus'])}"
            )
        con.print(
            f"launch {ln['index']}: "
            + ", ".join(parts)
            + (f", exit code {ln['exit_code']}" if ln.get("exit_code") is not None else "")
        )
    heads = ["phase", "done", "ok", "fail", "TTFT p50", "TTFT p90", "srv TTFT", "ITL p50", "ITL p90", "tok/s"]
    rows = []
    for p in s["phases"]:
        tput = p.get("throughput_tok_s")
        rows.append(
            [
                p["phase"],
                "yes" if p["done"] else "no",
                f"{p['ok']}/{p['planned']}",
                str(p["failed"]),
                _fmt_s(p.get("ttft_p50")),
                _fmt_s(p.get("ttft_p90")),
                _fmt_s(p.get("server_ttft_p50")),
                _fmt_s(p.get("itl_p50")),
                _fmt_s(p.get("itl_p90")),
                f"{tput:,.0f}" if tput is not None and tput == tput else "-",
            ]
        )
    # never cut a phase name or a figure: split into column groups on a narrow terminal
    for t in wide_tables(
        "phases (client-side times; server TTFT from per-request metrics)",
        heads,
        rows,
        con.width,
        justify=dict.fromkeys(heads[1:], "right"),
    ):
        con.print(t)


def cmd_show(a, con: Console) -> int:
    from calibration.pd import cli as pd_cli  # noqa: PLC0415 - keeps `epdsim --help` fast

    if pd_cli.is_pd_bundle(a.bundle):
        return pd_cli.cmd_show(a, con)
    b = Bundle.open(a.bundle, complete=True)
    try:
        summary = bundle_summary(b)
        if a.json:
            print(json.dumps(summary, indent=2, default=str))
        else:
            _show(b, con)
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
