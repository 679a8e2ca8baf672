"""Charts of the tools beside simulation: the planner, the cold-start model, calibration (pure functions
from DataFrames to Plotly figures, as :mod:`app.charts`).

:func:`pareto_figure`: the planner's candidates, cost vs goodput, with the Pareto front;
:func:`coldstart_figure` and :func:`attempts_figure`: a pod's start-up phases and its container attempts
(seconds); :func:`predicted_vs_measured_figure`: a calibration's predictions against measurements
(seconds in the data, shown in milliseconds).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from app.charts import base_figure

AXIS_TITLES = {
    "cost_usd_per_hour": "cost ($/h)",
    "goodput_rps": "goodput (req/s meeting the SLO)",
    "cost_usd_per_million_tokens": "cost ($ per M output tokens)",
    "gpus": "GPUs",
    "ttft_s": "TTFT (s)",
    "tpot_s": "TPOT (s)",
}


def pareto_figure(
    candidates: pd.DataFrame,
    pareto: pd.DataFrame,
    x: str,
    y: str,
    recommended: dict | None = None,
    label: str | None = None,
    target_rate: float | None = None,
) -> go.Figure:
    """Cost vs goodput of every candidate, the Pareto front as a line, the recommendation marked, and the
    target rate as a horizontal line when the y axis is the goodput."""
    fig = base_figure("Cost vs goodput", AXIS_TITLES.get(x, x), AXIS_TITLES.get(y, y))
    text = candidates[label].astype(str) if label and label in candidates else None
    # A hover text column (e.g. the latencies with their model error band) replaces the label's hover.
    tip = dict(hovertemplate="%{text}<extra></extra>") if label and label.startswith("hover") else {}
    fig.add_trace(
        go.Scatter(
            x=candidates[x],
            y=candidates[y],
            mode="markers",
            name="candidates",
            text=text,
            marker=dict(size=7, color="lightgray", line=dict(width=1, color="gray")),
            **tip,
        )
    )
    p = pareto.sort_values(x)
    fig.add_trace(
        go.Scatter(
            x=p[x],
            y=p[y],
            mode="lines+markers",
            name="Pareto front",
            text=p[label].astype(str) if label and label in p else None,
            **tip,
        )
    )
    if recommended and x in recommended and y in recommended:
        fig.add_trace(
            go.Scatter(
                x=[recommended[x]],
                y=[recommended[y]],
                mode="markers",
                name="recommended",
                marker=dict(size=16, symbol="star", color="crimson"),
            )
        )
    if target_rate and y == "goodput_rps":
        fig.add_hline(
            y=target_rate,
            line_dash="dash",
            line_color="crimson",
            annotation_text=f"target {target_rate:g} req/s",
            annotation_position="bottom right",
        )
    fig.update_layout(showlegend=True)
    return fig


def coldstart_figure(phases: pd.DataFrame, title: str = "Cold start") -> go.Figure:
    """Horizontal stacked bar of start-up phases (columns: case, label, seconds), one bar per case."""
    fig = base_figure(title, "seconds", "")
    cases = list(dict.fromkeys(phases["case"]))
    for label in dict.fromkeys(phases["label"]):
        xs = [float(phases[(phases["label"] == label) & (phases["case"] == c)]["seconds"].sum()) for c in cases]
        fig.add_trace(go.Bar(y=cases, x=xs, name=label, orientation="h"))
    # the legend goes above the plot: below it, it covered the x-axis title
    fig.update_layout(
        barmode="stack",
        height=300,
        showlegend=True,
        legend=dict(orientation="h", x=0, y=1.02, yanchor="bottom"),
        margin=dict(l=50, r=20, t=80, b=45),
    )
    return fig


def attempts_figure(attempts: pd.DataFrame, horizon_s: float) -> go.Figure:
    """A pod's container attempts as bars on a time line, coloured by outcome."""
    fig = base_figure("Container attempts", "seconds since pod creation", "attempt")
    colours = {"serving": "seagreen", "killed": "crimson", "running": "gray"}
    for outcome, g in attempts.groupby("outcome", sort=False):
        fig.add_trace(
            go.Bar(
                y=g["attempt"].astype(str),
                x=g["end_s"] - g["start_s"],
                base=g["start_s"],
                orientation="h",
                name=str(outcome),
                marker_color=colours.get(str(outcome), "steelblue"),
            )
        )
    fig.update_xaxes(range=[0, horizon_s])
    # one outcome only would hide Plotly's legend: keep it, it says what the colour means
    fig.update_layout(
        height=300,
        showlegend=True,
        legend=dict(orientation="h", x=0, y=1.02, yanchor="bottom", title_text="outcome"),
        margin=dict(l=50, r=20, t=80, b=45),
    )
    return fig


def predicted_vs_measured_figure(df: pd.DataFrame, metric: str) -> go.Figure:
    """Measured and predicted values per request (columns: phase, measured, predicted) with y = x."""
    fig = base_figure(f"{metric}: predicted vs measured", "measured (ms)", "predicted (ms)")
    for ph, g in df.groupby("phase", sort=False):
        fig.add_trace(
            go.Scatter(
                x=g["measured"] * 1e3,
                y=g["predicted"] * 1e3,
                mode="markers",
                name=str(ph),
                marker=dict(size=5, opacity=0.6),
            )
        )
    if len(df):
        hi = float(max(df["measured"].max(), df["predicted"].max())) * 1e3
        fig.add_trace(
            go.Scatter(x=[0, hi], y=[0, hi], mode="lines", name="y = x", line=dict(dash="dash", color="gray"))
        )
    return fig
