"""``epdsim simulate``: run a scenario (with command-line overrides) and print its summary.

Hooked into ``simulator/cli/commands.py`` by ``add_subparser(sub)``.  The overrides ``--rate``,
``--num-requests``, ``--gpu``, ``--tp``, ``--dtype``, ``--slo-ttft`` and ``--slo-tpot`` edit the
scenario's data and validate it again through the scenario schema, so an overridden value is the same
as one written in the YAML, and a bad one fails with the schema's range under the flag's name.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast, get_args

from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import app.cli
import hwdb
from app.services.costs import cost_text, named_costs
from simulator import fmt
from simulator.cli.ops import operations_table
from simulator.confidence import BAND_SOURCE, BANDED, STATS, band_basis, band_caption, band_text, describe, error_bands
from simulator.console import elapsed_status, print_notes
from simulator.errors import location
from simulator.inputs import int_arg
from simulator.outputs import check_output, write_failed
from simulator.scenario import PoolConfig, Scenario, ScenarioError, load_scenario, parse_scenario
from simulator.serving_summary import offered_load_text, serving_block, serving_summary, slo_text

if TYPE_CHECKING:
    from simulator.engine.results import Results
    from simulator.summary_types import LatencyKey

DEFAULT_SCENARIO = Path(__file__).resolve().parents[2] / "examples" / "llama8b_h100_chat.yaml"
# The weight formats a pool accepts, from the scenario schema (PoolConfig.dtype).
WEIGHT_DTYPES = get_args(PoolConfig.model_fields["dtype"].annotation)
# A run longer than this shows an elapsed-time status on stderr (only when stderr is a terminal).
STATUS_AFTER_S = 1.0


def layout_text(info: dict) -> str:
    return " + ".join(
        f"{p['instances']}x {p['gpu']} TP{p['tp']}"
        + (f" PP{p['pp']}" if p["pp"] > 1 else "")
        + ("" if p["role"] == "colocated" else f" {p['role']}")
        for p in info["pools"]
    )


def band_record(res: Results) -> dict:
    """The model error band of the summary's figures for summary.json: per banded figure its relative
    error and, per statistic, ``<stat>_low``/``<stat>_high`` in seconds (None where no band applies)."""
    rel = error_bands(res.info)
    rec: dict = {"source": BAND_SOURCE, "basis": band_basis(res.info)}
    for key in BANDED:  # the keys of ``rel``, as summary keys
        r, fig = rel[key], res.summary[key]
        rec[key] = {
            "relative_error": r,
            **{
                f"{st}_{end}": (
                    None
                    if r is None or fig[st] != fig[st]
                    else max(0.0, fig[st] * (1 - r))
                    if end == "low"
                    else fig[st] * (1 + r)
                )
                for st in STATS
                for end in ("low", "high")
            },
        }
    return rec


def summary_table(res: Results, width: int | None = None) -> Table:
    """Percentiles of the latency figures; TTFT, TPOT and E2E with their model error band.  The band sits
    beside the figure, or under it when one line per row would be wider than ``width`` characters."""
    s, info = res.summary, res.info
    rel = error_bands(info)
    slo = {"ttft_s": res.scenario.slo.ttft_s, "tpot_s": res.scenario.slo.tpot_s}
    rows = []
    figures: tuple[tuple[LatencyKey, str], ...] = (
        ("ttft_s", "TTFT"),
        ("tpot_s", "TPOT"),
        ("itl_s", "ITL"),
        ("e2e_s", "E2E"),
        ("queue_s", "queue"),
    )
    for key, label in figures:
        target, band = slo.get(key), rel.get(key)
        cells = [
            (fmt.duration(s[key][p]), band_text(s[key][p], band) if band is not None and s[key][p] == s[key][p] else "")
            for p in STATS
        ]
        rows.append((label, cells, f"<= {fmt.duration(target)}" if target else ""))
    one_line = 1 + sum(
        3 + w
        for w in (
            6,
            *(max(len(f"{c[i][0]} {c[i][1]}".strip()) for _, c, _ in rows) for i in range(len(STATS))),
            max(3, *(len(r[2]) for r in rows)),
        )
    )
    sep = "\n" if width is not None and one_line > width else " "
    t = Table(
        title=f"{res.scenario.name}: {info['model']} on {layout_text(info)}",
        caption=band_caption(info, rel),
        caption_justify="left",
    )
    t.add_column("metric", no_wrap=True)
    for p in STATS:
        t.add_column(p, justify="right", no_wrap=True)
    t.add_column("SLO", justify="right", no_wrap=True)
    for label, cells, slo_cell in rows:
        t.add_row(label, *(f"{v}{sep}{b}" if b else v for v, b in cells), slo_cell)
    return t


# Below this console width a totals label wraps at spaces within KEY_WIDTH characters, leaving the
# value (a confidence line is a paragraph) more than a third of an 80-column line.
NARROW, KEY_WIDTH = 100, 24


def totals_table(res: Results, width: int | None = None) -> Table:
    s = res.summary
    breakdown = cast("dict[str, float]", s["ttft_breakdown_mean_s"])  # every phase's value a float
    narrow = width is not None and width < NARROW
    t = Table(show_header=False)
    t.add_column(no_wrap=not narrow, max_width=KEY_WIDTH if narrow else None)
    t.add_column()
    rows = [
        ("offered load", offered_load_text(res.info["offered_load"])),
        ("precision", precision_text(res.info["pools"])),
        ("requests completed / rejected / unfinished", f"{s['completed']} / {s['rejected']} / {s['unfinished']}"),
        (
            "throughput",
            f"{s['throughput_rps']:.2f} req/s, {s['output_tokens_per_s']:,.0f} output tok/s "
            f"({s['output_tokens_per_s_per_gpu']:,.0f} per GPU)",
        ),
        (
            "mean batch size / KV occupancy (max)",
            f"{s['mean_batch_size']:.1f} / {fmt.percent(s['mean_kv_occupancy'])} "
            f"({fmt.percent(s['max_kv_occupancy'])})",
        ),
        ("preemptions", str(s["preemptions"])),
        *(
            [
                (
                    "TTFT breakdown (mean)",
                    ", ".join(f"{k} {fmt.duration(v)}" for k, v in breakdown.items() if v == v and v > 0),
                )
            ]
            if res.info.get("kv_transfer") or "encoder" in s
            else []
        ),
        *(
            [
                (
                    "encoder (" + s["encoder"]["topology"] + ")",
                    f"{s['encoder']['images']} images, {s['encoder']['images_encoded']} encoded "
                    f"(cache hit rate {fmt.percent(s['encoder']['cache_hit_rate'])}), "
                    f"utilisation {fmt.percent(s['encoder']['utilisation'])}",
                )
            ]
            if "encoder" in s
            else []
        ),
        *(
            [
                (
                    "KV moved",
                    f"{s['kv_bytes_moved'] / 1e9:,.1f} GB over {res.info['kv_transfer']['link']} "
                    f"({res.info['kv_transfer']['connector']})",
                )
            ]
            if res.info.get("kv_transfer")
            else []
        ),
        (
            "SLO attainment",
            f"{fmt.percent(s['slo_attainment'])} of requests meet "
            + slo_text(res.scenario.slo.ttft_s, res.scenario.slo.tpot_s)
            + f" (target {fmt.percent(res.scenario.slo.attainment, 0)})",
        ),
        ("cost", cost_text(named_costs(s))),
        ("perf model", res.info["perf_model"]),
        *[(f"confidence ({p['name']})", describe(p["confidence"])) for p in res.info["pools"] if "confidence" in p],
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def precision_text(pools: list[dict]) -> str:
    """Each pool's weight format and KV-cache format (as resolved: ``auto`` is the engine's choice)."""
    return "; ".join(
        f"{p['name']}: weights {p['dtype']}" + (f", KV cache {p['kv_cache_dtype']}" if "kv_cache_dtype" in p else "")
        for p in pools
    )


def _override_error(flag: str, msg: str) -> ScenarioError:
    return ScenarioError(f"epdsim simulate {flag}: {msg}")


def validated(data: dict, origin: str, flag_at: dict[str, str]) -> Scenario:
    """``data`` parsed as a scenario file is.  A value the schema refuses at a place a flag set (``flag_at``:
    location such as ``slo.ttft_s`` -> ``--slo-ttft``) is reported under the flag with the schema's range."""
    try:
        return parse_scenario(data, origin=origin)
    except ScenarioError:
        try:
            Scenario.model_validate(data)
        except ValidationError as err:
            lines = []
            for e in err.errors():
                where, value = location(e["loc"], data), e.get("input")
                if where in flag_at:
                    shown = f"{value:g}" if isinstance(value, float) else repr(value)
                    line = f"{flag_at[where]} {shown}: {e['msg'].removeprefix('Value error, ')} (it sets {where})"
                    lines += [line] if line not in lines else []
            if lines:
                raise ScenarioError(f"epdsim simulate: {'; '.join(lines)}") from None
        raise


def apply_overrides(scn, args):
    """``scn`` with the command line's ``--seed --model --hwdb --rate --num-requests --gpu --tp --dtype
    --slo-ttft --slo-tpot``, validated as a scenario file would be."""
    data = scn.model_dump(mode="json")
    flags = []
    flag_at: dict[str, str] = {}
    if args.seed is not None:
        data["seed"] = args.seed
        flags.append(f"--seed {args.seed}")
    if args.model:
        data["model"] = args.model
        flags.append(f"--model {args.model}")
    if args.hwdb:
        data["hwdb"] = list(data.get("hwdb") or []) + list(args.hwdb)
    if args.rate is not None:
        kind = data["workload"]["arrival"]["kind"]
        if kind == "closed":
            raise _override_error(
                "--rate",
                "the scenario's arrivals are a closed loop (a fixed number of "
                "users), which has no rate; change workload.arrival.concurrency in the YAML, "
                "or give an open-loop scenario (poisson, gamma, trace)",
            )
        if kind == "shaped":
            raise _override_error(
                "--rate",
                "the scenario's arrival rate follows a shape over time "
                "(workload.arrival.shape); edit the shape in the YAML",
            )
        if not args.rate > 0:
            raise _override_error("--rate", f"must be a positive number of requests per second (got {args.rate:g})")
        data["workload"]["arrival"]["rate"] = args.rate
        flag_at["workload.arrival.rate"] = "--rate"
        if kind == "trace":
            data["workload"]["arrival"]["time_scale"] = 1.0  # a trace's rate replaces its time scale
        flags.append(f"--rate {args.rate:g}")
    if args.num_requests is not None:
        if args.num_requests < 1:
            raise _override_error("--num-requests", f"must be at least 1 (got {args.num_requests})")
        data["workload"]["num_requests"] = args.num_requests
        flag_at["workload.num_requests"] = "--num-requests"
        if data["workload"].get("duration_s") is not None and data["workload"]["arrival"]["kind"] != "closed":
            data["workload"]["duration_s"] = None  # the count decides, not the scenario's duration
        flags.append(f"--num-requests {args.num_requests}")
    # --tp and --dtype size the language model's pools; an EPD scenario's encoder pool keeps its TP and its
    # bf16 weights (the vision encoder is modelled in bf16 only).
    for flag, key, value in (("--gpu", "gpu", args.gpu), ("--tp", "tp", args.tp), ("--dtype", "dtype", args.dtype)):
        if value is None:
            continue
        for i, p in enumerate(data["pools"]):
            if key == "gpu" or p.get("role", "colocated") != "encoder":
                p[key] = value
                flag_at[f"pools[{i}].{key}"] = flag
        flags.append(f"{flag} {value}")
    for flag, key, value in (("--slo-ttft", "ttft_s", args.slo_ttft), ("--slo-tpot", "tpot_s", args.slo_tpot)):
        if value is None:
            continue
        data["slo"] = {**(data.get("slo") or {}), key: value}
        flag_at[f"slo.{key}"] = flag
        flags.append(f"{flag} {value:g}")
    if not flags and not args.hwdb:
        return scn
    origin = f"{scn.name} with {' '.join(flags)}" if flags else scn.name
    return validated(data, origin, flag_at)


def cmd_simulate(args, con: Console) -> int:
    from simulator.run import simulate  # noqa: PLC0415 - pandas and the engine: not at start-up

    scn = apply_overrides(load_scenario(args.scenario or DEFAULT_SCENARIO), args)
    if scn.hwdb:
        print_notes(hwdb.load(scn.hwdb).notes)
    if args.out:
        check_output(args.out, "--out", folder=True, error=ScenarioError)
    if args.report:
        check_output(args.report, "--report", folder=False, error=ScenarioError)
    n = scn.workload.num_requests
    with elapsed_status(f"simulating {scn.name}" + (f", {n:,} requests" if n else ""), STATUS_AFTER_S):
        res = simulate(scn, replication=args.replication)
    con.print(summary_table(res, con.width))
    con.print(totals_table(res, con.width))
    if "operations" in res.summary:
        con.print(operations_table(res))
    con.print(escape(serving_block(serving_summary(res))), highlight=False)
    from simulator.saturation import saturation  # noqa: PLC0415 - pandas: not at start-up

    sat = saturation(res)
    if sat:
        con.print(f"[bold red]{escape(sat['message'])}[/]", highlight=False)
    if args.out:
        try:
            paths = replace(res, summary={**res.summary, "model_error_band": band_record(res)}).write(
                args.out, tuple(args.format)
            )
        except OSError as exc:
            raise ScenarioError(write_failed(exc, "--out", args.out)) from None
        con.print(f"wrote {len(paths)} files to {args.out}")
    if args.report:
        try:
            written = app.cli.write_simulation_report(res, args.report, plotly=args.report_plotly)
        except OSError as exc:
            raise ScenarioError(write_failed(exc, "--report", args.report)) from None
        con.print(f"wrote report {written}")
    return 0


def add_subparser(sub) -> None:
    s = sub.add_parser("simulate", help="run a scenario and print its summary")
    s.add_argument("scenario", nargs="?", help=f"scenario YAML (default: {DEFAULT_SCENARIO.name})")
    s.add_argument("--out", help="directory for requests/steps tables and summary.json")
    s.add_argument("--format", nargs="+", default=["parquet"], choices=["parquet", "csv", "json"])
    s.add_argument("--seed", type=int_arg(0, 2**63 - 1), help="override the scenario's seed")
    s.add_argument("--replication", type=int_arg(0, 2**31), default=0, help="independent replication index")
    s.add_argument("--model", help="override the scenario's model (name, alias, config.json or model folder)")
    s.add_argument("--rate", type=float, help="override the open-loop arrival rate (requests/s)")
    s.add_argument("--num-requests", type=int, help="override the number of requests")
    s.add_argument("--gpu", help="override the GPU of every pool")
    s.add_argument("--tp", type=int, help="override the tensor-parallel degree of every prefill/decode/colocated pool")
    s.add_argument(
        "--dtype",
        choices=WEIGHT_DTYPES,
        help="override the weight format of every prefill/decode/colocated pool (fp4: NVFP4/MXFP4, "
        "int4: W4A16); kv_cache_dtype stays the scenario's",
    )
    s.add_argument(
        "--slo-ttft",
        type=float,
        metavar="SECONDS",
        help="set the SLO's time-to-first-token target (s), adding an SLO to a scenario without one",
    )
    s.add_argument(
        "--slo-tpot",
        type=float,
        metavar="SECONDS",
        help="set the SLO's time-per-output-token target (s), adding an SLO to a scenario without one",
    )
    s.add_argument("--hwdb", action="append", default=[], help="extra user hwdb folder (repeatable)")
    s.add_argument("--report", metavar="FILE.html", help="also write an HTML report with charts")
    app.cli.add_plotly_argument(s)
    s.set_defaults(func=cmd_simulate)
