"""Operations commands: ``epdsim coldstart`` and ``epdsim probes``.

Hooked into ``simulator/cli/commands.py`` by ``add_subparsers(sub)``.  Each command
handles its own user errors (bad model, GPU, storage, probe field): one
paragraph on stderr and exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import textwrap
from typing import TYPE_CHECKING

from pydantic import ValidationError
from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.table import Table

import hwdb
from hwdb.coldstart import load_coldstart
from simulator.console import print_notes
from simulator.errors import print_user_error
from simulator.inputs import float_arg, int_arg
from simulator.ops.coldstart import PHASE_LABELS, PHASES, Breakdown, breakdown
from simulator.ops.coldstart_formulas import ColdStartError
from simulator.ops.k8s import recommend_probes, simulate_pod
from simulator.ops.probe_spec import PodSpec, Probe, ProbeError
from simulator.perf import FitError, plan_memory
from simulator.scenario import PoolConfig, ScenarioError, deployment_for

if TYPE_CHECKING:
    from simulator.engine.results import Results

OPS_ERRORS = (ColdStartError, ProbeError, hwdb.HwdbError, ScenarioError, FitError, ValidationError)


def _deployment(args):
    db = hwdb.load(args.hwdb)
    print_notes(db.notes)
    model = db.model(args.model)
    engine = {"enforce_eager": True} if getattr(args, "enforce_eager", False) else {}
    try:
        pool = PoolConfig(gpu=args.gpu, tp=args.tp, pp=args.pp, dtype=args.dtype, engine=engine)
    except ValidationError as exc:
        raise ScenarioError(
            f"epdsim {args.cmd}: "
            + "; ".join(
                "".join(f"--{p}: " for p in e["loc"] if not str(p).startswith("function-after"))
                + e["msg"].removeprefix("Value error, ")
                + ("" if e["loc"] == () else f" (got {e['input']!r})")
                for e in exc.errors()
            )
        ) from None
    dep = deployment_for(pool, model, db)
    plan_memory(dep)  # a start-up of a deployment that cannot fit is meaningless
    return dep


def _kw(args) -> dict:
    return dict(
        storage=args.storage,
        image_cached=args.image_cached,
        compile_sizes=args.compile_sizes,
        compile_multiplier=args.compile_multiplier,
        engine=args.startup_set,
        db=load_coldstart(args.hwdb),
        vllm_version=args.vllm_version,
    )


def _breakdowns(args, dep, level: str = "typical") -> tuple[Breakdown, Breakdown]:
    kw = _kw(args)
    return breakdown(dep, args.compile_cache, level=level, **kw), breakdown(dep, "hit", level=level, **kw)


def _fmt_s(x: float) -> str:
    return f"{x:,.1f} s" + (f" ({x / 60:.1f} min)" if x >= 90 else "")


def _phase_table(bd: Breakdown, low: Breakdown | None = None, high: Breakdown | None = None) -> Table:
    t = Table(title=bd.description)
    cols: list[tuple[str, JustifyMethod]] = [("phase", "left"), ("seconds", "right")]
    if low is not None and high is not None:
        cols += [("low", "right"), ("high", "right")]
    cols += [("share", "right"), ("how", "left")]
    for c, j in cols:
        t.add_column(c, justify=j)
    total = bd.total_s
    present = {p.name for b in (bd, low, high) if b is not None for p in b.phases}
    names = [n for n in PHASES if n in present]  # e.g. the P2P check only the high end runs
    for name in names:
        p = next((q for q in bd.phases if q.name == name), None)
        sec = p.seconds if p else 0.0
        row = [PHASE_LABELS.get(name, name), f"{sec:,.1f}"]
        if low is not None and high is not None:
            row += [f"{low.seconds(name):,.1f}", f"{high.seconds(name):,.1f}"]
        row += [f"{sec / total:.0%}", escape(p.detail if p else "")]
        t.add_row(*row)
    last = ["[bold]total[/]", f"[bold]{total:,.1f}[/]"]
    if low is not None and high is not None:
        last += [f"{low.total_s:,.1f}", f"{high.total_s:,.1f}"]
    t.add_row(*last, "100%", f"container start -> API answers: {bd.container_s:,.1f} s")
    return t


def cmd_coldstart(args, con: Console) -> int:
    dep = _deployment(args)
    bd, warm = _breakdowns(args, dep)
    low, _ = _breakdowns(args, dep, "low")
    high, _ = _breakdowns(args, dep, "high")
    con.print(_phase_table(bd, low, high))
    pulled = f"; probes see {_fmt_s(bd.container_s)} from container start" if not bd.image_cached else ""
    con.print(
        f"total {_fmt_s(bd.total_s)}{pulled}; sourced range {_fmt_s(low.total_s)} to {_fmt_s(high.total_s)} "
        f"(low / high: hwdb/data/coldstart/vllm-scale.yaml; probes are sized on the high end).",
        highlight=False,
    )
    if bd.compile_cache == "miss" and not dep.knobs.enforce_eager:
        con.print(
            f"with a warm compile cache (on a volume): {_fmt_s(warm.total_s)}, "
            f"{bd.total_s - warm.total_s:,.1f} s less.",
            highlight=False,
        )
    for note in bd.extrapolated:
        con.print(f"[yellow]extrapolated:[/] {escape(note)}", highlight=False)
    return 0


def _probe_from(prefix: str, args) -> Probe | None:
    if getattr(args, f"no_{prefix}"):
        return None
    return Probe(
        getattr(args, f"{prefix}_initial_delay"),
        getattr(args, f"{prefix}_period"),
        getattr(args, f"{prefix}_timeout"),
        getattr(args, f"{prefix}_failure_threshold"),
        name=f"{prefix}Probe",
    )


def _startup_from(spec: str | None) -> Probe | str | None:
    """None, the string 'recommended', or an explicit startupProbe."""
    if spec is None or spec == "none":
        return None
    if spec == "recommended":
        return spec
    parts = spec.split(",")
    try:
        vals = [int(x) for x in parts]
    except ValueError:
        vals = []
    if len(vals) != 4:
        raise ProbeError(
            f"--startup-probe={spec!r} is not understood: give 'recommended' or four whole numbers "
            f"initialDelaySeconds,periodSeconds,timeoutSeconds,failureThreshold (e.g. 0,10,5,30)"
        )
    delay, period, timeout, threshold = vals
    return Probe(delay, period, timeout, threshold, name="startupProbe")


def cmd_probes(args, con: Console) -> int:
    # probe settings first: a typo should not wait for the hardware database
    startup = _startup_from(args.startup_probe)
    liveness, readiness = _probe_from("liveness", args), _probe_from("readiness", args)
    if not args.horizon > 0:
        raise ProbeError(f"--horizon={args.horizon} must be > 0 seconds")
    dep = _deployment(args)
    bd, warm = _breakdowns(args, dep)
    rec = recommend_probes(breakdown(dep, "miss", level="high", **_kw(args)), margin=args.margin)
    spec = PodSpec(
        startup=rec.startup if isinstance(startup, str) else startup,
        liveness=liveness,
        readiness=readiness,
        compile_cache_volume=args.compile_cache_volume,
    )
    res = simulate_pod(bd, spec, warm, horizon_s=args.horizon)
    pulled = f", {_fmt_s(bd.container_s)} of it from container start" if not bd.image_cached else ""
    con.print(f"{escape(bd.description)}: start needs {_fmt_s(bd.total_s)}{pulled}.", highlight=False)
    probes = (
        ", ".join(
            f"{p.name} delay {p.initial_delay_s} s, period {p.period_s} s, timeout {p.timeout_s} s, "
            f"failureThreshold {p.failure_threshold}"
            for p in (spec.startup, spec.liveness, spec.readiness)
            if p is not None
        )
        or "no probes"
    )
    con.print(
        f"probes: {probes}; compile cache volume: {'yes' if spec.compile_cache_volume else 'no'}", highlight=False
    )
    if res.never_ready:
        con.print(f"[bold red]never ready[/] within {args.horizon:.0f} s: {escape(res.reason or '')}", highlight=False)
    else:
        con.print(f"[bold green]{escape(res.summary())}[/]", highlight=False)
    for w in res.warnings:
        con.print(f"[yellow]warning:[/] {escape(w)}", highlight=False)
    t = Table(title="container attempts")
    for c in ("#", "started", "compile cache", "ended", "outcome"):
        t.add_column(c, justify="right" if c in ("#", "started", "ended") else "left")
    for a in res.attempts[:12]:
        end = "-" if a.ended_s is None else f"{a.ended_s:,.0f} s"
        if a.outcome == "killed":
            assert a.ended_s is not None, "a killed attempt has ended"
            what = f"killed by {a.killed_by} probe in phase '{a.phase}' after {a.ended_s - a.started_s:,.0f} s"
        else:
            what = a.outcome if a.outcome != "running" else f"running ({a.phase})"
        t.add_row(str(a.index), f"{a.started_s:,.0f} s", a.compile_cache, end, what)
    if len(res.attempts) > 12:
        t.add_row("...", "", "", "", f"{len(res.attempts) - 12} more attempts")
    con.print(t)
    con.print(
        f"recommended probes (safety margin {args.margin:.0%} over the high end of the cold-cache start):",
        highlight=False,
    )
    con.out(yaml_within(rec.yaml.rstrip("\n"), con.width), highlight=False)
    return 0


def yaml_within(text: str, width: int) -> str:
    """A YAML snippet with its comment lines wrapped at spaces to ``width`` characters, each piece a
    comment again; the keys and values are not wrapped (the snippet must stay valid YAML to paste)."""
    out = []
    for line in text.splitlines():
        body = line.lstrip()
        if not body.startswith("#") or len(line) <= width:
            out.append(line)
            continue
        lead = line[: len(line) - len(body)] + "# "
        out += textwrap.wrap(
            body.removeprefix("#").strip(),
            width,
            initial_indent=lead,
            subsequent_indent=lead,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return "\n".join(out)


def _run(func):
    def wrapped(args, con: Console | None = None) -> int:
        con = con or Console()
        try:
            return func(args, con)
        except OPS_ERRORS as exc:
            return print_user_error(exc)

    return wrapped


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model name, alias, or a local config.json / model folder")
    p.add_argument("--gpu", required=True)
    p.add_argument("--tp", type=int_arg(1, 64), default=1)
    p.add_argument("--pp", type=int_arg(1, 64), default=1)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8"])
    p.add_argument(
        "--compile-cache",
        default="miss",
        choices=["miss", "hit"],
        help="vLLM's torch.compile cache: miss (first start) or hit (on disk)",
    )
    p.add_argument(
        "--storage",
        default="nvme",
        help="where weights come from: nvme, nfs, s3, page_cache (or a storage file in a user hwdb's coldstart/)",
    )
    p.add_argument(
        "--image-cached",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the serving image is already on the node (default) or must be pulled",
    )
    p.add_argument(
        "--compile-sizes", type=int_arg(0, 1024), default=0, help="static sizes in compilation_config.compile_sizes"
    )
    p.add_argument(
        "--compile-multiplier",
        type=float_arg(0, 100, lo_open=True),
        default=1.0,
        help="what-if factor on the Inductor compile (tails: see docs/operations.md)",
    )
    p.add_argument("--enforce-eager", action="store_true", help="no torch.compile, no CUDA graphs")
    p.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder (repeatable)")
    p.add_argument(
        "--vllm-version",
        default=None,
        metavar="RELEASE",
        help="vLLM release whose start-up to model: 0.9, 0.10, 0.11 or latest (capture sizes and mode, "
        "gc, P2P check, compiled repeats; hwdb/data/coldstart/vllm-scale.yaml; default 0.11)",
    )
    p.add_argument(
        "--startup-set",
        default="vllm-v1",
        help="start-up coefficient set (hwdb coldstart/; `calibrate fit` writes calibrated ones)",
    )


def _probe_args(p: argparse.ArgumentParser, prefix: str, delay: int, period: int, timeout: int, thr: int) -> None:
    g = p.add_argument_group(f"{prefix}Probe")
    g.add_argument(f"--{prefix}-initial-delay", type=int_arg(0, 86400), default=delay, metavar="S")
    g.add_argument(f"--{prefix}-period", type=int_arg(1, 86400), default=period, metavar="S")
    g.add_argument(f"--{prefix}-timeout", type=int_arg(1, 86400), default=timeout, metavar="S")
    g.add_argument(f"--{prefix}-failure-threshold", type=int_arg(1, 100_000), default=thr, metavar="N")
    g.add_argument(f"--no-{prefix}", action="store_true", help=f"no {prefix}Probe")


def add_subparsers(sub) -> None:
    """Hook for ``simulator/cli/commands.py``: adds ``epdsim coldstart`` and ``epdsim probes``."""
    c = sub.add_parser("coldstart", help="start-up phases of one instance (image pull to API ready)")
    _common(c)
    c.set_defaults(func=_run(cmd_coldstart))
    p = sub.add_parser("probes", help="simulate a Kubernetes pod's probes and restarts; recommend probe settings")
    _common(p)
    _probe_args(p, "liveness", 30, 10, 1, 3)
    _probe_args(p, "readiness", 30, 10, 1, 3)
    p.add_argument(
        "--startup-probe",
        nargs="?",
        const="recommended",
        default=None,
        metavar="SPEC",
        help="add a startupProbe: 'recommended' (the default when given bare) or "
        "initialDelaySeconds,periodSeconds,timeoutSeconds,failureThreshold",
    )
    p.add_argument(
        "--compile-cache-volume",
        action="store_true",
        help="the torch.compile cache is on a volume and survives container restarts",
    )
    p.add_argument(
        "--horizon", type=float_arg(0, 7 * 86400, lo_open=True), default=1800.0, help="simulated seconds (default 1800)"
    )
    p.add_argument("--margin", type=float_arg(0, 10), default=0.5, help="safety margin of the recommended startupProbe")
    p.set_defaults(func=_run(cmd_probes))


def operations_table(res: Results) -> Table:
    """Autoscaling and fault figures of a run (``summary["operations"]``, see simulator/engine/opsresults.py)."""
    o = res.summary["operations"]
    t = Table(show_header=False, title="operations")
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(o["crashes_by_kind"].items())) or "none"
    ups = o["scale_ups"]
    served = [u["serving_s"] - u["decided_s"] for u in ups if u["serving_s"] is not None]
    cancelled = sum(1 for u in ups if u["cancelled_s"] is not None)
    never = len(ups) - len(served) - cancelled
    rows = [
        ("failed / availability", f"{o['failed']} / {o['availability']:.2%}"),
        (
            "retried requests (re-sends) / discarded tokens",
            f"{o['retried_requests']} ({o['retries']}) / {o['discarded_tokens']:,}",
        ),
        ("crashes", f"{o['crashes']} ({kinds})"),
        (
            "scale-ups",
            f"{len(ups)} instances"
            + (f", order -> serving {min(served):.0f}-{max(served):.0f} s" if served else "")
            + (f", {cancelled} cancelled before serving" if cancelled else "")
            + (f", {never} never served (probes)" if never else ""),
        ),
        ("peak serving instances", ", ".join(f"{k} {v}" for k, v in o["peak_instances"].items())),
        ("SLO violations (during scale-up)", f"{o['slo_violations']} ({o['slo_violations_during_scale_up']})"),
        ("GPU-hours / cost", f"{o['gpu_hours']:.3f} / ${o['cost_usd']:.2f}"),
        (
            "wasted GPU-seconds (starting / lost work)",
            f"{o['wasted_gpu_s']:,.0f} ({o['starting_gpu_s']:,.0f} / {o['lost_work_gpu_s']:,.0f})",
        ),
    ]
    for k, v in rows:
        t.add_row(k, escape(v))
    return t
