"""Command line: ``epdsim simulate | perf | hw | pd-crossover | calibrate | coldstart | probes | plan``.

Every user error (bad scenario, unknown GPU, model that does not fit,
malformed trace) is printed as one paragraph on stderr with exit code 2;
tracebacks are reserved for bugs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

import hwdb
from pydantic import ValidationError

from simulator.errors import print_user_error
from simulator.inputs import InputFileError, int_arg
from simulator.perf import FitError
from simulator.scenario import ScenarioError
from simulator.traces import TraceError
from simulator.workload import WorkloadError

DEFAULT_SCENARIO = Path(__file__).resolve().parent.parent / "examples" / "llama8b_h100_chat.yaml"
# OSError: a path the user gave cannot be read or written (a folder for a file, --out under a file, ...).
USER_ERRORS = (ScenarioError, hwdb.HwdbError, TraceError, WorkloadError, FitError, ValidationError,
               InputFileError, OSError)


def _fmt(x: float, unit: str = "") -> str:
    if x != x:
        return "-"
    if unit == "s":
        return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"
    return f"{x:,.2f}{unit}"


def _summary_table(res) -> Table:
    s, info = res.summary, res.info
    layout = " + ".join(f"{p['instances']}x {p['gpu']} TP{p['tp']}" + (f" PP{p['pp']}" if p["pp"] > 1 else "")
                        + ("" if p["role"] == "colocated" else f" {p['role']}") for p in info["pools"])
    t = Table(title=f"{res.scenario.name}: {info['model']} on {layout}")
    t.add_column("metric")
    for p in ("p50", "p90", "p99", "mean"):
        t.add_column(p, justify="right")
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"), ("e2e_s", "E2E"),
                       ("queue_s", "queue")):
        t.add_row(label, *(_fmt(s[key][p], "s") for p in ("p50", "p90", "p99", "mean")))
    return t


def _totals_table(res) -> Table:
    s = res.summary
    t = Table(show_header=False)
    rows = [
        ("requests completed / rejected / unfinished", f"{s['completed']} / {s['rejected']} / {s['unfinished']}"),
        ("throughput", f"{s['throughput_rps']:.2f} req/s, {s['output_tokens_per_s']:,.0f} output tok/s "
                       f"({s['output_tokens_per_s_per_gpu']:,.0f} per GPU)"),
        ("mean batch size / KV occupancy (max)", f"{s['mean_batch_size']:.1f} / {s['mean_kv_occupancy']:.1%} "
                                                 f"({s['max_kv_occupancy']:.1%})"),
        ("preemptions", str(s["preemptions"])),
        *([("TTFT breakdown (mean)", ", ".join(f"{k} {_fmt(v, 's')}" for k, v in s["ttft_breakdown_mean_s"].items()
                                                if v == v and v > 0))]
          if res.info.get("kv_transfer") or "encoder" in s else []),
        *([("encoder (" + s["encoder"]["topology"] + ")",
            f"{s['encoder']['images']} images, {s['encoder']['images_encoded']} encoded "
            f"(cache hit rate {s['encoder']['cache_hit_rate']:.1%}), utilisation {s['encoder']['utilisation']:.1%}")]
          if "encoder" in s else []),
        *([("KV moved", f"{s['kv_bytes_moved'] / 1e9:,.1f} GB over {res.info['kv_transfer']['link']} "
                        f"({res.info['kv_transfer']['connector']})")] if res.info.get("kv_transfer") else []),
        ("SLO attainment", f"{s['slo_attainment']:.1%}"),
        ("cost", f"${s['cost_usd_per_hour']:.2f}/h, ${s['cost_usd_per_million_output_tokens']:.3f} per M output tokens"),
        ("perf model", res.info["perf_model"]),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def cmd_simulate(args, con: Console) -> int:
    from simulator.run import simulate
    from simulator.scenario import load_scenario
    scn = load_scenario(args.scenario or DEFAULT_SCENARIO)
    over = {}
    if args.seed is not None:
        over["seed"] = args.seed
    if args.model:
        over["model"] = args.model
    if args.hwdb:
        over["hwdb"] = tuple(scn.hwdb) + tuple(args.hwdb)
    if over:
        scn = scn.model_copy(update=over)
    res = simulate(scn, replication=args.replication)
    con.print(_summary_table(res))
    con.print(_totals_table(res))
    if "operations" in res.summary:
        from simulator.cli_ops import operations_table
        con.print(operations_table(res))
    if args.out:
        paths = res.write(args.out, tuple(args.format))
        con.print(f"wrote {len(paths)} files to {args.out}")
    if args.report:
        from app.cli import write_simulation_report
        con.print(f"wrote report {write_simulation_report(res, args.report)}")
    return 0


def cmd_perf(args, con: Console) -> int:
    from simulator.perf import regime
    from simulator.scenario import PoolConfig, deployment_for
    from simulator.perf import build_step_model, plan_memory
    db = hwdb.load(args.hwdb)
    model = db.model(args.model)
    try:
        pool = PoolConfig(gpu=args.gpu, tp=args.tp, pp=args.pp, dtype=args.dtype)
    except ValidationError as exc:
        raise ScenarioError("epdsim perf: " + "; ".join(
            "".join(f"--{p}: " for p in e["loc"] if not str(p).startswith("function-after"))
            + e["msg"].removeprefix("Value error, ") + ("" if e["loc"] == () else f" (got {e['input']!r})")
            for e in exc.errors())) from None
    dep = deployment_for(pool, model, db)
    mem = plan_memory(dep)
    sm = build_step_model(dep)
    con.print(f"[bold]{model.name}[/] on {dep.gpus}x {dep.gpu.name} TP{dep.tp} PP{dep.pp} {dep.weight_dtype}: "
              f"weights {mem.weight_bytes / 1e9:.1f} GB/GPU, KV cache {mem.kv_tokens:,} tokens "
              f"({mem.kv_bytes_per_token / 1e3:.1f} kB/token/GPU); "
              + (f"calibrated by {dep.profile.name}" if dep.profile else "uncalibrated defaults"))
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
    from simulator.pd import crossover_bandwidth, fabric_verdicts
    from simulator.perf import build_step_model, plan_memory
    from simulator.scenario import PoolConfig, deployment_for
    from hwdb.schema import DTYPE_BYTES
    db = hwdb.load(args.hwdb)
    model = db.model(args.model)
    dep = deployment_for(PoolConfig(gpu=args.gpu, tp=args.tp, dtype=args.dtype), model, db)
    plan_memory(dep)
    if args.prompt > dep.knobs.max_model_len:
        raise ScenarioError(f"--prompt={args.prompt} exceeds {model.name}'s max_model_len "
                            f"({dep.knobs.max_model_len} tokens); no such request can be served: lower --prompt")
    kvpt = model.arch.kv_elems_per_token * DTYPE_BYTES[dep.kv_dtype]
    x = crossover_bandwidth(build_step_model(dep), kvpt, args.prompt, dep.knobs.max_num_batched_tokens)
    con.print(f"{model.name} on {dep.gpus}x {dep.gpu.name} TP{dep.tp}, {args.prompt}-token prompt: "
              f"KV {x['kv_bytes'] / 1e9:.2f} GB, prefill {_fmt(x['prefill_s'], 's')}. "
              f"[bold]Crossover bandwidth {x['crossover_Bps'] / 1e9:.2f} GB/s "
              f"({x['crossover_Bps'] * 8 / 1e9:.0f} Gb/s) per instance[/]: below it the KV transfer takes longer "
              f"than the prefill it replaces.", highlight=False)
    t = Table(title="fabrics")
    for c in ("fabric", "connector", "instance bandwidth", "transfer", "prefill", "verdict"):
        t.add_column(c)
    for r in fabric_verdicts(db, dep, x):
        t.add_row(r["fabric"], r["connector"], f"{r['instance_Bps'] * 8 / 1e9:,.0f} Gb/s",
                  _fmt(r["transfer_s"], "s"), _fmt(r["prefill_s"], "s"), r["verdict"])
    con.print(t)
    return 0


def cmd_hw(args, con: Console) -> int:
    from hwdb import listing
    db = hwdb.load(args.hwdb)
    if args.action == "list":
        kinds = [args.kind] if args.kind else ["gpus", "links", "models"]
        for kind in kinds:
            rows = {"gpus": listing.gpu_rows, "links": listing.link_rows, "models": listing.model_rows}[kind](db)
            t = Table(title=kind)
            for c in rows[0]:
                t.add_column(str(c))
            for r in rows:
                t.add_row(*(f"{v:,.3g}" if isinstance(v, float) else str(v) for v in r.values()))
            con.print(t)
        return 0
    if not args.name:
        raise ScenarioError("hw show needs a KIND and NAME, e.g. `epdsim hw show gpu H100`")
    info = listing.describe(db, args.kind.rstrip("s"), args.name)
    t = Table(title=f"{args.kind} {args.name}", show_header=False)
    for k, v in info.items():
        t.add_row(str(k), str(v))
    con.print(t)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epdsim", description="LLM serving capacity planner (discrete-event simulation)")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("simulate", help="run a scenario and print its summary")
    s.add_argument("scenario", nargs="?", help=f"scenario YAML (default: {DEFAULT_SCENARIO.name})")
    s.add_argument("--out", help="directory for requests/steps tables and summary.json")
    s.add_argument("--format", nargs="+", default=["parquet"], choices=["parquet", "csv", "json"])
    s.add_argument("--seed", type=int_arg(0, 2**63 - 1), help="override the scenario's seed")
    s.add_argument("--replication", type=int_arg(0, 2**31), default=0, help="independent replication index")
    s.add_argument("--model", help="override the scenario's model (name, alias, config.json or model folder)")
    s.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder (repeatable)")
    s.add_argument("--report", metavar="FILE.html", help="also write a self-contained HTML report with charts")
    s.set_defaults(func=cmd_simulate)
    q = sub.add_parser("perf", help="print a model's prefill and decode step times on a GPU")
    q.add_argument("model", help="model name, alias, or a local config.json / model folder")
    q.add_argument("--gpu", required=True)
    q.add_argument("--tp", type=int_arg(1, 64), default=1)
    q.add_argument("--pp", type=int_arg(1, 64), default=1)
    q.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8"])
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
    h.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder (repeatable)")
    h.set_defaults(func=cmd_hw)
    from calibration.cli import add_subparser as _add_calibrate
    _add_calibrate(sub)
    from calibration.e2e_report import add_subparser as _add_e2e
    _add_e2e(sub)
    from simulator.cli_ops import add_subparsers as _add_ops
    _add_ops(sub)
    from simulator.cli_plan import add_subparsers as _add_plan
    _add_plan(sub)
    from simulator.cli_regress import add_subparsers as _add_regress
    _add_regress(sub)
    from app.cli import add_subparsers as _add_app
    _add_app(sub)
    from simulator.cli_epd import add_subparsers as _add_epd
    _add_epd(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "kind", None) in ("gpu", "link", "model") and args.action == "list":
        args.kind += "s"
    try:
        return args.func(args, Console())
    except USER_ERRORS as exc:
        return print_user_error(exc)


if __name__ == "__main__":
    sys.exit(main())
