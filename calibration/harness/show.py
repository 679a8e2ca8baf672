"""A bundle's summary, as ``epdsim calibrate show`` prints it (:func:`show_bundle`) and as data
(:func:`bundle_summary`: ``show --json``, the app's bundle overview).  Times are in seconds; the
console shows them in ms below one second."""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape

from calibration.harness.affinity import cpu_list
from calibration.harness.bundle import Bundle
from calibration.harness.env import server_cores
from calibration.harness.probes import summarize_phase
from simulator.console import wide_tables


def _fmt_s(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def bundle_summary(b: Bundle) -> dict:
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


def show_bundle(b: Bundle, con: Console) -> None:
    """What ``calibrate show`` prints: the bundle, its server host, launches and a table of its phases."""
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
