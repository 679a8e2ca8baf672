"""Start-up phases of measured launches -> a cold-start coefficient override (``coldstart/*.yaml``).

A bundle's ``manifest.json`` keeps, for every server the harness launched, the start-up phases
that :func:`calibration.harness.startup_log.parse_startup_log` read from the vLLM log (``launches[i]
.startup``: events with ``t`` = seconds since launch, and a summary).  This module turns them
into per-phase durations and writes a ``kind: startup`` set (:class:`hwdb.coldstart.
StartupCoefficients`) into ``<hwdb>/coldstart/``, where :func:`hwdb.coldstart.load_coldstart`
finds it and ``simulator.ops.coldstart.breakdown(dep, engine=NAME, db=load_coldstart([hwdb]))``
uses it.

Phases (seconds), from the log events:

* ``process_start``: launch -> weights start loading (``weights_loaded_t - weights_load_s``):
  imports, config, tokenizer, engine-core process, model construction;
* ``weights_page_cache``: vLLM's "Loading weights took" (``loader_Bps`` = checkpoint bytes / it;
  the harness' model is on local disk, in the page cache after the first run);
* ``dynamo`` / ``compile_*`` / ``cuda_graphs``: vLLM's own durations when the log has them
  (not in ``--enforce-eager`` runs: then they are kept from the base set and marked so);
* ``kv_profile``: weights loaded -> "init engine ... took" line (profile run, KV-cache
  allocation, warm-up) minus the Dynamo/compile/capture seconds inside that span;
* ``api_ready``: engine ready -> the harness saw the API answer (``ready_s - engine_init_t``).

One model size gives one row per launch, so every layer-proportional formula degenerates to a
constant: the constant goes into the intercept, the per-layer slope is set to 0, and the notes
say so.  Coefficients not measured are copied from the base set (``vllm-v1``) and listed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
from pathlib import Path

import yaml

from hwdb.coldstart import load_coldstart
from hwdb.hf_config import arch_from_config


class StartupFitError(ValueError):
    pass


def launch_phases(startup: dict, ready_s: float | None = None) -> dict[str, float]:
    """Per-phase durations (s) of one launch's parsed start-up (``{"events", "summary"}``)."""
    s = dict(startup.get("summary") or {})
    ready = ready_s if ready_s is not None else s.get("ready_s")
    out: dict[str, float] = {}
    w_t, w_s = s.get("weights_loaded_t"), s.get("weights_load_s")
    if w_t is not None and w_s is not None:
        out["process_start"] = w_t - w_s
        out["weights_load"] = w_s
    elif s.get("model_load_start_t") is not None:
        out["process_start"] = s["model_load_start_t"]
    for k_in, k_out in (
        ("dynamo_transform_s", "dynamo"),
        ("graph_compile_s", "compile"),
        ("cuda_graph_capture_s", "cuda_graphs"),
    ):
        if s.get(k_in) is not None:
            out[k_out] = s[k_in]
    if s.get("torch_compile_s") is not None and "compile" not in out:
        out["compile"] = max(0.0, s["torch_compile_s"] - out.get("dynamo", 0.0))
    end = s.get("engine_init_t")
    if end is not None and w_t is not None:
        inner = sum(out.get(k, 0.0) for k in ("dynamo", "compile", "cuda_graphs"))
        out["kv_profile"] = max(0.0, end - w_t - inner)
    if ready is not None and end is not None:
        out["api_ready"] = ready - end
    if ready is not None:
        out["total"] = ready
    return {k: round(v, 4) for k, v in out.items()}


def bundle_launches(path: str | Path) -> tuple[dict, list[dict]]:
    """(manifest, rows): one row per launch with parsed start-up phases."""
    path = Path(path)
    mf = json.loads((path / "manifest.json").read_text())
    rows: list[dict] = []
    for ln in mf.get("launches") or []:
        st = ln.get("startup")
        if not st:
            continue
        ph = launch_phases(st, ln.get("ready_s"))
        rows.append(
            {
                "row": f"{path.name}#{ln.get('index', len(rows))}",
                "phases": ph,
                "vllm_version": ln.get("vllm_version") or st.get("summary", {}).get("vllm_version"),
                "args": next((e.get("text") for e in st.get("events", []) if e.get("phase") == "engine_args"), None),
            }
        )
    return mf, rows


def _const_fit(
    formula: str, coef: dict, rows: list[tuple[str, float]], data: str, notes: str | None = None
) -> tuple[dict, float]:
    """(the fit's document, the mean): ``rows`` fitted by a constant, the coefficients left None set to it."""
    vals = [v for _, v in rows]
    mean = sum(vals) / len(vals)
    res = [(r, v, mean, v - mean) for r, v in rows]
    d = {
        "formula": formula,
        "coefficients": {k: (round(mean, 6) if v is None else v) for k, v in coef.items()},
        "data": data,
        "method": f"mean of {len(vals)} launch(es) (least squares on a constant)",
        "rows": [
            {"row": r, "observed_s": round(v, 4), "predicted_s": round(p, 4), "residual_s": round(e, 4)}
            for r, v, p, e in res
        ],
        "rms_s": round(math.sqrt(sum(e * e for *_, e in res) / len(res)), 4),
        "max_abs_s": round(max(abs(e) for *_, e in res), 4),
    }
    if notes:
        d["notes"] = notes
    return d, mean


def fit_startup(bundles: list[str | Path], *, base: str = "vllm-v1", name: str | None = None, user_dirs=()) -> dict:
    """A ``kind: startup`` document (a dict ready for YAML) fitted to the launches of ``bundles``."""
    rows: list[dict] = []
    mf0: dict = {}  # the first non-empty manifest
    for b in bundles:
        mf, r = bundle_launches(b)
        mf0 = mf0 or mf
        rows += [dict(x, bundle=str(Path(b).resolve())) for x in r]
    if not rows:
        raise StartupFitError(
            f"no launch with parsed start-up phases in {', '.join(map(str, bundles))} "
            f"(attach-mode bundles have none: launch the server with the harness)"
        )
    basec = load_coldstart(user_dirs).coefficients(base)
    doc = json.loads(basec.model_dump_json(exclude_none=True))
    model = mf0.get("model") or {}
    cfg = model.get("config")
    arch = arch_from_config(cfg, model.get("served_name") or "model") if cfg else None
    ckpt_bytes = arch.total_params * 2.0 if arch else None
    layers = arch.num_layers if arch else None
    version = rows[0]["vllm_version"] or "unknown"
    hw = (mf0.get("hardware") or {}).get("server") or {}
    host = hw.get("hostname") or "host"
    gpus = hw.get("gpus") or []
    kind = "gpu" if gpus else "cpu"
    name = name or f"vllm-{version}-{kind}-{host}"
    today = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d")
    prov = f"{', '.join(sorted({r['bundle'] for r in rows}))} (fitted {today} by calibration.fit.startup)"

    def pr(key):
        return [(r["row"], r["phases"][key]) for r in rows if key in r["phases"]]

    fits = dict(doc["fits"])
    measured, kept, unmapped = [], [], []
    for key, phase, formula, coef, data in (
        (
            "process_start",
            "process_start",
            "seconds",
            {"seconds": None},
            "launch -> weights start loading (weights_loaded_t - weights_load_s)",
        ),
        (
            "api_ready",
            "api_ready",
            "seconds",
            {"seconds": None},
            "engine ready ('init engine ... took' line) -> API answered (harness ready_s)",
        ),
    ):
        if pr(key):
            fits[phase], _ = _const_fit(formula, coef, pr(key), data)
            measured.append(phase)
        else:
            unmapped.append(phase)
    if pr("weights_load") and ckpt_bytes:
        wl = pr("weights_load")
        mean = sum(v for _, v in wl) / len(wl)
        res = 0.005  # the log prints the seconds with two decimals
        bps = ckpt_bytes / max(mean, res)
        fits["weights_page_cache"] = {
            "formula": "B / loader_Bps",
            "coefficients": {"loader_Bps": float(f"{bps:.6g}")},
            "data": f"'Loading weights took' of {len(wl)} launch(es); B = {ckpt_bytes:.4g} bytes (params x 2)",
            "method": "B / mean(seconds)",
            "rows": [
                {
                    "row": r,
                    "observed_s": v,
                    "predicted_s": round(ckpt_bytes / bps, 4),
                    "residual_s": round(v - ckpt_bytes / bps, 4),
                }
                for r, v in wl
            ],
            "rms_s": 0.0,
            "max_abs_s": round(max(abs(v - ckpt_bytes / bps) for _, v in wl), 4),
            "notes": (
                f"the log rounds to 0.01 s: {mean:.3f} s for {ckpt_bytes / 1e6:.1f} MB bounds the rate only loosely"
                if mean < 0.5
                else None
            ),
        }
        if fits["weights_page_cache"]["notes"] is None:
            del fits["weights_page_cache"]["notes"]
        measured.append("weights_page_cache")
    else:
        unmapped.append("weights_page_cache")
    per_layer = f"one model ({layers} layers): the per-layer slope is not identifiable; set to 0, intercept = mean"
    if pr("kv_profile"):
        fits["kv_profile"], _ = _const_fit(
            "k0 + (k_miss or k_hit) * L",
            {"k0_s": None, "k_miss_s_per_layer": 0.0, "k_hit_s_per_layer": 0.0},
            pr("kv_profile"),
            "weights loaded -> 'init engine (profile, create kv cache, warmup model) took' line, "
            "minus Dynamo/compile/capture seconds",
            per_layer,
        )
        measured.append("kv_profile")
    else:
        unmapped.append("kv_profile")
    if pr("dynamo"):
        fits["dynamo"], _ = _const_fit(
            "d0 + d1 * L",
            {"d0_s": None, "d1_s_per_layer": 0.0},
            pr("dynamo"),
            "'Dynamo bytecode transform time'",
            per_layer,
        )
        measured.append("dynamo")
    else:
        kept.append("dynamo")
    if pr("compile"):
        fits["compile_miss"], _ = _const_fit(
            "c0 + c1 * L",
            {"c0_s": None, "c1_s_per_layer": 0.0},
            pr("compile"),
            "'Compiling a graph ... takes' (cache state not separated: treated as a miss)",
            per_layer,
        )
        measured.append("compile_miss")
    else:
        kept += ["compile_miss", "compile_hit"]
    if pr("cuda_graphs"):
        fits["cuda_graphs"], _ = _const_fit(
            "g0 + g1 * graphs * L + g2 * sum(sizes) * 2 * params / peak_flops",
            {"g0_s": None, "g1_s_per_graph_layer": 0.0, "g2_passes": 0.0},
            pr("cuda_graphs"),
            "'Graph capturing finished in'",
            "one capture configuration: the size terms are not identifiable",
        )
        measured.append("cuda_graphs")
    else:
        kept.append("cuda_graphs")
    kept += [p for p in ("compile_hit",) if p not in kept and p not in measured]
    eager = all("enforce_eager" in (r["args"] or "") for r in rows)

    notes = [
        f"Measured on {host} ({kind.upper()}{': ' + str(gpus) if gpus else ''}, "
        f"{hw.get('cpu_model', '?')}, {hw.get('cpu_count', '?')} CPUs), vLLM {version}; provenance: {prov}.",
        f"fitted from the launches: {', '.join(measured)}.",
        f"kept from '{basec.name}' (not in these logs{', --enforce-eager' if eager else ''}): "
        f"{', '.join(kept) or 'none'}.",
    ]
    if unmapped:
        notes.append(f"could not be mapped from the logs (kept from '{basec.name}'): {', '.join(unmapped)}.")
    notes.append(
        "the log's 'engine_core_start' and 'model_load_start' events fall inside process_start; "
        "vLLM's 'Model loading took' (GiB, s) is not used (it duplicates the weights time)."
    )
    durations = {r["row"]: r["phases"] for r in rows}
    notes.append("per-launch durations (s): " + json.dumps(durations, sort_keys=True))

    doc.update(
        name=name,
        aliases=[],
        fits=fits,
        engine_version_fitted=f"vLLM {version} ({kind}{', enforce_eager' if eager else ''}); "
        f"phases not measured are those of {basec.engine_version_fitted}",
        notes=" ".join(notes),
        outliers=[],
    )
    if arch:
        doc["profiled_models"] = {
            model.get("served_name") or "model": {
                "hf_id": str(model.get("root") or model.get("served_name")),
                "params": float(arch.total_params),
                "layers": int(arch.num_layers),
                "checkpoint_bytes_per_param": 2.0,
            }
        }
    base_host = next(iter(basec.profiled_hosts.values()))
    doc["profiled_hosts"] = {
        host: {
            "description": f"{hw.get('cpu_model', '?')} x{hw.get('cpu_count', '?')}, "
            f"{(hw.get('memory_bytes') or 0) / 2**30:.0f} GiB, {hw.get('os', '?')}; gpus: {gpus or 'none'}",
            "peak_flops": {
                "value": base_host.peak_flops.value,
                "source": f"not measured; copied from '{basec.name}' host (only the capture term uses it)",
                "empirical": True,
            },
            "source": prov,
        }
    }
    return doc


def write_startup(doc: dict, hwdb_dir: str | Path) -> Path:
    folder = Path(hwdb_dir) / "coldstart"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{doc['name']}.yaml"
    head = (
        "# Start-up coefficients fitted by calibration.fit.startup to measured launches (see notes for provenance).\n"
    )
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False, width=120))
    load_coldstart([hwdb_dir])  # validate: raises on a schema error
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("bundles", nargs="+")
    p.add_argument("--out", required=True, help="hwdb folder (the file goes to OUT/coldstart/)")
    p.add_argument("--name")
    a = p.parse_args(argv)
    doc = fit_startup(a.bundles, name=a.name)
    print(write_startup(doc, a.out))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
