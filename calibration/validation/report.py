"""The reports ``calibrate validate`` writes: ``report.md`` and the self-contained Plotly
``report.html`` (plus the JSON encoder of ``validation.json``)."""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np

from calibration.harness.trace_plan import workload_text


def json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(type(o).__name__)


def fmt_ms(x) -> str:
    if x is None or not np.isfinite(x):
        return "-"
    return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.3f} s"


def rel_err(x) -> str:
    return "-" if x is None or not np.isfinite(x) else f"{x:+.1%}"


def verdict_of(r) -> str:
    if r["passed"] is None:
        return "info" if not r["note"] else r["note"]
    return "pass" if r["passed"] else "FAIL"


def markdown_report(d: dict) -> str:
    p = d["profile"]
    lines = [
        f"# Validation of profile `{p['name']}`",
        "",
        f"- bundle: `{d['bundle']}` (measured {d['bundle_created']}, vLLM {d['vllm']})",
        f"- model `{d['model']}` on `{d['gpu']}`; profile fitted to `{p.get('fit_bundle')}`",
        f"- profile: compute max_eff {_f(p, 'compute_efficiency', 'max_eff')}, half "
        f"{_f(p, 'compute_efficiency', 'half')} tokens; attention max_eff "
        f"{_f(p, 'attention_prefill_efficiency', 'max_eff')}; memory max_eff "
        f"{_f(p, 'memory_efficiency', 'max_eff')}; " + _host_text(d),
        "- engine: " + ", ".join(f"{k}={v}" for k, v in d["engine"].items() if k not in ("sources",) and v is not None),
        f"- tolerance: |predicted / measured - 1| <= {d['tolerance']:.0%} server side"
        + (f", {d['client_tolerance']:.0%} client side (TTFT p50, p90)" if d.get("client_tolerance") else ""),
        "- " + _front_text(d.get("frontend")),
        f"- **verdict: {d['checks'] - d['failed']} of {d['checks']} checks pass**",
        "",
    ]
    for ph in d["phases"]:
        how = workload_text(ph)
        a = ph.get("arrivals") or {}
        if a.get("mean_rate"):
            how += f"; arrivals as sent: mean {a['mean_rate']:.3g} req/s over {a['span_s']:.1f} s" + (
                f", inter-arrival CV {a['cv']:.2f}" if a.get("cv") is not None else ""
            )
        lines += [
            f"## {ph['phase']}",
            "",
            f"{ph['requests']} requests, {how}, prompts {ph['prompt_tokens'][0]}-{ph['prompt_tokens'][1]} "
            f"tokens, outputs {ph['output_tokens'][0]}-{ph['output_tokens'][1]} tokens; the simulator "
            f"completed {ph['simulated_completed']}; engine steps measured {ph['engine_steps']['measured']}, "
            f"simulated {ph['engine_steps']['simulated']} (per-step figures over "
            f"{ph.get('per_step_scope', 'all segments')}). "
            f"**{ph['checks'] - ph['failed']} of {ph['checks']} checks pass.**",
            "",
            "| metric | stat | server: measured | predicted | error | verdict | client: measured | predicted "
            "| error | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for (metric, stat), (srv, cli) in side_by_side(ph["rows"]).items():
            cells = [f"{metric} | {stat}"]
            for r in (srv, cli):
                cells.append(
                    " | ".join(["-"] * 4)
                    if r is None
                    else f"{fmt_ms(r['measured_s'])} | {fmt_ms(r['predicted_s'])} | {rel_err(r['rel_error'])} | "
                    f"{verdict_of(r)}"
                )
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "Server-side times start when the engine takes the request (between steps); the simulator's are "
        "taken from the first step at or after the engine saw the request. Client-side times start when "
        "the client sent it; the simulator's hold the replayed engine's front end (the way in and the "
        "API server's event loop). The client, the API server and the engine share the host's cores.",
        "",
    ]
    return "\n".join(lines)


def side_by_side(rows: list[dict]) -> dict:
    """{(metric, stat): (server row or None, client row or None)} in the rows' order."""
    out: dict = {}
    for r in rows:
        pair = out.setdefault((r["metric"], r["stat"]), [None, None])
        pair[1 if r["source"] == "client" else 0] = r
    return {k: tuple(v) for k, v in out.items()}


def _front_text(fe: dict | None) -> str:
    """The front end the replay used, in words."""
    if not fe:
        return (
            "front end: none fitted (the calibrated engine has none): client-side predictions are the "
            "engine's times from the send; information only"
        )
    text = f"front end (engine `{fe['engine']}`): way in {fmt_ms(fe['frontend_s'])}"
    if fe.get("frontend_s_per_token"):
        text += f" + {fe['frontend_s_per_token'] * 1e6:.3g} us per prompt token"
    if fe.get("serial_s_per_token"):
        text += f" after {fe['serial_s_per_token'] * 1e6:.3g} us per prompt token, one request at a time"
    loop = [fe.get(k, 0.0) for k in ("stream_s_per_output", "stream_s_per_chunk", "stream_s_per_request")]
    return text + (
        f", API server loop {loop[0] * 1e3:.3g} ms per output + {loop[1] * 1e3:.3g} ms per chunk "
        f"streamed + {loop[2] * 1e3:.3g} ms per request's first"
        if any(loop)
        else ", no API server loop"
    )


def _host_text(d: dict) -> str:
    """The host cost the replay used: fitted (profile or calibrated engine) or the engine's defaults."""
    p = d["profile"]
    text = _host_cost_text(d)
    if p.get("prefill_step_overhead_s"):
        text += f"; a step that carries a prompt chunk {fmt_ms(p['prefill_step_overhead_s'])} more"
    return text


def _host_cost_text(d: dict) -> str:
    p = d["profile"]
    if p.get("host_cost"):
        h = p["host_cost"]
        return (
            f"host cost per step {fmt_ms(h['step_s'])} + {fmt_ms(h['per_sampled_seq_s'])} per sequence "
            f"(engine `{h['engine']}`)"
        )
    if p.get("step_overhead_s") is not None:
        return f"step overhead {fmt_ms(p['step_overhead_s'])}"
    h = p.get("default_host_cost")
    head = "**without the fitted host cost**: " if d.get("without_overhead") else "no fitted host cost: "
    if not h:
        return head + "the engine profile's default CPU and launch costs"

    def us(x: float) -> str:
        return f"{x * 1e6:.3g} us"

    return (
        head + f"engine `{h['engine']}` defaults: CPU {us(h['step_s'])} per step + {us(h['per_running_seq_s'])} "
        f"per running, {us(h['per_waiting_seq_s'])} per waiting, {us(h['per_sampled_seq_s'])} per sampled "
        f"sequence + {us(h['per_token_s'])} per token; launch {us(h['eager_launch_s_per_layer'])} per layer "
        f"(eager) or {us(h['graph_launch_s'])} per step (graphs); "
        + ("overlapped with the device time" if h["scheduling_overlapped"] else "added to the device time")
    )


def _f(p, curve, key) -> str:
    c = p.get(curve)
    return "default" if not c else f"{c[key]:.4g}"


def html_report(d: dict) -> str:
    import plotly.graph_objects as go  # noqa: PLC0415 - heavy (tests/test_cli_startup.py); only this page draws
    from plotly.subplots import make_subplots  # noqa: PLC0415 - as plotly.graph_objects

    parts = [
        f"<html><head><meta charset='utf-8'><title>Validation {d['profile']['name']}</title>"
        "<style>body{font-family:sans-serif;margin:2em} table{border-collapse:collapse} "
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right} .FAIL{color:#b00;font-weight:bold} "
        ".pass{color:#070}</style></head><body>",
        f"<h1>Validation of profile {d['profile']['name']}</h1>",
        f"<p>bundle {d['bundle']}; model {d['model']} on {d['gpu']}; tolerance {d['tolerance']:.0%}; "
        f"<b>{d['checks'] - d['failed']} of {d['checks']} checks pass</b>.</p>",
    ]
    first = True
    for ph in d["phases"]:
        parts.append(
            f"<h2>{html.escape(ph['phase'])}</h2><p>{html.escape(workload_text(ph))}</p>"
            "<table><tr><th>metric</th><th>stat</th><th>source</th>"
            "<th>measured</th><th>predicted</th><th>error</th><th>verdict</th></tr>"
        )
        for r in ph["rows"]:
            v = verdict_of(r)
            parts.append(
                f"<tr><td>{r['metric']}</td><td>{r['stat']}</td><td>{r['source']}</td>"
                f"<td>{fmt_ms(r['measured_s'])}</td><td>{fmt_ms(r['predicted_s'])}</td>"
                f"<td>{rel_err(r['rel_error'])}</td><td class='{v}'>{v}</td></tr>"
            )
        parts.append("</table>")
        s = ph["series"]
        fig = make_subplots(
            rows=2,
            cols=2,
            subplot_titles=(
                "relative error (server-side checks)",
                "TTFT per request vs arrival",
                "TTFT CDF",
                "TPOT CDF",
            ),
        )
        chk = [r for r in ph["rows"] if r["source"] != "client" and np.isfinite(r["rel_error"])]
        fig.add_trace(
            go.Bar(
                x=[f"{r['metric']} {r['stat']}" for r in chk],
                y=[100 * r["rel_error"] for r in chk],
                marker_color=["#2a7" if r["passed"] else ("#c33" if r["passed"] is False else "#999") for r in chk],
                name="error %",
                showlegend=False,
            ),
            1,
            1,
        )
        for sign in (1, -1):
            fig.add_hline(y=100 * sign * d["tolerance"], line_dash="dot", line_color="#888", row=1, col=1)
        fig.add_trace(
            go.Scatter(
                x=s["arrival_s"],
                y=[_msv(v) for v in s["measured_ttft_s"]],
                mode="markers",
                name="measured TTFT",
                marker_color="#1f77b4",
            ),
            1,
            2,
        )
        fig.add_trace(
            go.Scatter(
                x=s["arrival_s"],
                y=[_msv(v) for v in s["predicted_ttft_s"]],
                mode="markers",
                name="predicted TTFT",
                marker_color="#ff7f0e",
                marker_symbol="x",
            ),
            1,
            2,
        )
        for key, col, name in (("ttft", 1, "TTFT"), ("tpot", 2, "TPOT")):
            for who, color in (("measured", "#1f77b4"), ("predicted", "#ff7f0e")):
                xs = np.sort([x for x in s[f"{who}_{key}_s"] if x is not None and np.isfinite(x)]) * 1e3
                fig.add_trace(
                    go.Scatter(
                        x=xs,
                        y=np.arange(1, len(xs) + 1) / max(len(xs), 1),
                        mode="lines",
                        line_shape="hv",
                        line_color=color,
                        name=f"{who} {name}",
                        showlegend=False,
                    ),
                    2,
                    col,
                )
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
