"""Command line: ``epdsim simulate | perf | hw | pd-crossover | calibrate | coldstart | probes | plan``.

Every user error (bad scenario, unknown GPU, model that does not fit,
malformed trace) is printed as one paragraph on stderr with exit code 2;
tracebacks are reserved for bugs.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from importlib.metadata import PackageNotFoundError, version

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

import hwdb
from app.cli import add_subparsers as _add_app
from calibration.cli import add_subparser as _add_calibrate
from calibration.e2e.report import add_subparser as _add_e2e
from hwdb import listing
from hwdb.schema import DTYPE_BYTES
from simulator import fmt
from simulator.cli.epd import add_subparsers as _add_epd
from simulator.cli.ops import add_subparsers as _add_ops
from simulator.cli.plan import add_subparsers as _add_plan
from simulator.cli.regress import add_subparsers as _add_regress
from simulator.cli.simulate import add_subparser as _add_simulate
from simulator.cli.sweep import add_subparsers as _add_sweep
from simulator.console import print_notes, stdout_console, wide_tables
from simulator.errors import WorkloadError, print_user_error
from simulator.inputs import InputFileError, int_arg
from simulator.pd.pd import crossover_bandwidth, fabric_verdicts
from simulator.perf import FitError, plan_memory
from simulator.scenario import EngineConfig, PoolConfig, ScenarioError, deployment_for
from simulator.step_build import build_step_model
from simulator.stepmodel import regime
from simulator.traces import TraceError

USER_ERRORS = (
    ScenarioError,
    hwdb.HwdbError,
    TraceError,
    WorkloadError,
    FitError,
    ValidationError,
    InputFileError,
    OSError,
)


def _fmt(x: float, unit: str = "") -> str:
    if unit == "s":
        return fmt.duration(x)
    return fmt.number(x) + unit


def cmd_perf(args, con: Console) -> int:
    db = hwdb.load(args.hwdb)
    print_notes(db.notes)
    model = db.model(args.model)
    try:
        pool = PoolConfig(
            gpu=args.gpu,
            tp=args.tp,
            pp=args.pp,
            dtype=args.dtype,
            engine=EngineConfig(engine=getattr(args, "engine", "vllm-v1")),
        )
    except ValidationError as exc:
        raise ScenarioError(
            "epdsim perf: "
            + "; ".join(
                "".join(f"--{p}: " for p in e["loc"] if not str(p).startswith("function-after"))
                + e["msg"].removeprefix("Value error, ")
                + ("" if e["loc"] == () else f" (got {e['input']!r})")
                for e in exc.errors()
            )
        ) from None
    dep = deployment_for(pool, model, db)
    mem = plan_memory(dep)
    sm = build_step_model(dep)
    con.print(
        f"[bold]{model.name}[/] on {dep.gpus}x {dep.gpu.name} TP{dep.tp} PP{dep.pp} {dep.weight_dtype}: "
        f"weights {mem.weight_bytes / 1e9:.1f} GB/GPU, KV cache {mem.kv_tokens:,} tokens "
        f"({mem.kv_bytes_per_token / 1e3:.1f} kB/token/GPU); "
        + (f"calibrated by {dep.profile.name}" if dep.profile else "uncalibrated defaults")
    )
    con.print(
        f"memory: {mem.rule}; activations {mem.activation_bytes / 2**30:.2f} GiB, runtime "
        f"{mem.runtime_bytes / 2**30:.2f} GiB, KV {mem.kv_bytes / 2**30:.2f} GiB"
        + (
            f"; linear-attention state {mem.state_bytes / 2**30:.2f} GiB ({mem.state_slots:,} sequences)"
            if mem.state_slots
            else ""
        )
        + (f"; up to {mem.max_running:,} running requests" if mem.max_running else ""),
        markup=False,
    )
    kernels = [
        f"{what}: {src or missing}"
        for what, src, missing, used in (
            ("routed experts", dep.moe_source, "roofline of the GEMM curves (no measured table)", dep.arch.is_moe),
            (
                "MLA attention",
                dep.mla_source,
                "attention curves of the profile or GPU (not measured apart)",
                dep.arch.is_mla,
            ),
            ("linear attention", dep.gdn_source, "not modelled (no measured table)", dep.arch.num_linear_layers),
        )
        if used
    ]
    if kernels:
        con.print("measured kernels: " + "; ".join(kernels), markup=False)
    t = Table(title="prefill (one request alone, chunked by max_num_batched_tokens)")
    for c in ("prompt tokens", "time", "tokens/s", "regime"):
        t.add_column(c, justify="right")
    for p in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768):
        if p > dep.knobs.max_num_batched_tokens * 4:
            break
        tt = sm.prefill_time(p, dep.knobs.max_num_batched_tokens)
        t.add_row(str(p), _fmt(tt, "s"), f"{p / tt:,.0f}", regime(sm, p, 1, p * (p + 1) / 2, 0))
    con.print(t)
    t = Table(title="decode step")
    for c in ("batch", "context", "time", "tokens/s", "regime"):
        t.add_column(c, justify="right")
    for ctx in (1024, 8192):
        for b in (1, 8, 32, 64, 128, 256, 512):
            if b * ctx > mem.kv_tokens:
                continue
            tt = sm.decode_time(b, ctx)
            t.add_row(str(b), str(ctx), _fmt(tt, "s"), f"{b / tt:,.0f}", regime(sm, b, b, 0.0, b * ctx))
    con.print(t)
    return 0


def cmd_crossover(args, con: Console) -> int:
    db = hwdb.load(args.hwdb)
    print_notes(db.notes)
    model = db.model(args.model)
    dep = deployment_for(PoolConfig(gpu=args.gpu, tp=args.tp, dtype=args.dtype), model, db)
    plan_memory(dep)
    if args.prompt > dep.knobs.max_model_len:
        raise ScenarioError(
            f"--prompt={args.prompt} exceeds {model.name}'s max_model_len "
            f"({dep.knobs.max_model_len} tokens); no such request can be served: lower --prompt"
        )
    kvpt = model.arch.kv_elems_per_token * DTYPE_BYTES[dep.kv_dtype]
    x = crossover_bandwidth(build_step_model(dep), kvpt, args.prompt, dep.knobs.max_num_batched_tokens)
    con.print(
        f"{model.name} on {dep.gpus}x {dep.gpu.name} TP{dep.tp}, {args.prompt}-token prompt: "
        f"KV {x['kv_bytes'] / 1e9:.2f} GB, prefill {_fmt(x['prefill_s'], 's')}. "
        f"[bold]Crossover bandwidth {x['crossover_Bps'] / 1e9:.2f} GB/s "
        f"({x['crossover_Bps'] * 8 / 1e9:.0f} Gb/s) per instance[/]: below it the KV transfer takes longer "
        f"than the prefill it replaces.",
        highlight=False,
    )
    t = Table(title="fabrics")
    for c in ("fabric", "connector", "instance bandwidth", "transfer", "prefill", "verdict"):
        t.add_column(c)
    for r in fabric_verdicts(db, dep, x):
        t.add_row(
            r["fabric"],
            r["connector"],
            f"{r['instance_Bps'] * 8 / 1e9:,.0f} Gb/s",
            _fmt(r["transfer_s"], "s"),
            _fmt(r["prefill_s"], "s"),
            r["verdict"],
        )
    con.print(t)
    return 0


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return "-" if v is None else f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)


def hw_tables(kind: str, rows: list[dict], width: int) -> list[Table]:
    """A ``hw list`` table: full names and figures, split into column groups that fit ``width``."""
    if not rows:
        return [Table(title=f"{kind}: none")]
    headers = [str(c) for c in rows[0]]
    cells = [[_cell(v) for v in r.values()] for r in rows]
    right = {
        h: "right"
        for h, v in zip(headers, rows[0].values(), strict=True)
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    return wide_tables(kind, headers, cells, width, right)


def hw_text(records: list[dict] | dict[str, list[dict]], form: str) -> str:
    """``hw list`` records (SI units, :mod:`hwdb.listing`) as ``json`` (a list of objects; for every kind at
    once, an object of such lists by kind) or ``csv`` (one kind: a header row, then one row per item; an
    absent figure is an empty cell)."""
    if form == "json":
        return json.dumps(records, indent=2) + "\n"
    if not isinstance(records, list):
        raise ValueError("hw_text: CSV holds one kind's records (a list), not a mapping of kinds")
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(records[0]) if records else ["name"], lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    return out.getvalue()


def cmd_hw(args, con: Console) -> int:
    db = hwdb.load(args.hwdb)
    print_notes(db.notes)
    if args.action == "list":
        kinds = [args.kind] if args.kind else ["gpus", "links", "models"]
        if args.format == "table":
            for kind in kinds:
                rows = {"gpus": listing.gpu_rows, "links": listing.link_rows, "models": listing.model_rows}[kind](db)
                for t in hw_tables(kind, rows, con.width):
                    con.print(t)
            return 0
        if args.format == "csv" and not args.kind:
            raise ScenarioError(
                "epdsim hw list --format csv: a CSV file holds one table; name the kind, e.g. "
                "`epdsim hw list gpus --format csv` (gpus, links or models), or use --format json"
            )
        records = {
            kind: {"gpus": listing.gpu_records, "links": listing.link_records, "models": listing.model_records}[kind](
                db
            )
            for kind in kinds
        }
        sys.stdout.write(hw_text(records[args.kind] if args.kind else records, args.format))
        return 0
    if not args.name:
        raise ScenarioError("hw show needs a KIND and NAME, e.g. `epdsim hw show gpu H100`")
    info = listing.describe(db, args.kind.rstrip("s"), args.name)
    if args.format == "csv":
        raise ScenarioError(
            f"epdsim hw show --format csv: one {args.kind.rstrip('s')}'s details are nested, not a "
            f"table; use --format json, or `epdsim hw list {args.kind.rstrip('s')}s --format csv`"
        )
    if args.format == "json":
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
        return 0
    t = Table(title=f"{args.kind} {args.name}", show_header=False)
    t.add_column(no_wrap=True)
    t.add_column(overflow="fold")  # wraps at spaces; a path longer than the column folds, never cut
    for k, v in info.items():
        t.add_row(str(k), str(v))
    con.print(t)
    return 0


def _version() -> str:
    try:
        return version("epdsim")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epdsim", description="LLM serving capacity planner (discrete-event simulation)")
    sub = p.add_subparsers(dest="cmd", required=True)
    p.add_argument("--version", action="version", version=f"epdsim {_version()}")
    _add_simulate(sub)
    q = sub.add_parser("perf", help="print a model's prefill and decode step times on a GPU")
    q.add_argument("model", help="model name, alias, or a local config.json / model folder")
    q.add_argument("--gpu", required=True)
    q.add_argument("--tp", type=int_arg(1, 64), default=1)
    q.add_argument("--pp", type=int_arg(1, 64), default=1)
    q.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8", "fp4", "int4"])
    q.add_argument("--engine", default="vllm-v1", help="engine profile (vllm-v1, sglang, trtllm, vllm-v0)")
    q.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder (repeatable)")
    q.set_defaults(func=cmd_perf)
    x = sub.add_parser("pd-crossover", help="bandwidth below which PD's KV transfer costs more than the prefill")
    x.add_argument("model")
    x.add_argument("--gpu", required=True)
    x.add_argument("--tp", type=int_arg(1, 64), default=1)
    x.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8"])
    x.add_argument("--prompt", type=int_arg(1, 10_000_000), default=4000, help="prompt length in tokens")
    x.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder (repeatable)")
    x.set_defaults(func=cmd_crossover)
    h = sub.add_parser("hw", help="list or show GPUs, links and models")
    h.add_argument("action", choices=["list", "show"])
    h.add_argument("kind", nargs="?", choices=["gpus", "links", "models", "gpu", "link", "model"])
    h.add_argument("name", nargs="?")
    h.add_argument(
        "--format",
        choices=["table", "json", "csv"],
        default="table",
        help="table (display units; the default), or json / csv: the same columns as full figures in "
        "SI units, each key naming its unit (memory_bytes, memory_bandwidth_Bps in bytes/s, "
        "bf16_FLOPS in FLOP/s, latency_s)",
    )
    h.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder (repeatable)")
    h.set_defaults(func=cmd_hw)
    _add_calibrate(sub)
    _add_e2e(sub)
    _add_ops(sub)
    _add_plan(sub)
    _add_sweep(sub)
    _add_regress(sub)
    _add_app(sub)
    _add_epd(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "kind", None) in ("gpu", "link", "model") and args.action == "list":
        args.kind += "s"
    try:
        return args.func(args, stdout_console())
    except USER_ERRORS as exc:
        return print_user_error(exc)


if __name__ == "__main__":
    sys.exit(main())
