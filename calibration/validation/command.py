"""Replay a bundle's load tests in the simulator and compare: ``epdsim calibrate validate``.

    epdsim calibrate validate BUNDLE --profile HWDB_DIR [--tolerance 0.25] [--out DIR]

For every load test (``load_*`` phase) of the bundle, the simulator serves the same requests: the
same send times (each request's measured ``t_send``, as a plain trace) and the same prompt and
output lengths, on the bundle's model and GPU with the calibrated profile of ``HWDB_DIR`` and the
server's own engine arguments (max_num_seqs, max_num_batched_tokens, block size, the KV blocks
the server reported, enforce_eager; see :func:`calibration.fit.engine_setup.engine_setup`).

What is compared (``measured`` -> ``predicted``):

* **server-side** (the checks): vLLM's per-request timings (``--enable-per-request-metrics``)
  start when the engine core takes the request off its input queue, between two steps.  So the
  simulator's times are taken from the start of the first step at or after the request's arrival
  ("pickup"): TTFT = queue + prefill (``queue_time_ms + time_to_first_token_ms``) vs
  ``first_token - pickup``; TPOT = ``mean_itl_ms`` vs the simulator's TPOT; E2E = queue + prefill +
  generation vs ``finish - pickup``; ITL mean from the ``vllm:inter_token_latency_seconds``
  histogram delta vs the simulator's step-weighted ITL (the histogram's quantiles only where its
  buckets resolve them: vLLM's first ITL bucket is 0-10 ms);
* **client-side**: the client's TTFT / E2E / TPOT vs the simulator's requests table, which holds the
  front end of the replayed engine (the calibrated engine ``engines/<profile>.yaml`` carries the one
  ``calibrate fit`` found: a delay on the way in, the API server's event loop on the way out;
  :mod:`simulator.engine.frontend`).  With a fitted front end, TTFT p50 and p90 are checks within
  ``client_tolerance``; the other client rows, and all of them without one, are information.  The
  client's ITL comes from the streamed token times, which on a small host arrive in lumps.

Each check passes when ``|predicted / measured - 1| <= tolerance`` (server side).  Written to ``--out``
(default ``BUNDLE/validation``): ``report.md``, ``report.html`` (self-contained Plotly),
``validation.json``, and per phase the replayed trace and scenario.

``validate(..., without_overhead=True)`` (in :func:`cmd_validate`: a true ``without_overhead``
attribute of the parsed arguments) replays with the same fitted efficiencies but without the fitted
host cost: the profile's ``step_overhead_s`` is set to null (and a calibrated engine with fitted host
costs is not used), so the simulator applies the engine profile's own CPU and launch costs
(``vllm-v1``: ``cpu.*``, ``graph_launch_s``, ``eager_launch_s_per_layer``, overlapped scheduling).
That is the reference against which the fitted overhead is judged (docs/validation/cpu.md).

Modules: :mod:`calibration.validation.profile` (the profile to replay, and without its host cost),
:mod:`calibration.validation.replay` (measured requests, replay, comparison rows),
:mod:`calibration.validation.report` (Markdown and HTML); this module runs the phases
(:func:`validate`) and holds the command (:func:`cmd_validate`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import yaml
from rich.markup import escape
from rich.table import Table

import hwdb
from calibration.fit.engine_setup import engine_setup
from calibration.fit.inputs import FitInputError, bundle_model, open_bundle
from calibration.validation.profile import resolve_profile, without_overhead_folder
from calibration.validation.replay import (
    arrival_stats,
    compare,
    measured_phase,
    per_step_scope,
    predicted_phase,
    simulate_phase,
)
from calibration.validation.report import fmt_ms, html_report, json_default, markdown_report, rel_err, verdict_of

#: the engine profile a replayed pool uses when no calibrated engine is named (simulator.scenario.EngineConfig)
DEFAULT_ENGINE = "vllm-v1"


# ============================================================================ the command
def validate(
    bundle: str | Path,
    profile: str | Path,
    *,
    tolerance: float = 0.25,
    out: str | Path | None = None,
    phases: list[str] | None = None,
    gpu: str | None = None,
    model: str | None = None,
    overrides: dict | None = None,
    hwdb_dirs: tuple[str, ...] = (),
    without_overhead: bool = False,
    client_tolerance: float = 0.25,
) -> dict:
    """Validate ``profile`` on ``bundle``'s load tests; writes the report and returns its data.

    ``without_overhead``: the same fitted efficiencies without the fitted host cost (the engine profile's
    default CPU and launch costs apply; see the module docstring)."""
    for flag, tol in (("--tolerance", tolerance), ("--client-tolerance", client_tolerance)):
        if not (0 < tol < 10):
            raise FitInputError(f"{flag} {tol}: give a relative error such as 0.25 (25%)")
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
            raise FitInputError(
                f"--phases: {', '.join(unknown)} not among the bundle's load tests "
                f"({', '.join(q['name'] for q in loads) or 'none'})"
            )
        loads = [p for p in loads if p["name"] in phases]
    engine_name = (fit or {}).get("engine_name") or (prof.name if prof.name in db.engines else None)
    if without_overhead:
        prof = without_overhead_folder(prof, out / "hwdb-without-overhead")
        dirs = [*dirs, out / "hwdb-without-overhead"]
        engine_name = None  # not the calibrated engine with the fitted host costs either
    frontend = _front_end(db, engine_name)
    results = []
    for ph in loads:
        rows, notes = measured_phase(b, ph["name"])
        if not rows:
            continue
        scen, res = simulate_phase(
            rows,
            model_ref=str(mdir),
            hwdb_dirs=dirs,
            gpu=g.name,
            setup=setup,
            out=out,
            phase=ph["name"],
            engine=engine_name,
        )
        pred = predicted_phase(res, rows, notes)
        cmp_rows = compare(rows, pred, notes, tolerance, client_tolerance if frontend else None)
        checks = [r for r in cmp_rows if r["check"]]
        it = notes.get("iterations")
        results.append(
            {
                "phase": ph["name"],
                "mode": ph.get("mode"),
                "rate": ph.get("rate"),
                "workload": ph.get("workload"),
                "arrivals": arrival_stats(rows),
                "concurrency": ph.get("concurrency"),
                "requests": len(rows),
                "segments": notes.get("segments"),
                "prompt_tokens": [min(r["input_tokens"] for r in rows), max(r["input_tokens"] for r in rows)],
                "output_tokens": [min(r["output_tokens"] for r in rows), max(r["output_tokens"] for r in rows)],
                "simulated_completed": pred["completed"],
                "engine_steps": {"measured": it["count"] if it else None, "simulated": pred["steps"]},
                "per_step_scope": per_step_scope(notes),
                "rows": cmp_rows,
                "checks": len(checks),
                "failed": sum(1 for r in checks if not r["passed"]),
                "passed": all(r["passed"] for r in checks),
                "scenario": f"{ph['name']}.scenario.yaml",
                "series": {
                    "arrival_s": [r["arrival_s"] for r in rows],
                    "measured_ttft_s": [r["server_ttft_s"] for r in rows],
                    "predicted_ttft_s": pred["server_ttft_s"].tolist(),
                    "measured_tpot_s": [r["server_tpot_s"] for r in rows],
                    "predicted_tpot_s": [None if not np.isfinite(x) else float(x) for x in pred["server_tpot_s"]],
                    "measured_e2e_s": [r["server_e2e_s"] for r in rows],
                    "predicted_e2e_s": pred["server_e2e_s"].tolist(),
                },
            }
        )
    if not results:
        raise FitInputError(
            f"{b.path}: no completed load test to validate against (phases of kind 'load'); "
            f"measure one with `epdsim calibrate run --out DIR --phases load --load-rates R ...`."
        )
    m = b.manifest
    data = {
        "bundle": str(b.path.resolve()),
        "bundle_created": m.get("created"),
        "vllm": (m.get("versions") or {}).get("vllm"),
        "model": entry.name,
        "gpu": g.name,
        "profile": {
            "name": prof.name,
            "created": prof.created,
            "source": prof.source,
            "step_overhead_s": prof.step_overhead_s,
            "prefill_step_overhead_s": prof.prefill_step_overhead_s,
            "compute_efficiency": prof.compute_efficiency.model_dump() if prof.compute_efficiency else None,
            "attention_prefill_efficiency": (
                prof.attention_prefill_efficiency.model_dump() if prof.attention_prefill_efficiency else None
            ),
            "memory_efficiency": prof.memory_efficiency.model_dump() if prof.memory_efficiency else None,
            "fit_bundle": (fit or {}).get("provenance", {}).get("bundle"),
            "host_cost": _host_cost(db, engine_name),
            "default_host_cost": (
                _default_host_cost(db, DEFAULT_ENGINE) if prof.step_overhead_s is None and engine_name is None else None
            ),
        },
        "without_overhead": without_overhead,
        "frontend": frontend,
        "tolerance": tolerance,
        "client_tolerance": client_tolerance if frontend else None,
        "engine": setup.as_dict(),
        "engine_profile": engine_name,
        "phases": results,
        "passed": all(r["passed"] for r in results),
        "checks": sum(r["checks"] for r in results),
        "failed": sum(r["failed"] for r in results),
    }
    (out / "validation.json").write_text(json.dumps(data, indent=2, default=json_default) + "\n")
    (out / "report.md").write_text(markdown_report(data))
    (out / "report.html").write_text(html_report(data))
    data["out"] = str(out)
    return data


def _front_end(db: hwdb.HardwareDB, engine_name: str | None) -> dict | None:
    """The fitted front end the replay's engine carries (seconds), or None."""
    e = db.engines.get(engine_name) if engine_name else None
    if e is None or e.frontend_s is None:
        return None

    def val(f) -> float:
        return f.value if f is not None else 0.0

    return {
        "engine": engine_name,
        "frontend_s": val(e.frontend_s),
        "frontend_s_per_token": val(e.frontend_s_per_token),
        "serial_s_per_token": val(e.frontend_serial_s_per_token),
        "stream_s_per_output": val(e.frontend_stream_s_per_output),
        "stream_s_per_chunk": val(e.frontend_stream_s_per_chunk),
        "stream_s_per_request": val(e.frontend_stream_s_per_request),
    }


def _host_cost(db: hwdb.HardwareDB, engine_name: str | None) -> dict | None:
    """The calibrated engine's host cost per step (when the fit put it there)."""
    e = db.engines.get(engine_name) if engine_name else None
    cpu = getattr(e, "cpu", None)
    if cpu is None:
        return None
    return {"engine": engine_name, "step_s": cpu.step_s.value, "per_sampled_seq_s": cpu.per_sampled_seq_s.value}


def _default_host_cost(db: hwdb.HardwareDB, engine_name: str) -> dict | None:
    """The engine profile's own host costs, which apply when the profile has no ``step_overhead_s``."""
    e = db.engines.get(engine_name)
    if e is None:
        return None
    c = e.cpu
    return {
        "engine": engine_name,
        "step_s": c.step_s.value,
        "per_running_seq_s": c.per_running_seq_s.value,
        "per_waiting_seq_s": c.per_waiting_seq_s.value,
        "per_token_s": c.per_token_s.value,
        "per_sampled_seq_s": c.per_sampled_seq_s.value,
        "graph_launch_s": e.graph_launch_s.value,
        "eager_launch_s_per_layer": e.eager_launch_s_per_layer.value,
        "scheduling_overlapped": e.scheduling_overlapped,
    }


def cmd_validate(a, con) -> int:
    overrides = {
        "max_num_seqs": a.max_num_seqs,
        "max_num_batched_tokens": a.max_num_batched_tokens,
        "block_size": a.block_size,
    }
    d = validate(
        a.bundle,
        a.profile,
        tolerance=a.tolerance,
        out=a.out,
        phases=[p for p in (a.phases or "").split(",") if p.strip()] or None,
        gpu=a.gpu,
        model=a.model,
        overrides=overrides,
        hwdb_dirs=tuple(a.hwdb),
        without_overhead=getattr(a, "without_overhead", False),
        client_tolerance=getattr(a, "client_tolerance", 0.25),
    )
    if d["without_overhead"]:
        con.print(f"without the fitted host cost: engine {DEFAULT_ENGINE}'s default CPU and launch costs apply")
    for ph in d["phases"]:
        t = Table(
            title=f"{ph['phase']}: {ph['requests']} requests, {ph['checks'] - ph['failed']}/{ph['checks']} "
            f"checks within {d['tolerance']:.0%}"
        )
        for c in ("metric", "stat", "source", "measured", "predicted", "error", "verdict"):
            t.add_column(c, justify="right" if c in ("measured", "predicted", "error") else "left")
        for r in ph["rows"]:
            v = verdict_of(r)
            t.add_row(
                r["metric"],
                r["stat"],
                r["source"],
                fmt_ms(r["measured_s"]),
                fmt_ms(r["predicted_s"]),
                rel_err(r["rel_error"]),
                f"[red]{v}[/]" if v == "FAIL" else escape(v),
            )
        con.print(t)
        if ph["per_step_scope"] != "all segments":
            con.print(
                f"[yellow]{ph['phase']}: per-step figures (ITL histogram, engine steps) over "
                f"{escape(ph['per_step_scope'])}[/]"
            )
    con.print(
        f"{d['checks'] - d['failed']} of {d['checks']} checks pass; report: {d['out']}/report.md, "
        f"{d['out']}/report.html"
    )
    return 1 if a.strict and not d["passed"] else 0
