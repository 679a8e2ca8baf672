"""Reading the folder ``epdsim calibrate run --pd`` writes (a PD bundle), for ``calibrate show`` and ``validate``.

A PD bundle is not a colocated calibration bundle: its manifest has ``kind: pd_run`` and two
servers, and its one load test is ``records/load_pd.jsonl`` (the client's records, each with the
router's timings and both servers' metrics under ``pd``).  ``calibrate show`` recognises it by the
``kind`` and prints :func:`pd_summary` (a prefill-side, a decode-side and a transfer table);
``calibrate validate`` replays it (:mod:`calibration.pd.replay`); ``fit`` refuses it with the
commands that read it (:data:`REPLAY_HINT`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rich.markup import escape

import hwdb
from calibration.harness.bundle import BundleError
from calibration.pd.options import pair_connector
from simulator.pd.connector_base import CPU_NIXL

PD_KIND = "pd_run"
# The name both servers of a PD pair serve the tiny model under (and the fit names its model folder).
SERVED = "tiny-llama"
PD_SCHEMA_VERSION = 1
RECORDS = Path("records") / "load_pd.jsonl"
REPLAY_HINT = (
    "replay it with `epdsim calibrate validate BUNDLE --profile HWDB_DIR` "
    "(HWDB_DIR from `epdsim calibrate fit` of a colocated bundle) and summarise it with "
    "`epdsim calibrate show BUNDLE`"
)


class PDReplayError(ValueError):
    """A replay that cannot run as asked (exit code 2)."""


def read_manifest(path: str | Path) -> dict | None:
    """The manifest when ``path`` is a PD bundle, else None (not a folder, no manifest, another kind)."""
    mf = Path(path) / "manifest.json"
    try:
        m = json.loads(mf.read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("kind") == PD_KIND else None


def _settle(path: Path, m: dict) -> None:
    """A run still ``running`` whose process is gone on this host (SIGKILL, a crash) is marked
    ``interrupted`` (as :meth:`Bundle.settle_stale_runs` does for colocated bundles)."""
    from calibration.harness.bundle import process_alive  # noqa: PLC0415 - listed in tests/test_import_structure.py

    if m.get("status") != "running" or not m.get("pid") or m.get("hostname") != os.uname().nodename:
        return
    if process_alive(m["pid"], m.get("proc_start")):
        return
    m.update(
        status="interrupted",
        interrupted_by=f"found with its process {m['pid']} gone (killed with SIGKILL, crashed, or the machine stopped)",
    )
    try:
        tmp = path / "manifest.json.tmp"
        tmp.write_text(json.dumps(m, indent=1, default=str))
        os.replace(tmp, path / "manifest.json")
    except OSError:
        pass  # read-only: corrected in memory only


def _pct(xs: list[float], p: float) -> float | None:
    xs = sorted(x for x in xs if isinstance(x, (int, float)) and math.isfinite(x))
    if not xs:
        return None
    k = (len(xs) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def _records(path: Path) -> list[dict]:
    f = path / RECORDS
    if not f.exists():
        return []
    out = []
    for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a torn last line of a killed run
        if not isinstance(rec, dict):
            raise BundleError(f"{f}, line {i}: a record is a JSON {type(rec).__name__}, expected an object")
        out.append(rec)
    return out


def _report(path: Path) -> dict | None:
    """The newest comparison written for the bundle (``calibrate validate``, else ``pd_run replay``)."""
    for sub in ("validation", "replay"):
        try:
            return json.loads((path / sub / "report.json").read_text())
        except (OSError, ValueError):
            continue
    return None


def pd_summary(path: str | Path) -> dict:
    """What ``calibrate show`` prints for a PD bundle: settings, host, and the load test's figures
    per side (seconds): prefill server TTFT and the router's prefill leg; decode server TTFT (KV
    load + first token) and TPOT; the client's TTFT and TPOT through the router; the transfers."""
    path = Path(path)
    m = read_manifest(path)
    if m is None:
        raise BundleError(f"{path} is not a PD bundle: its manifest.json is missing or has no kind {PD_KIND!r}")
    _settle(path, m)
    recs = _records(path)
    ok = [r for r in recs if r.get("ok")]

    def srv(r, side, key):
        v = ((r.get("pd") or {}).get(f"{side}_metrics") or {}).get(key)
        return v / 1e3 if isinstance(v, (int, float)) else None

    def leg(r):
        pd = r.get("pd") or {}
        a, b = pd.get("prefill_sent_s"), pd.get("prefill_done_s")
        return b - a if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None

    def client_tpot(r):
        o, e2e, ttft = r.get("output_tokens"), r.get("e2e_s"), r.get("ttft_s")
        ok_ = isinstance(o, int) and o > 1 and isinstance(e2e, (int, float)) and isinstance(ttft, (int, float))
        return (e2e - ttft) / (o - 1) if ok_ else None

    def p(xs):
        return {"p50": _pct(xs, 50), "p90": _pct(xs, 90)}

    sides = {
        "prefill": {
            "server TTFT": p([srv(r, "prefill", "time_to_first_token_ms") for r in ok]),
            "server queue": p([srv(r, "prefill", "queue_time_ms") for r in ok]),
            "router leg (HTTP, not streamed)": p([leg(r) for r in ok]),
        },
        "decode": {
            "server TTFT (KV load + 1st token)": p([srv(r, "decode", "time_to_first_token_ms") for r in ok]),
            "server queue": p([srv(r, "decode", "queue_time_ms") for r in ok]),
            "server TPOT": p([srv(r, "decode", "mean_itl_ms") for r in ok]),
        },
        "client": {
            "TTFT via router": p([r.get("ttft_s") for r in ok]),
            "TPOT via router": p([client_tpot(r) for r in ok]),
        },
    }
    rep = _report(path)
    load = m.get("load") or {}
    return {
        "path": str(path),
        "kind": PD_KIND,
        "schema_version": m.get("schema_version"),
        "mode": m.get("mode"),
        "created": m.get("created"),
        "status": m.get("status", "unknown (written before status was kept)"),
        "interrupted_by": m.get("interrupted_by"),
        "error": m.get("error"),
        "connector": m.get("connector"),
        "block_size": m.get("block_size"),
        "binds": m.get("binds"),
        "ready_s": m.get("ready_s"),
        "vllm": (m.get("versions") or {}).get("vllm"),
        "host": m.get("host"),
        "load": load,
        "requests": len(recs),
        "ok": len(ok),
        "kv_loaded": m.get("kv_loaded"),
        "file_bandwidth_Bps": (m.get("file_bandwidth") or {}).get("write_read_Bps"),
        "file_per_transfer_s": (m.get("file_bandwidth") or {}).get("per_transfer_s"),
        "nixl_transfers": m.get("nixl_transfers"),
        "nixl": m.get("nixl"),
        "handshake_warmup_s": (m.get("result") or {}).get("handshake_warmup_s"),
        "sides": sides,
        "figures": {
            "client_ttft_p50": sides["client"]["TTFT via router"]["p50"],
            "client_ttft_p90": sides["client"]["TTFT via router"]["p90"],
            "prefill_server_ttft_p50": sides["prefill"]["server TTFT"]["p50"],
            "decode_server_ttft_p50": sides["decode"]["server TTFT (KV load + 1st token)"]["p50"],
            "decode_tpot_p50": sides["decode"]["server TPOT"]["p50"],
        },
        "replay": rep is not None,
        "validation": None if rep is None else {k: rep.get(k) for k in ("out", "checks", "failed", "passed")},
    }


def show_pd(s: dict, con) -> None:
    """Print :func:`pd_summary` (rich Console); tables keep their full width (no cut columns)."""
    from simulator.console import wide_tables  # noqa: PLC0415 - listed in tests/test_import_structure.py

    def ms(x):
        return "-" if x is None else f"{x * 1e3:.1f} ms"

    load = s["load"]
    con.print(
        f"[bold]{escape(s['path'])}[/]: PD bundle ({s['connector']}, block {s['block_size']}), "
        f"{s['mode']} mode, status {escape(str(s['status']))}, vLLM {s['vllm'] or '-'}; "
        f"{s['ok']} of {s['requests']} ok"
    )
    if s.get("error"):
        con.print(f"error: {escape(str(s['error'])[:300])}")
    if load:
        con.print(
            f"load: {load.get('kind')} {load.get('rate')} req/s, {load.get('n')} requests, prompts of "
            f"{load.get('blocks')} x {s['block_size']} + {load.get('extra')} tokens, outputs "
            f"{load.get('out_min')}..{load.get('out_max')} tokens, seed {load.get('seed')}"
        )
    if s.get("ready_s"):
        con.print("ready: " + ", ".join(f"{k} {v:.1f} s" for k, v in s["ready_s"].items() if v is not None))
    heads = ["side", "figure", "p50", "p90"]
    for side in ("prefill", "decode", "client"):
        rows = [[side, name, ms(v["p50"]), ms(v["p90"])] for name, v in s["sides"][side].items()]
        title = {
            "prefill": "prefill side (server metrics; the router's prefill request)",
            "decode": "decode side (server metrics)",
            "client": "client (through the router)",
        }[side]
        for t in wide_tables(title, heads, rows, con.width, justify=dict.fromkeys(heads[2:], "right")):
            con.print(t)
    rows = []
    kv = s.get("kv_loaded") or {}
    if "injections" in kv:
        rows.append(["KV loads (decode log)", f"{kv.get('injections')} loads, {kv.get('tokens')} tokens"])
    if s.get("file_bandwidth_Bps"):
        rows.append(
            [
                "file write + read",
                f"{s['file_bandwidth_Bps'] / 1e9:.2f} GB/s, {ms(s.get('file_per_transfer_s'))} per transfer",
            ]
        )
    nx = s.get("nixl_transfers") or {}
    if nx.get("transfers"):
        rows.append(
            [
                "NIXL reads (decode /metrics)",
                f"{nx['transfers']} transfers, mean {nx['mean_xfer_s'] * 1e3:.3f} ms "
                f"and {nx['mean_bytes'] / 1e6:.3f} MB each",
            ]
        )
        if nx.get("bandwidth_Bps"):
            rows.append(["NIXL bytes / transfer time", f"{nx['bandwidth_Bps'] / 1e9:.2f} GB/s"])
    elif (pair := pair_connector(s["connector"])) is not None and pair.cpu_pair == CPU_NIXL:
        rows.append(["NIXL reads (decode /metrics)", "none recorded"])
    if s.get("nixl"):
        n = s["nixl"]
        rows.append(
            [
                "NIXL settings",
                f"kv_buffer_device {n.get('kv_buffer_device')}, progress thread "
                f"{n.get('progress_thread')}, pinning kept: "
                f"{'yes' if n.get('keep_binding') else 'no'}",
            ]
        )
    if s.get("handshake_warmup_s") is not None:
        rows.append(["warm-up through the router (NIXL handshake)", ms(s["handshake_warmup_s"])])
    if rows:
        for t in wide_tables(f"KV transfer ({s['connector']})", ["figure", "value"], rows, con.width):
            con.print(t)
    v = s.get("validation")
    if v is None:
        con.print("not validated yet: " + REPLAY_HINT.replace("BUNDLE", s["path"]))
    elif v.get("checks") is not None:
        con.print(f"validated: {v['checks'] - v['failed']} of {v['checks']} checks pass ({v['out']}/report.json)")
    else:
        con.print(f"replayed: {v.get('out') or s['path'] + '/replay'}/report.json")


def replay_inputs(hwdb_dirs: list[str], engine: str | None, model: str | None) -> tuple[str, str]:
    """The engine and model folder a replay uses: as given, else what ``calibrate fit`` wrote into the
    hwdb folders (``fits/<profile>.json`` names its engine, ``models/<served name>/``).
    Raises :class:`PDReplayError` naming the flag, the value and the fix."""
    if not hwdb_dirs:
        raise PDReplayError("--hwdb: missing; give the folder `epdsim calibrate fit FIT_BUNDLE --out HWDB_DIR` wrote")
    try:
        db = hwdb.load(hwdb_dirs)
    except hwdb.HwdbError as exc:
        raise PDReplayError(f"--hwdb {' '.join(hwdb_dirs)}: {exc}") from None
    fits = sorted(f for d in hwdb_dirs for f in (Path(d) / "fits").glob("*.json"))
    if engine is None:
        names = sorted({json.loads(f.read_text()).get("engine_name") or f.stem for f in fits})
        if len(names) != 1:
            raise PDReplayError(
                f"--engine: not given, and the hwdb folders hold {len(names)} fits "
                f"({', '.join(names) or 'none'}); name one with --engine"
            )
        engine = names[0]
    if engine not in db.engines:
        mine = sorted(n for d in hwdb_dirs for n in (f.stem for f in (Path(d) / "engines").glob("*.yaml")))
        raise PDReplayError(
            f"--engine {engine}: unknown engine; the hwdb folders {', '.join(hwdb_dirs)} define "
            f"{', '.join(mine) or 'no engine'}. Re-run `epdsim calibrate fit FIT_BUNDLE --out "
            f"HWDB_DIR` (every fit writes engines/<profile>.yaml), or leave --engine out"
        )
    if model is None:
        cand = [
            Path(d) / "models" / SERVED for d in hwdb_dirs if (Path(d) / "models" / SERVED / "config.json").exists()
        ]
        if not cand:
            raise PDReplayError(
                f"--model: not given, and no hwdb folder holds models/{SERVED}/config.json; "
                f"give the model folder of the pair (config.json)"
            )
        model = str(cand[-1])
    return engine, model


def _engine_s(metrics: dict) -> float | None:
    """An engine's own time to a request's first token, seconds: vLLM's per-request ``queue_time_ms``
    (queued to scheduled) plus ``time_to_first_token_ms`` (scheduled to first token)."""
    t = metrics.get("time_to_first_token_ms")
    if not isinstance(t, (int, float)) or not math.isfinite(t):
        return None
    q = metrics.get("queue_time_ms")
    return (t + (q if isinstance(q, (int, float)) and math.isfinite(q) else 0.0)) / 1e3


def _span(pd: dict, start: str, end: str) -> float | None:
    a, b = pd.get(start), pd.get(end)
    return b - a if isinstance(a, (int, float)) and isinstance(b, (int, float)) else None


def measured_rows(out: Path) -> list[dict]:
    """One row per completed request of a PD bundle, times in seconds.  ``prefill_engine_s`` and
    ``decode_engine_s`` are each engine's queue plus time to its first token (the decode engine's covers
    the KV load and the recompute); ``prefill_leg_s`` and ``decode_leg_s`` are the router's request to
    each server until its answer (prefill) or first byte (decode), HTTP and API server included;
    ``router_client_s`` is what the client's TTFT holds beyond the router's two legs (its hop to the
    router and back, and the router's own work)."""
    rows = []
    recs = [json.loads(x) for x in (out / "records" / "load_pd.jsonl").read_text().splitlines() if x.strip()]
    recs = [r for r in recs if r.get("ok")]
    t0 = min(r["t_send"] for r in recs)
    for r in recs:
        pd = r.get("pd") or {}
        pm, dm = pd.get("prefill_metrics") or {}, pd.get("decode_metrics") or r.get("server_metrics") or {}
        o = int(r["output_tokens"])
        pe, de = _engine_s(pm), _engine_s(dm)
        first_byte = pd.get("decode_first_byte_s")
        ttft = r.get("ttft_s")
        rows.append(
            {
                "id": r["id"],
                "arrival_s": r["t_send"] - t0,
                "input_tokens": int(r["prompt_tokens"]),
                "output_tokens": o,
                "client_ttft_s": ttft,
                "client_tpot_s": ((r["e2e_s"] - r["ttft_s"]) / (o - 1)) if o > 1 else None,
                "prefill_engine_s": pe,
                "decode_engine_s": de,
                "prefill_leg_s": _span(pd, "prefill_sent_s", "prefill_done_s"),
                "decode_leg_s": _span(pd, "decode_sent_s", "decode_first_byte_s"),
                "router_client_s": ttft - first_byte
                if isinstance(ttft, (int, float)) and isinstance(first_byte, (int, float))
                else None,
                "decode_server_tpot_s": dm["mean_itl_ms"] / 1e3 if dm.get("mean_itl_ms") and o > 1 else None,
                # the engines' share of TTFT: no HTTP hop, no API server, no router
                "servers_ttft_s": pe + de if pe is not None and de is not None else None,
            }
        )
    return rows
