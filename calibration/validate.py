"""Replay a bundle's load tests in the simulator and compare: ``epdsim calibrate validate``.

    epdsim calibrate validate BUNDLE --profile HWDB_DIR [--tolerance 0.25] [--out DIR]

For every load test (``load_*`` phase) of the bundle, the simulator serves the same requests: the
same send times (each request's measured ``t_send``, as a plain trace) and the same prompt and
output lengths, on the bundle's model and GPU with the calibrated profile of ``HWDB_DIR`` and the
server's own engine arguments (max_num_seqs, max_num_batched_tokens, block size, the KV blocks
the server reported, enforce_eager; see :func:`calibration.fit.engine_setup`).

What is compared (``measured`` -> ``predicted``):

* **server-side** (the checks): vLLM's per-request timings (``--enable-per-request-metrics``)
  start when the engine core takes the request off its input queue, between two steps.  So the
  simulator's times are taken from the start of the first step at or after the request's arrival
  ("pickup"): TTFT = queue + prefill (``queue_time_ms + time_to_first_token_ms``) vs
  ``first_token - pickup``; TPOT = ``mean_itl_ms`` vs the simulator's TPOT; E2E = queue + prefill +
  generation vs ``finish - pickup``; ITL mean from the ``vllm:inter_token_latency_seconds``
  histogram delta vs the simulator's step-weighted ITL (the histogram's quantiles only where its
  buckets resolve them: vLLM's first ITL bucket is 0-10 ms);
* **client-side** (information only): the client's TTFT / E2E vs the simulator's (from arrival)
  plus the fit's front-end latency (``fits/<profile>.json``); ITL and TPOT from the streamed token
  times, which on a small host arrive in lumps.

Each check passes when ``|predicted / measured - 1| <= tolerance``.  Written to ``--out``
(default ``BUNDLE/validation``): ``report.md``, ``report.html`` (self-contained Plotly),
``validation.json``, and per phase the replayed trace and scenario.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import yaml

import hwdb
from calibration.fit import (CPU_GPU, FitInputError, bundle_model, engine_setup, is_cpu_server, open_bundle,
                             server_ttft_s)
from calibration.harness.bundle import Bundle
from calibration.harness.metrics import histogram_quantile

PCTS = (50, 90, 99)
METRICS = ("ttft", "tpot", "itl", "e2e")
LABEL = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}


# ============================================================================ inputs
def _user_profiles(folder: Path) -> dict[str, dict]:
    out = {}
    for p in sorted((folder / "profiles").glob("*.yaml")):
        try:
            d = yaml.safe_load(p.read_text())
        except yaml.YAMLError:
            continue
        if isinstance(d, dict) and d.get("name"):
            out[d["name"]] = {"path": p, "gpu": d.get("gpu"), "created": str(d.get("created"))}
    return out


def resolve_profile(b: Bundle, profile: str | Path, gpu: str | None, hwdb_dirs=()):
    """(db, GPU, Profile, hwdb dirs, fit report or None) for validating ``b`` with ``profile``."""
    p = Path(profile)
    if not p.exists():
        raise FitInputError(f"--profile {p}: no such folder; give the hwdb folder `epdsim calibrate fit` wrote "
                            f"(default BUNDLE/hwdb) or one of its profile YAML files.")
    if p.is_file():
        folder = p.parent.parent if p.parent.name == "profiles" else p.parent
        only = yaml.safe_load(p.read_text()).get("name") if p.suffix in (".yaml", ".yml") else None
    else:
        folder, only = p, None
    dirs = [*map(Path, hwdb_dirs), folder]
    try:
        db = hwdb.load(dirs)
    except hwdb.HwdbError as exc:
        raise FitInputError(f"--profile {p}: {exc}") from None
    mine = _user_profiles(folder)
    if only:
        mine = {only: mine[only]} if only in mine else {}
    if not mine:
        raise FitInputError(f"{folder} holds no calibration profile (profiles/*.yaml); make one with "
                            f"`epdsim calibrate fit FIT_BUNDLE --out {folder}`.")
    if gpu:
        try:
            gname = db.gpu(gpu).name
        except hwdb.HwdbError as exc:
            raise FitInputError(f"--gpu: {exc}") from None
    elif is_cpu_server(b):
        gname = CPU_GPU
    elif len({v["gpu"] for v in mine.values()}) == 1:
        gname = next(iter(mine.values()))["gpu"]
    else:
        raise FitInputError(f"{folder} has profiles for several GPUs ({sorted({v['gpu'] for v in mine.values()})}) "
                            f"and the bundle does not say which one it ran on; pass --gpu NAME.")
    cands = [n for n, v in mine.items() if v["gpu"] == gname]
    if not cands:
        raise FitInputError(f"{folder} has no profile for GPU {gname} (it has {sorted(mine)}); fit one with "
                            f"`epdsim calibrate fit FIT_BUNDLE --gpu {gname} --out {folder}`.")
    name = max(cands, key=lambda n: mine[n]["created"])
    prof = db.profiles[name]
    winner = db.profile_for(gname, prof.engine)
    if winner is not prof:
        raise FitInputError(f"the simulator would use profile {winner.name!r} (newest for {gname}), not "
                            f"{prof.name!r} from {p}; put the profile to validate alone in a hwdb folder "
                            f"(profiles/{prof.name}.yaml) and pass that folder.")
    report = None
    fit_json = folder / "fits" / f"{name}.json"
    if fit_json.exists():
        report = json.loads(fit_json.read_text())
    return db, db.gpu(gname), prof, dirs, report


# ============================================================================ measured
def _sum_histograms(b: Bundle, phase: str, name: str) -> dict | None:
    """A histogram delta summed over the phase's segments: {count, sum, buckets}."""
    tot = None
    for rec in b.records(phase, "metrics"):
        series = ((rec.get("histograms") or {}).get(name) or [])
        for s in series:
            if tot is None:
                tot = {"count": 0.0, "sum": 0.0, "buckets": [[le, 0.0] for le, _ in s["buckets"]]}
            tot["count"] += s["count"]
            tot["sum"] += s["sum"]
            if [le for le, _ in s["buckets"]] == [le for le, _ in tot["buckets"]]:
                for i, (_, c) in enumerate(s["buckets"]):
                    tot["buckets"][i][1] += c
    return tot


def _bucket_width(q_value: float, buckets: list) -> float:
    prev = 0.0
    for le, _ in buckets:
        le = math.inf if le == "+Inf" else float(le)
        if q_value <= le:
            return le - prev
        prev = le
    return math.inf


def measured_phase(b: Bundle, phase: str) -> tuple[list[dict], dict]:
    """Per-request measurements (sorted by send time) and phase-level notes."""
    recs = [r for r in b.requests(phase) if r.get("t_send") is not None and r.get("prompt_tokens")
            and r.get("output_tokens")]
    recs.sort(key=lambda r: (r["t_send"], str(r["id"])))
    if not recs:
        return [], {}
    t0 = recs[0]["t_send"]
    rows = []
    for r in recs:
        sm = r.get("server_metrics") or {}
        o = int(r["output_tokens"])
        srv_ttft = server_ttft_s(r)
        gen = sm.get("generation_time_ms")
        tt = r.get("token_times_s") or []
        rows.append({
            "id": r["id"], "arrival_s": r["t_send"] - t0, "input_tokens": int(r["prompt_tokens"]), "output_tokens": o,
            "segment": r.get("segment", 0),
            "server_ttft_s": srv_ttft,
            "server_tpot_s": sm["mean_itl_ms"] / 1e3 if sm.get("mean_itl_ms") and o > 1 else None,
            "server_e2e_s": (srv_ttft + gen / 1e3) if srv_ttft is not None and gen is not None else None,
            "client_ttft_s": r.get("ttft_s"), "client_e2e_s": r.get("e2e_s"),
            "client_tpot_s": ((r["e2e_s"] - r["ttft_s"]) / (o - 1)
                              if o > 1 and r.get("e2e_s") is not None and r.get("ttft_s") is not None else None),
            "client_itl_s": [b_ - a_ for a_, b_ in zip(tt, tt[1:])],
        })
    notes = {"segments": len({r["segment"] for r in rows}),
             "itl_hist": _sum_histograms(b, phase, "vllm:inter_token_latency_seconds"),
             "iterations": _sum_histograms(b, phase, "vllm:iteration_tokens_total")}
    return rows, notes


# ============================================================================ simulated
def simulate_phase(rows: list[dict], *, model_ref: str, hwdb_dirs: list[Path], gpu: str, setup, out: Path,
                   phase: str, engine: str | None = None):
    """Replay ``rows`` (arrival, lengths) in the simulator; returns (scenario dict, Results)."""
    from simulator.run import simulate
    from simulator.scenario import ScenarioError, parse_scenario
    trace = out / f"{phase}.trace.jsonl"
    with trace.open("w") as fh:
        for r in rows:
            fh.write(json.dumps({"arrival_s": round(r["arrival_s"], 6), "input_tokens": r["input_tokens"],
                                 "output_tokens": r["output_tokens"]}) + "\n")
    data = {"name": f"replay-{phase}", "description": f"replay of {phase} (epdsim calibrate validate)",
            "model": model_ref, "hwdb": [str(d) for d in hwdb_dirs],
            "pools": [{"name": "main", "gpu": gpu, "tp": setup.tp, "pp": setup.pp, "dtype": setup.dtype,
                       "engine": {**({"engine": engine} if engine else {}), **setup.engine_config()}}],
            "workload": {"arrival": {"kind": "trace", "path": str(trace), "format": "plain"}}}
    (out / f"{phase}.scenario.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    try:
        scn = parse_scenario(data, f"replay of {phase}")
        res = simulate(scn)
    except ScenarioError as exc:
        raise FitInputError(f"cannot replay {phase} in the simulator: {exc}") from None
    return data, res


def predicted_phase(res, rows: list[dict], frontend_s: float | None) -> dict:
    """Per-request simulator times aligned with ``rows`` (same order: the trace's)."""
    req = res.requests.sort_values("request_id")
    steps = res.steps.sort_values("start_s")
    starts = steps["start_s"].to_numpy()
    arr = req["arrival_s"].to_numpy()
    first = req["first_token_s"].to_numpy()
    fin = req["finish_s"].to_numpy()
    idx = np.searchsorted(starts, arr - 1e-12, side="left")
    pickup = np.where(idx < len(starts), starts[np.minimum(idx, len(starts) - 1)], arr)
    fe = frontend_s or 0.0
    return {"server_ttft_s": first - pickup, "server_tpot_s": req["tpot_s"].to_numpy(),
            "server_e2e_s": fin - pickup,
            "client_ttft_s": req["ttft_s"].to_numpy() + fe, "client_e2e_s": req["e2e_s"].to_numpy() + fe,
            "client_tpot_s": req["tpot_s"].to_numpy(),
            "completed": int((req["outcome"] == "completed").sum()), "n": len(req),
            "itl": res.summary["itl_s"]}


# ============================================================================ comparison
def _pct(x, p) -> float:
    x = np.asarray([v for v in x if v is not None and np.isfinite(v)], dtype=float)
    return float(np.percentile(x, p)) if len(x) else math.nan


def _row(metric, stat, source, meas, pred, tol, check=True, note=""):
    err = pred / meas - 1.0 if meas and np.isfinite(meas) and np.isfinite(pred) and meas > 0 else math.nan
    ok = None if not check or not np.isfinite(err) else bool(abs(err) <= tol)
    return {"metric": metric, "stat": stat, "source": source, "measured_s": meas, "predicted_s": pred,
            "rel_error": err, "check": bool(check and np.isfinite(err)), "passed": ok, "note": note}


def compare(rows: list[dict], pred: dict, notes: dict, tol: float) -> list[dict]:
    out = []
    for m in ("ttft", "tpot", "e2e"):
        key = f"server_{m}_s"
        meas = [r[key] for r in rows]
        have = sum(v is not None for v in meas)
        if have >= 0.9 * len(rows) and have:
            pv = [p for p, v in zip(pred[key], meas) if v is not None]
            for p in PCTS:
                out.append(_row(LABEL[m], f"p{p}", "server", _pct(meas, p), _pct(pv, p), tol))
            out.append(_row(LABEL[m], "mean", "server", float(np.nanmean([v for v in meas if v is not None])),
                            float(np.nanmean(pv)), tol, check=False))
    h = notes.get("itl_hist")
    it = pred["itl"]
    if h and h["count"] > 0:
        out.append(_row("ITL", "mean", "server histogram", h["sum"] / h["count"], it["mean"], tol))
        for p in PCTS:
            q = histogram_quantile(p / 100.0, h["buckets"])
            w = _bucket_width(q, h["buckets"])
            resolved = np.isfinite(q) and w <= 2 * tol * q
            out.append(_row("ITL", f"p{p}", "server histogram", q, it[f"p{p}"], tol, check=resolved,
                            note="" if resolved else f"unresolved ({w * 1e3:g} ms bucket)"))
    # client side: information
    for m in ("ttft", "e2e", "tpot"):
        key = f"client_{m}_s"
        meas = [r[key] for r in rows]
        if any(v is not None for v in meas):
            pv = [p for p, v in zip(pred[key], meas) if v is not None]
            for p in PCTS:
                out.append(_row(LABEL[m], f"p{p}", "client", _pct(meas, p), _pct(pv, p), tol, check=False,
                                note="info (+ front end)" if m in ("ttft", "e2e") else ""))
    itl_c = [g for r in rows for g in r["client_itl_s"]]
    if itl_c:
        for p in PCTS:
            out.append(_row("ITL", f"p{p}", "client", _pct(itl_c, p), it[f"p{p}"], tol, check=False,
                            note="info (lumped)"))
    return out


# ============================================================================ the command
def validate(bundle: str | Path, profile: str | Path, *, tolerance: float = 0.25, out: str | Path | None = None,
             phases: list[str] | None = None, gpu: str | None = None, model: str | None = None,
             overrides: dict | None = None, hwdb_dirs: tuple[str, ...] = ()) -> dict:
    """Validate ``profile`` on ``bundle``'s load tests; writes the report and returns its data."""
    if not (0 < tolerance < 10):
        raise FitInputError(f"--tolerance {tolerance}: give a relative error such as 0.25 (25%)")
    b = open_bundle(bundle)
    db, g, prof, dirs, fit = resolve_profile(b, profile, gpu, hwdb_dirs)
    entry = bundle_model(b, model, db)
    setup = engine_setup(b, overrides)
    out = Path(out) if out else b.path / "validation"
    out.mkdir(parents=True, exist_ok=True)
    mdir = out / "model"
    mdir.mkdir(exist_ok=True)
    (mdir / "config.json").write_text(json.dumps(entry.config, indent=2) + "\n")
    (mdir / "epdsim.yaml").write_text(yaml.safe_dump({"name": entry.name, "source": entry.sidecar.source}))
    loads = [p for p in b.manifest["plan"] if p["kind"] == "load"]
    if phases:
        unknown = [p for p in phases if p not in {q["name"] for q in loads}]
        if unknown:
            raise FitInputError(f"--phases: {', '.join(unknown)} not among the bundle's load tests "
                                f"({', '.join(q['name'] for q in loads) or 'none'})")
        loads = [p for p in loads if p["name"] in phases]
    frontend = (fit or {}).get("frontend_s")
    engine_name = (fit or {}).get("engine_name") or (prof.name if prof.name in db.engines else None)
    results = []
    for ph in loads:
        rows, notes = measured_phase(b, ph["name"])
        if not rows:
            continue
        scen, res = simulate_phase(rows, model_ref=str(mdir), hwdb_dirs=dirs, gpu=g.name, setup=setup, out=out,
                                   phase=ph["name"], engine=engine_name)
        pred = predicted_phase(res, rows, frontend)
        cmp_rows = compare(rows, pred, notes, tolerance)
        checks = [r for r in cmp_rows if r["check"]]
        it = notes.get("iterations")
        results.append({
            "phase": ph["name"], "mode": ph.get("mode"), "rate": ph.get("rate"),
            "concurrency": ph.get("concurrency"), "requests": len(rows), "segments": notes.get("segments"),
            "prompt_tokens": [min(r["input_tokens"] for r in rows), max(r["input_tokens"] for r in rows)],
            "output_tokens": [min(r["output_tokens"] for r in rows), max(r["output_tokens"] for r in rows)],
            "simulated_completed": pred["completed"],
            "engine_steps": {"measured": it["count"] if it else None, "simulated": int(len(res.steps))},
            "rows": cmp_rows, "checks": len(checks), "failed": sum(1 for r in checks if not r["passed"]),
            "passed": all(r["passed"] for r in checks),
            "scenario": f"{ph['name']}.scenario.yaml",
            "series": {"arrival_s": [r["arrival_s"] for r in rows],
                       "measured_ttft_s": [r["server_ttft_s"] for r in rows],
                       "predicted_ttft_s": pred["server_ttft_s"].tolist(),
                       "measured_tpot_s": [r["server_tpot_s"] for r in rows],
                       "predicted_tpot_s": [None if not np.isfinite(x) else float(x) for x in pred["server_tpot_s"]],
                       "measured_e2e_s": [r["server_e2e_s"] for r in rows],
                       "predicted_e2e_s": pred["server_e2e_s"].tolist()},
        })
    if not results:
        raise FitInputError(f"{b.path}: no completed load test to validate against (phases of kind 'load'); "
                            f"measure one with `epdsim calibrate run --out DIR --phases load --load-rates R ...`.")
    m = b.manifest
    data = {"bundle": str(b.path.resolve()), "bundle_created": m.get("created"),
            "vllm": (m.get("versions") or {}).get("vllm"), "model": entry.name, "gpu": g.name,
            "profile": {"name": prof.name, "created": prof.created, "source": prof.source,
                        "step_overhead_s": prof.step_overhead_s,
                        "compute_efficiency": prof.compute_efficiency.model_dump() if prof.compute_efficiency else None,
                        "attention_prefill_efficiency": (prof.attention_prefill_efficiency.model_dump()
                                                         if prof.attention_prefill_efficiency else None),
                        "memory_efficiency": prof.memory_efficiency.model_dump() if prof.memory_efficiency else None,
                        "fit_bundle": (fit or {}).get("provenance", {}).get("bundle"),
                        "host_cost": _host_cost(db, engine_name)},
            "frontend_s": frontend, "tolerance": tolerance, "engine": setup.as_dict(), "engine_profile": engine_name,
            "phases": results, "passed": all(r["passed"] for r in results),
            "checks": sum(r["checks"] for r in results), "failed": sum(r["failed"] for r in results)}
    (out / "validation.json").write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    (out / "report.md").write_text(markdown_report(data))
    (out / "report.html").write_text(html_report(data))
    data["out"] = str(out)
    return data


def _host_cost(db: hwdb.HardwareDB, engine_name: str | None) -> dict | None:
    """The calibrated engine's host cost per step (when the fit put it there)."""
    e = db.engines.get(engine_name) if engine_name else None
    cpu = getattr(e, "cpu", None)
    if cpu is None:
        return None
    return {"engine": engine_name, "step_s": cpu.step_s.value, "per_sampled_seq_s": cpu.per_sampled_seq_s.value}


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o).__name__)


def _ms(x) -> str:
    if x is None or not np.isfinite(x):
        return "-"
    return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.3f} s"


def _err(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:+.1%}"


def _verdict(r) -> str:
    if r["passed"] is None:
        return "info" if not r["note"] else r["note"]
    return "pass" if r["passed"] else "FAIL"


def markdown_report(d: dict) -> str:
    p = d["profile"]
    lines = [f"# Validation of profile `{p['name']}`", "",
             f"- bundle: `{d['bundle']}` (measured {d['bundle_created']}, vLLM {d['vllm']})",
             f"- model `{d['model']}` on `{d['gpu']}`; profile fitted to `{p.get('fit_bundle')}`",
             f"- profile: compute max_eff {_f(p, 'compute_efficiency', 'max_eff')}, half "
             f"{_f(p, 'compute_efficiency', 'half')} tokens; attention max_eff "
             f"{_f(p, 'attention_prefill_efficiency', 'max_eff')}; memory max_eff "
             f"{_f(p, 'memory_efficiency', 'max_eff')}; " + (
                 f"host cost per step {_ms(p['host_cost']['step_s'])} + {_ms(p['host_cost']['per_sampled_seq_s'])} "
                 f"per sequence (engine `{p['host_cost']['engine']}`)" if p.get("host_cost")
                 else f"step overhead {_ms(p['step_overhead_s'])}"),
             "- engine: " + ", ".join(f"{k}={v}" for k, v in d["engine"].items()
                                      if k not in ("sources",) and v is not None),
             f"- tolerance: |predicted / measured - 1| <= {d['tolerance']:.0%}; front end added to client-side "
             f"predictions: {_ms(d['frontend_s'])}",
             f"- **verdict: {d['checks'] - d['failed']} of {d['checks']} checks pass**", ""]
    for ph in d["phases"]:
        how = (f"Poisson {ph['rate']:g} req/s" if ph.get("rate") else
               f"closed loop, {ph.get('concurrency')} users" if ph.get("concurrency") else ph.get("mode"))
        lines += [f"## {ph['phase']}", "",
                  f"{ph['requests']} requests, {how}, prompts {ph['prompt_tokens'][0]}-{ph['prompt_tokens'][1]} "
                  f"tokens, outputs {ph['output_tokens'][0]}-{ph['output_tokens'][1]} tokens; the simulator "
                  f"completed {ph['simulated_completed']}; engine steps measured {ph['engine_steps']['measured']}, "
                  f"simulated {ph['engine_steps']['simulated']}. "
                  f"**{ph['checks'] - ph['failed']} of {ph['checks']} checks pass.**", "",
                  "| metric | stat | measured (source) | predicted | error | verdict |",
                  "|---|---|---|---|---|---|"]
        for r in ph["rows"]:
            lines.append(f"| {r['metric']} | {r['stat']} | {_ms(r['measured_s'])} ({r['source']}) | "
                         f"{_ms(r['predicted_s'])} | {_err(r['rel_error'])} | {_verdict(r)} |")
        lines.append("")
    lines += ["Server-side times start when the engine takes the request (between steps); the simulator's are "
              "taken from the first step at or after the arrival. Client-side rows are information: the "
              "client, the API server and the engine share the host's cores.", ""]
    return "\n".join(lines)


def _f(p, curve, key) -> str:
    c = p.get(curve)
    return "default" if not c else f"{c[key]:.4g}"


def html_report(d: dict) -> str:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    parts = [f"<html><head><meta charset='utf-8'><title>Validation {d['profile']['name']}</title>"
             "<style>body{font-family:sans-serif;margin:2em} table{border-collapse:collapse} "
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right} .FAIL{color:#b00;font-weight:bold} "
             ".pass{color:#070}</style></head><body>",
             f"<h1>Validation of profile {d['profile']['name']}</h1>",
             f"<p>bundle {d['bundle']}; model {d['model']} on {d['gpu']}; tolerance {d['tolerance']:.0%}; "
             f"<b>{d['checks'] - d['failed']} of {d['checks']} checks pass</b>.</p>"]
    first = True
    for ph in d["phases"]:
        parts.append(f"<h2>{ph['phase']}</h2><table><tr><th>metric</th><th>stat</th><th>source</th>"
                     "<th>measured</th><th>predicted</th><th>error</th><th>verdict</th></tr>")
        for r in ph["rows"]:
            v = _verdict(r)
            parts.append(f"<tr><td>{r['metric']}</td><td>{r['stat']}</td><td>{r['source']}</td>"
                         f"<td>{_ms(r['measured_s'])}</td><td>{_ms(r['predicted_s'])}</td>"
                         f"<td>{_err(r['rel_error'])}</td><td class='{v}'>{v}</td></tr>")
        parts.append("</table>")
        s = ph["series"]
        fig = make_subplots(rows=2, cols=2, subplot_titles=(
            "relative error (server-side checks)", "TTFT per request vs arrival", "TTFT CDF", "TPOT CDF"))
        chk = [r for r in ph["rows"] if r["source"] != "client" and np.isfinite(r["rel_error"])]
        fig.add_trace(go.Bar(x=[f"{r['metric']} {r['stat']}" for r in chk], y=[100 * r["rel_error"] for r in chk],
                             marker_color=["#2a7" if r["passed"] else ("#c33" if r["passed"] is False else "#999")
                                           for r in chk], name="error %", showlegend=False), 1, 1)
        for sign in (1, -1):
            fig.add_hline(y=100 * sign * d["tolerance"], line_dash="dot", line_color="#888", row=1, col=1)
        fig.add_trace(go.Scatter(x=s["arrival_s"], y=[_msv(v) for v in s["measured_ttft_s"]], mode="markers",
                                 name="measured TTFT", marker_color="#1f77b4"), 1, 2)
        fig.add_trace(go.Scatter(x=s["arrival_s"], y=[_msv(v) for v in s["predicted_ttft_s"]], mode="markers",
                                 name="predicted TTFT", marker_color="#ff7f0e", marker_symbol="x"), 1, 2)
        for key, col, name in (("ttft", 1, "TTFT"), ("tpot", 2, "TPOT")):
            for who, color in (("measured", "#1f77b4"), ("predicted", "#ff7f0e")):
                v = np.sort([x for x in s[f"{who}_{key}_s"] if x is not None and np.isfinite(x)]) * 1e3
                fig.add_trace(go.Scatter(x=v, y=np.arange(1, len(v) + 1) / max(len(v), 1), mode="lines",
                                         line_shape="hv", line_color=color, name=f"{who} {name}",
                                         showlegend=False), 2, col)
        fig.update_yaxes(title_text="%", row=1, col=1)
        fig.update_xaxes(title_text="arrival (s)", row=1, col=2)
        fig.update_yaxes(title_text="ms", row=1, col=2)
        fig.update_xaxes(title_text="ms", row=2, col=1)
        fig.update_xaxes(title_text="ms", row=2, col=2)
        fig.update_layout(height=750, title_text=f"{ph['phase']}: measured (blue) vs predicted (orange)")
        parts.append(fig.to_html(full_html=False, include_plotlyjs=True if first else False))
        first = False
    parts.append("</body></html>")
    return "\n".join(parts)


def _msv(v):
    return None if v is None or not np.isfinite(v) else v * 1e3


def cmd_validate(a, con) -> int:
    from rich.markup import escape
    from rich.table import Table
    overrides = {"max_num_seqs": a.max_num_seqs, "max_num_batched_tokens": a.max_num_batched_tokens,
                 "block_size": a.block_size}
    d = validate(a.bundle, a.profile, tolerance=a.tolerance, out=a.out,
                 phases=[p for p in (a.phases or "").split(",") if p.strip()] or None, gpu=a.gpu, model=a.model,
                 overrides=overrides, hwdb_dirs=tuple(a.hwdb))
    for ph in d["phases"]:
        t = Table(title=f"{ph['phase']}: {ph['requests']} requests, {ph['checks'] - ph['failed']}/{ph['checks']} "
                        f"checks within {d['tolerance']:.0%}")
        for c in ("metric", "stat", "source", "measured", "predicted", "error", "verdict"):
            t.add_column(c, justify="right" if c in ("measured", "predicted", "error") else "left")
        for r in ph["rows"]:
            v = _verdict(r)
            t.add_row(r["metric"], r["stat"], r["source"], _ms(r["measured_s"]), _ms(r["predicted_s"]),
                      _err(r["rel_error"]), f"[red]{v}[/]" if v == "FAIL" else escape(v))
        con.print(t)
    con.print(f"{d['checks'] - d['failed']} of {d['checks']} checks pass; report: {d['out']}/report.md, "
              f"{d['out']}/report.html")
    return 1 if a.strict and not d["passed"] else 0
