"""Charts and the HTML report of a sweep (``epdsim sweep --out DIR``, the app's Sweep page).

Pure functions from a sweep's records (:meth:`simulator.sweep.run.SweepResult.frame`) to Plotly figures
and to one self-contained HTML file, styled as the other reports (:mod:`app.report`).  Latencies are
in seconds in the data and shown in milliseconds.
"""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go

from app import charts
from app.report import PLOTLY, STYLE
from simulator import fmt
from simulator.sweep.points import RATE
from simulator.sweep.run import SweepResult

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"))
DASH = {"p50": "dot", "p90": "solid", "p99": "dash"}
# The table's columns: record key -> (header, formatter)
TABLE = {
    "offered_rps": ("offered req/s", lambda x: fmt.number(x)),
    "achieved_rps": ("achieved req/s", lambda x: fmt.number(x)),
    "output_tok_s": ("output tok/s", lambda x: fmt.number(x, 0)),
    **{f"{m}_{p}_s": (f"{lab} {p}", fmt.duration) for m, lab in LATENCIES for p in ("p50", "p90", "p99")},
    "e2e_p90_s": ("E2E p90", fmt.duration),
    "slo_attainment": ("SLO attainment", fmt.percent),
    "goodput_rps": ("goodput req/s", lambda x: fmt.number(x)),
    "cost_usd_per_hour": ("$/h", fmt.usd),
}


def x_axis(result: SweepResult, df: pd.DataFrame) -> tuple[pd.Series, str]:
    """The x values (offered rate for a rate sweep, else the knob's values) and the axis title."""
    if result.knob == RATE:
        return df["offered_rps"], "offered rate (req/s)"
    return df["value"].map(str) if df["value"].map(lambda v: isinstance(v, str)).any() else df["value"], result.knob


def _layout(fig: go.Figure, title: str, x: str, y: str) -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        margin=dict(l=50, r=20, t=50, b=90),
        height=400,
        legend=dict(orientation="h", x=0, y=-0.2, yanchor="top"),
    )
    return fig


def _mark_knee(fig: go.Figure, result: SweepResult) -> None:
    k = result.knee
    if k is None:
        return
    if k.rate_rps is not None:
        fig.add_vline(
            x=k.rate_rps,
            line_dash="dash",
            line_color="crimson",
            annotation_text=f"knee {k.rate_rps:g} req/s",
            annotation_position="top left",
        )
    if k.saturation_rps is not None:
        fig.add_vline(
            x=k.saturation_rps,
            line_dash="dot",
            line_color="grey",
            annotation_text=f"saturates {k.saturation_rps:g}",
            annotation_position="bottom right",
        )


def latency_figure(result: SweepResult) -> go.Figure:
    """TTFT and TPOT p50/p90/p99 (ms, log scale) against the offered rate or the knob, the knee marked."""
    df = result.frame()
    x, title = x_axis(result, df)
    fig = go.Figure()
    for m, lab in LATENCIES:
        for p, dash in DASH.items():
            fig.add_trace(
                go.Scatter(x=x, y=df[f"{m}_{p}_s"] * 1e3, mode="lines+markers", name=f"{lab} {p}", line=dict(dash=dash))
            )
    for target, lab in ((result.slo_ttft_s, "TTFT SLO"), (result.slo_tpot_s, "TPOT SLO")):
        if target:
            fig.add_hline(y=target * 1e3, line_dash="dashdot", line_color="#ff8700", annotation_text=lab)
    _mark_knee(fig, result)
    fig.update_yaxes(type="log")
    return _layout(fig, "Latency percentiles", title, "ms (log scale)")


def throughput_figure(result: SweepResult) -> go.Figure:
    """Achieved throughput and goodput (req/s) against the offered rate (with the offered = achieved line)
    or the knob, the knee marked."""
    df = result.frame()
    x, title = x_axis(result, df)
    fig = go.Figure()
    if result.knob == RATE and len(df):
        top = float(df["offered_rps"].max())
        fig.add_trace(
            go.Scatter(
                x=[0, top], y=[0, top], mode="lines", name="achieved = offered", line=dict(color="#d5dae5", dash="dot")
            )
        )
    fig.add_trace(go.Scatter(x=x, y=df["achieved_rps"], mode="lines+markers", name="achieved req/s"))
    fig.add_trace(go.Scatter(x=x, y=df["goodput_rps"], mode="lines+markers", name="goodput req/s (within SLO)"))
    _mark_knee(fig, result)
    return _layout(fig, "Throughput (steady window)", title, "requests/s")


def figures(result: SweepResult) -> list[go.Figure]:
    return [latency_figure(result), throughput_figure(result)]


def table(result: SweepResult) -> pd.DataFrame:
    """The sweep's table as display text (durations, percentages, dollars as elsewhere); the knee's row
    is marked."""
    df = result.frame()
    out = pd.DataFrame({} if result.knob == RATE else {result.knob: df["value"].map(str)}, index=df.index)
    for key, (head, f) in TABLE.items():
        out[head] = df[key].map(f)
    k = result.knee
    if k is not None:
        out["knee"] = [
            "knee" if v == k.rate_rps else "saturated" if v == k.saturation_rps else "" for v in df["offered_rps"]
        ]
    return out


def sweep_html(result: SweepResult, plotly: str = "inline") -> str:
    """One self-contained HTML file: the knee, both charts and the table."""
    if plotly not in PLOTLY:
        raise ValueError(f"plotly={plotly!r}: choose one of {PLOTLY}")
    divs = [
        charts.for_export(f).to_html(
            full_html=False, include_plotlyjs=(plotly if i == 0 else False), config={"displaylogo": False}
        )
        for i, f in enumerate(figures(result))
    ]
    what = "offered request rate" if result.knob == RATE else html.escape(result.knob)
    body = [
        f"<h1>Sweep of {html.escape(result.name)} over the {what}</h1>",
        f"<p>{len(result.rows)} of {result.planned} points.</p>",
    ]
    if result.knee is not None:
        body.append(f"<p><b>{html.escape(result.knee.text())}</b></p>")
    body += [f"<p>note: {html.escape(n)}</p>" for n in result.notes]
    body += ["<div class='grid'>", *divs, "</div>", table(result).to_html(index=False)]
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>epdsim sweep {html.escape(result.name)}</title>"
        f"<style>{STYLE}</style></head><body>" + "".join(body) + "</body></html>"
    )
