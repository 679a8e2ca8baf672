"""A PD bundle replayed in the simulator and compared: ``epdsim calibrate validate PD_BUNDLE --profile HWDB``
(and ``python -m calibration.pd.run replay``).

The scenario: a prefill pool and a decode pool of ``CPU-host`` with the engine ``calibrate fit``
wrote, ``kv_transfer`` with the bundle's connector (``example`` or ``nixl``) on a non-GPU-direct
fabric whose bandwidth is overridden by what the run measured - the file write+read bandwidth for
ExampleConnector, bytes over transfer time of the decode server's NIXL reads for NixlConnector
(divided by the connector's TCP-mode efficiency, which the simulator applies again) - and the
measured arrivals and lengths as a trace.  The comparison rows:

* TTFT p50/p90, client through the router (information: the simulator has no router and no HTTP hops);
* TTFT p50/p90, the engines' share: each server's queue and time to its first token, against the simulated
  TTFT less its front end (a check);
* TPOT p50, decode server ``mean_itl_ms`` and client (checks);
* KV transfer, mean: NIXL's own transfer time, or the file probe's per-transfer time, against the
  simulator's ``transfer_s`` (information: the simulator adds the connector's setup time).

And the time to first token part by part (:func:`part_rows`), so that a miss is placed: the prefill engine,
the decode engine (KV load, recompute, first token), the API servers and HTTP legs beyond the engines, the
router with the client's hop to it (not modelled), and decode TPOT.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml

import hwdb
from calibration.pd.bundle import PDReplayError, measured_rows, read_manifest, replay_inputs
from calibration.pd.launch import BLOCK
from calibration.pd.options import harness_connectors, pair_connector
from simulator.pd.connector_base import CPU_NIXL, KVConnector
from simulator.run import simulate
from simulator.scenario import parse_scenario


def _pct(xs, p):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return float(np.percentile(xs, p)) if xs else math.nan


def transfer_inputs(man: dict, bandwidth_Bps: float | None) -> tuple[KVConnector, float, str, float | None]:
    """(the strategy of the hwdb connector that ran the bundle's vLLM connector on the CPU pair, path
    bandwidth, where it comes from, measured mean transfer time)."""
    pair = pair_connector(man.get("connector"))
    if pair is None:
        raise PDReplayError(
            f"connector {man.get('connector')!r} of the bundle: the replay knows "
            f"{', '.join(str(s.vllm_connector()) for s in harness_connectors().values())}"
        )
    if pair.cpu_pair == CPU_NIXL:
        nx = man.get("nixl_transfers") or {}
        measured, per = nx.get("bandwidth_Bps"), nx.get("mean_xfer_s")
        source = "NIXL bytes / transfer time (decode server /metrics)"
    else:
        fb = man.get("file_bandwidth") or {}
        measured, per = fb.get("write_read_Bps"), fb.get("per_transfer_s")
        source = "file write+read probe"
    if bandwidth_Bps:
        return pair, bandwidth_Bps, "--bandwidth-Bps", per
    if not measured:
        what = "NIXL transfer" if pair.cpu_pair == CPU_NIXL else "file"
        raise PDReplayError(
            f"the run measured no {what} bandwidth (status {man.get('status', 'unknown')}); "
            f"re-run it, or give --bandwidth-Bps"
        )
    return pair, measured, source, per


def replay(
    bundle: str | Path,
    hwdb_dirs: list[str],
    engine: str | None = None,
    model: str | None = None,
    fabric: str = "tcp-100gbe",
    bandwidth_Bps: float | None = None,
    out: str | Path | None = None,
    tolerance: float = 0.25,
) -> dict:
    """Simulate the bundle's load as a PD scenario; write scenario.yaml, trace.jsonl and report.json
    into ``out`` (default BUNDLE/replay) and return the report."""
    bundle = Path(bundle)
    man = read_manifest(bundle)
    if man is None:
        raise PDReplayError(
            f"{bundle}: not a PD bundle (no manifest.json with kind pd_run); give the --out folder "
            f"of `epdsim calibrate run --pd`"
        )
    pair, bw, bw_source, measured_xfer = transfer_inputs(man, bandwidth_Bps)
    conn, nixl = pair.conn.name, pair.cpu_pair == CPU_NIXL
    engine, model = replay_inputs(hwdb_dirs, engine, model)
    db = hwdb.load(hwdb_dirs)
    entry, link = db.connector(conn), db.link(fabric)
    eff = entry.efficiency.value
    if entry.gpu_direct_required and not link.gpu_direct and entry.tcp_mode_efficiency is not None:
        eff = entry.tcp_mode_efficiency.value
    rows = measured_rows(bundle)
    vdir = Path(out) if out else bundle / "replay"
    vdir.mkdir(parents=True, exist_ok=True)
    trace = vdir / "trace.jsonl"
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "arrival_s": round(r["arrival_s"], 6),
                    "input_tokens": r["input_tokens"],
                    "output_tokens": r["output_tokens"],
                }
            )
            + "\n"
            for r in rows
        )
    )
    eng = {
        "engine": engine,
        "max_num_seqs": 128,
        "max_num_batched_tokens": 2048,
        "block_size": BLOCK,
        "enforce_eager": True,
        "max_model_len": 4096,
        "num_gpu_blocks_override": 8192,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": False,
    }
    data = {
        "name": f"replay-pd-cpu-{conn}",
        "description": f"PD pair on CPU with {man.get('connector')} (epdsim calibrate run --pd)",
        "model": str(Path(model).resolve()),
        "hwdb": [str(Path(h).resolve()) for h in hwdb_dirs],
        "pools": [
            {"name": "prefill", "role": "prefill", "gpu": "CPU-host", "engine": dict(eng)},
            {"name": "decode", "role": "decode", "gpu": "CPU-host", "engine": dict(eng)},
        ],
        "kv_transfer": {"connector": conn, "fabric": fabric, "same_node": False, "bandwidth_Bps": bw / eff},
        "workload": {"arrival": {"kind": "trace", "path": str(trace.resolve()), "format": "plain"}},
    }
    (vdir / "scenario.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    res = simulate(parse_scenario(data, "pd replay"))
    req = res.requests.sort_values("request_id")
    pred_ttft, pred_tpot = req["ttft_s"].tolist(), req["tpot_s"].tolist()
    pred_engines = (req["ttft_s"] - req["frontend_s"]).tolist()
    table = []

    def row(metric, stat, meas, pred, source, check):
        err = pred / meas - 1 if meas and math.isfinite(meas) and math.isfinite(pred) else math.nan
        table.append(
            {
                "metric": metric,
                "stat": stat,
                "source": source,
                "measured_s": meas,
                "predicted_s": pred,
                "rel_error": err,
                "check": check,
                "passed": (abs(err) <= tolerance if math.isfinite(err) else False) if check else None,
            }
        )

    for p in (50, 90):
        row(
            "TTFT", f"p{p}", _pct([r["client_ttft_s"] for r in rows], p), _pct(pred_ttft, p), "client via router", False
        )
    for p in (50, 90):
        row(
            "TTFT",
            f"p{p}",
            _pct([r["servers_ttft_s"] for r in rows], p),
            _pct(pred_engines, p),
            "prefill+decode srv",
            True,
        )
    row("TPOT", "p50", _pct([r["decode_server_tpot_s"] for r in rows], 50), _pct(pred_tpot, 50), "decode server", True)
    row("TPOT", "p50", _pct([r["client_tpot_s"] for r in rows], 50), _pct(pred_tpot, 50), "client", True)
    if measured_xfer:
        sim_xfer = req["transfer_s"].to_numpy(dtype=float) if "transfer_s" in req else np.array([math.nan])
        row(
            "KV transfer",
            "mean",
            measured_xfer,
            float(np.nanmean(sim_xfer)),
            "NIXL xfer time" if nixl else "file probe",
            False,
        )
    checks = [t for t in table if t["check"]]
    report = {
        "bundle": str(bundle.resolve()),
        "connector": man.get("connector"),
        "sim_connector": conn,
        "engine": engine,
        "hwdb": [str(h) for h in hwdb_dirs],
        "bandwidth_Bps": bw,
        "bandwidth_source": bw_source,
        "connector_efficiency": eff,
        "fabric": fabric,
        "completed_pred": int((req["outcome"] == "completed").sum()),
        "n": len(rows),
        "tolerance": tolerance,
        "table": table,
        "checks": len(checks),
        "failed": sum(1 for t in checks if not t["passed"]),
        "passed": all(t["passed"] for t in checks),
        "parts": part_rows(rows, req),
        "summary_pred": {k: res.summary.get(k) for k in ("ttft_s", "tpot_s") if k in res.summary},
        "out": str(vdir),
    }
    (vdir / "report.json").write_text(json.dumps(report, indent=1, default=str))
    return report


#: the parts of a PD request's time, in the order a request meets them: (name, measured row key, simulated
#: request columns summed, whether the simulator models it)
PARTS = (
    ("prefill engine: queue + prefill to its first token", "prefill_engine_s", ("queue_s", "prefill_s"), True),
    (
        "decode engine: queue, KV load, recompute, first token",
        "decode_engine_s",
        ("transfer_wait_s", "transfer_s", "decode_admission_s"),
        True,
    ),
    ("API servers and HTTP of both legs, beyond the engines", "servers_http_s", ("frontend_s",), True),
    ("router and the client's hop to it", "router_client_s", (), False),
    ("decode TPOT", "decode_server_tpot_s", ("tpot_s",), True),
)


def part_rows(rows: list[dict], req) -> list[dict]:
    """Each part of :data:`PARTS` at p50 over the requests: measured, simulated (0 for a part the
    simulator does not model) and the difference in seconds.  The API servers' and HTTP share is each
    router leg less its engine's time; the simulator has one fitted front end for it."""
    for r in rows:
        legs = (r["prefill_leg_s"], r["prefill_engine_s"], r["decode_leg_s"], r["decode_engine_s"])
        ok = all(x is not None and math.isfinite(x) for x in legs)
        r["servers_http_s"] = (legs[0] - legs[1]) + (legs[2] - legs[3]) if ok else None
    out = []
    for name, key, cols, modelled in PARTS:
        meas = _pct([r[key] for r in rows], 50)
        pred = _pct(sum((req[c].to_numpy(dtype=float) for c in cols), np.zeros(len(req))).tolist(), 50) if cols else 0.0
        out.append(
            {
                "part": name,
                "measured_s": meas,
                "predicted_s": pred,
                "difference_s": pred - meas if math.isfinite(meas) else math.nan,
                "modelled": modelled,
            }
        )
    return out


def part_summary(parts: list[dict]) -> str:
    """One line: the TTFT part the simulation misses by the most time, and by how much."""
    ttft = [p for p in parts if p["part"] != "decode TPOT" and math.isfinite(p["difference_s"])]
    if not ttft:
        return "no part of TTFT was measured (the servers ran without --enable-per-request-metrics?)"
    worst = max(ttft, key=lambda p: abs(p["difference_s"]))
    how = "not modelled" if not worst["modelled"] else ("too long" if worst["difference_s"] > 0 else "too short")
    return (
        f"TTFT's largest miss: {worst['part']} ({fmt_ms(worst['measured_s'])} measured, "
        f"{fmt_ms(worst['predicted_s'])} simulated: {how}, {worst['difference_s'] * 1e3:+.1f} ms at p50)"
    )


def fmt_ms(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:.1f} ms"


def print_report(report: dict, echo=print) -> None:
    """The comparison as plain lines (``pd_run replay``; ``calibrate validate`` prints a table)."""
    for t in report["table"]:
        verdict = "" if not t["check"] else ("  ok" if t["passed"] else "  FAIL")
        echo(
            f"{t['metric']:11} {t['stat']:4} {t['source']:18} measured {t['measured_s'] * 1e3:8.2f} ms  "
            f"predicted {t['predicted_s'] * 1e3:8.2f} ms  error {t['rel_error'] * 100:+6.1f}%{verdict}"
        )
    for t in report["parts"]:
        echo(f"  {t['part']:58} measured {fmt_ms(t['measured_s'])}  simulated {fmt_ms(t['predicted_s'])}")
    echo(f"  {part_summary(report['parts'])}")
    echo(
        f"  bandwidth {report['bandwidth_Bps'] / 1e9:.3g} GB/s ({report['bandwidth_source']}); report: "
        f"{report['out']}/report.json"
    )
