"""Charts: pure functions from DataFrames to Plotly figures (no Streamlit, no simulation).

Here the charts of simulation results (one run's, by :func:`results_figures`, and comparisons of runs),
the figure they all start from (:func:`base_figure`) and the export styling; the planner's, the
cold-start model's and calibration's charts are :mod:`app.tool_charts`.  Times are in seconds in the data
and shown in milliseconds where that reads better.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import plotly.graph_objects as go

from app.services import opsviews, views

if TYPE_CHECKING:
    from simulator.engine.results import Results

LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
# Streamlit's categorical chart colours (light theme), so that a report's series look as on the page.
PALETTE = ("#0068c9", "#83c9ff", "#ff2b2b", "#ffabab", "#29b09d", "#7defa1", "#ff8700", "#ffd16a", "#6d3fc0", "#d5dae5")
_GRID = dict(gridcolor="#e6eaf1", zerolinecolor="#d5dae5", linecolor="#d5dae5")
# A few properties, not a named template: cheap to apply, and it replaces whatever template is Plotly's
# default in the process. In the app that is Streamlit's, whose colours are placeholders (#000001, ...)
# that only Streamlit's frontend fills in: without this, exported figures drew every series black.
EXPORT_TEMPLATE = dict(
    layout=dict(
        colorway=list(PALETTE),
        paper_bgcolor="white",
        plot_bgcolor="white",
        font=dict(color="#31333f"),
        xaxis=_GRID,
        yaxis=_GRID,
    )
)


def base_figure(title: str, x: str, y: str) -> go.Figure:
    """An empty figure with its title and axis titles, the app's margins and height, the legend below."""
    fig = go.Figure()
    # No named template: applying one costs ~30 ms per figure (validation of the whole template), a
    # third of the app's chart time; Streamlit styles figures with its own theme anyway.
    # the legend hangs below the x-axis title, not over it
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        margin=dict(l=50, r=20, t=50, b=90),
        height=370,
        legend=dict(orientation="h", x=0, y=-0.2, yanchor="top"),
    )
    return fig


def for_export(fig: go.Figure) -> go.Figure:
    """``fig`` with the app's palette and a white background for use outside Streamlit (HTML reports)."""
    fig.layout.template = EXPORT_TEMPLATE  # assigned, not updated: an update would merge into the default
    return fig


def cdf_figure(cdfs: dict[str, pd.DataFrame], metric: str, slo_s: float | None = None) -> go.Figure:
    """CDF of one latency metric for one or more runs (``cdfs``: run name -> views.ecdf frame),
    with the SLO as a vertical line."""
    fig = base_figure(f"{LABELS.get(metric, metric)} CDF", f"{LABELS.get(metric, metric)} (ms)", "fraction ≤ x")
    for name, df in cdfs.items():
        fig.add_trace(go.Scatter(x=df["value"] * 1e3, y=df["fraction"], mode="lines", name=name, line_shape="hv"))
    if slo_s:
        fig.add_vline(
            x=slo_s * 1e3,
            line_dash="dash",
            line_color="crimson",
            annotation_text=f"SLO {slo_s * 1e3:g} ms",
            annotation_position="top left",
        )
    fig.update_yaxes(range=[0, 1.02])
    return fig


def breakdown_figure(phases: dict[str, pd.DataFrame]) -> go.Figure:
    """Mean time per phase (stacked), one bar per run (``phases``: run name -> views.phase_frame)."""
    fig = base_figure("Latency breakdown per phase (mean of completed requests)", "run", "seconds")
    order = []
    for df in phases.values():
        order += [p for p in df["phase"] if p not in order]
    names = list(phases)
    for ph in order:
        ys = [float(df.loc[df["phase"] == ph, "mean_s"].sum()) for df in phases.values()]
        fig.add_trace(go.Bar(x=names, y=ys, name=ph))
    fig.update_layout(barmode="stack")
    return fig


def timeseries_figure(series: pd.DataFrame, column: str, title: str, y_title: str) -> go.Figure:
    """One line per pool over time from :func:`app.services.views.step_series`."""
    fig = base_figure(title, "time (s)", y_title)
    for pool, g in series.groupby("pool", sort=True):
        fig.add_trace(go.Scatter(x=g["t_s"], y=g[column], mode="lines", name=str(pool)))
    return fig


def link_figure(links: pd.DataFrame | None, bins: int = 200) -> go.Figure:
    """Utilisation of each fabric link over time: the time-weighted mean per bin (:func:`views.link_series`),
    not one point per transfer start and end (thousands of them drew a solid block)."""
    fig = base_figure("Link utilisation (mean per time bin)", "time (s)", "utilisation")
    series = views.link_series(links, bins)
    if not series.empty:
        for name, g in series.groupby("link", sort=True):
            fig.add_trace(go.Scatter(x=g["t_s"], y=g["utilisation"], mode="lines", name=str(name)))
    else:
        fig.add_annotation(
            text="no KV transfer links in this run (colocated)",
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
        )
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    return fig


def throughput_figure(req: pd.DataFrame) -> go.Figure:
    """Completed requests per second over time (by finish time), output tokens per second on a second axis."""
    fig = base_figure("Throughput over time", "time (s)", "completed requests/s")
    ts = views.throughput_series(req)
    fig.add_trace(go.Scatter(x=ts["t_s"], y=ts["requests_per_s"], mode="lines", name="requests/s"))
    fig.add_trace(
        go.Scatter(
            x=ts["t_s"],
            y=ts["output_tokens_per_s"],
            mode="lines",
            name="output tokens/s",
            yaxis="y2",
            line=dict(dash="dot"),
        )
    )
    fig.update_layout(
        yaxis2=dict(title="output tokens/s", overlaying="y", side="right", showgrid=False),
        margin=dict(l=50, r=60, t=50, b=45),
    )
    return fig


def log_axes(fig: go.Figure, x: bool = False, y: bool = False) -> go.Figure:
    """Log scale on the chosen axes (wide-range latencies or queue lengths)."""
    if x:
        fig.update_xaxes(type="log")
    if y:
        fig.update_yaxes(type="log", range=None)
    return fig


def scatter_figure(req: pd.DataFrame, slo_s: float | None = None, max_points: int = 4000) -> go.Figure:
    """Prompt length vs TTFT per request (a deterministic sample beyond ``max_points``)."""
    fig = base_figure("Prompt length vs TTFT", "prompt tokens", "TTFT (ms)")
    d = req[req["outcome"] == "completed"] if "outcome" in req else req
    if len(d) > max_points:
        d = d.iloc[:: max(1, len(d) // max_points)]
    for pool, g in d.groupby("pool", sort=True, observed=True):
        fig.add_trace(
            go.Scattergl(
                x=g["input_tokens"],
                y=g["ttft_s"] * 1e3,
                mode="markers",
                name=str(pool),
                marker=dict(size=4, opacity=0.5),
            )
        )
    if slo_s:
        fig.add_hline(y=slo_s * 1e3, line_dash="dash", line_color="crimson")
    return fig


def compare_figure(metrics: pd.DataFrame, rows: list[str], log_y: bool = False) -> go.Figure:
    """Grouped bars of selected metric rows of :func:`app.services.compare.metrics_frame`."""
    names = [c for c in metrics.columns if c not in ("best", "better")]
    fig = base_figure("Compared metrics", "metric", "value" + (" (log scale)" if log_y else ""))
    for n in names:
        fig.add_trace(go.Bar(x=rows, y=[metrics.loc[r, n] for r in rows], name=n))
    fig.update_layout(barmode="group", showlegend=True)
    return log_axes(fig, y=log_y)


def instances_figure(series: pd.DataFrame, events: pd.DataFrame) -> go.Figure:
    """Instances over time per pool (:func:`opsviews.instances_series`): serving as a solid step line,
    billed (starting included) dashed; scale-ups, scale-downs and crashes as markers on the time axis."""
    fig = base_figure("Instances over time", "time (s)", "instances")
    for i, (pool, g) in enumerate(series.groupby("pool", sort=False)):
        colour = PALETTE[(2 * i) % len(PALETTE)]
        fig.add_trace(
            go.Scatter(
                x=g["t_s"],
                y=g["serving"],
                mode="lines",
                line_shape="hv",
                name=f"{pool} serving",
                line=dict(color=colour),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=g["t_s"],
                y=g["billed"],
                mode="lines",
                line_shape="hv",
                name=f"{pool} billed",
                line=dict(color=colour, dash="dot"),
            )
        )
    marks = {
        "scale-up": ("triangle-up", "#29b09d"),
        "scale-down": ("triangle-down", "#ff8700"),
        "crash": ("x", "#ff2b2b"),
    }
    for kind, (symbol, colour) in marks.items():
        ev = events[events["event"] == kind]
        if ev.empty:
            continue
        fig.add_trace(
            go.Scatter(
                x=ev["time_s"],
                y=[0] * len(ev),
                mode="markers",
                name=kind,
                text=[f"{p}: {kind} x{c}. {w}" for p, c, w in zip(ev["pool"], ev["count"], ev["detail"], strict=True)],
                hoverinfo="x+text",
                marker=dict(symbol=symbol, size=13, color=colour),
            )
        )
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(showlegend=True)
    return fig


def failures_figure(fails: pd.DataFrame) -> go.Figure:
    """Failed, retried and rejected requests per arrival time bin (:func:`opsviews.failures_series`)."""
    fig = base_figure("Failed and retried requests (by arrival time)", "arrival time (s)", "requests")
    for col, colour in (("failed", "#ff2b2b"), ("retried", "#ff8700"), ("rejected", "#6d3fc0")):
        fig.add_trace(go.Bar(x=fails["t_s"], y=fails[col], name=col, marker_color=colour))
    fig.update_yaxes(rangemode="nonnegative")
    fig.update_layout(barmode="group", showlegend=True)
    return fig


def cost_figure(cost: pd.DataFrame) -> go.Figure:
    """Cumulative cost over the run (:func:`opsviews.cost_series`) with the billed GPUs on a second axis."""
    fig = base_figure("Cost with scaling", "time (s)", "cumulative cost ($)")
    fig.add_trace(go.Scatter(x=cost["t_s"], y=cost["cost_usd"], mode="lines", name="cost so far ($)"))
    fig.add_trace(
        go.Scatter(
            x=cost["t_s"],
            y=cost["gpus"],
            mode="lines",
            line_shape="hv",
            name="billed GPUs",
            yaxis="y2",
            line=dict(dash="dot"),
        )
    )
    fig.update_layout(
        yaxis2=dict(title="billed GPUs", overlaying="y", side="right", showgrid=False, rangemode="tozero"),
        showlegend=True,
        margin=dict(l=50, r=60, t=50, b=90),
    )
    return fig


GROUPS = {
    "Latency CDFs": ("cdf_ttft", "cdf_tpot", "cdf_itl", "cdf_e2e"),
    "Breakdown": ("breakdown",),
    "Time series": ("throughput", "batch", "kv", "queue", "links"),
    "Per request": ("scatter",),
    "Operations": ("instances", "failures", "cost"),
}  # only for runs with operations (autoscaling, faults)


def groups(res: Results) -> list[str]:
    """The chart groups a run has: Operations only for a run with operations."""
    return [g for g in GROUPS if g != "Operations" or "operations" in res.summary]


def results_figures(
    name: str,
    res: Results,
    slo_ttft: float | None,
    slo_tpot: float | None,
    which: tuple[str, ...] | None = None,
    log: bool = False,
    prices=None,
) -> dict[str, go.Figure]:
    """The charts of one run keyed by a short id (all of its :func:`groups`, or only ``which``); ``log``: log
    latency axes (CDFs' x, the scatter's TTFT) and log queue lengths; ``prices``: overrides for the cost
    chart of an operations run."""
    want = set(which) if which is not None else {k for g in groups(res) for k in GROUPS[g]}
    figs = {}
    slos = {"ttft": slo_ttft, "tpot": slo_tpot, "itl": slo_tpot, "e2e": None}
    if want & set(GROUPS["Latency CDFs"]):
        cdfs = views.latency_cdfs(res.requests, res.steps)
        for m in ("ttft", "tpot", "itl", "e2e"):
            if f"cdf_{m}" in want:
                figs[f"cdf_{m}"] = log_axes(cdf_figure({name: cdfs[m]}, m, slos[m]), x=log)
    if "breakdown" in want:
        figs["breakdown"] = breakdown_figure({name: views.phase_frame(res.requests)})
    if want & {"batch", "kv", "queue"}:
        series = views.step_series(res.steps)
        for key, col, title, unit in (
            ("batch", "batch_size", "Running batch size", "sequences"),
            ("kv", "kv_occupancy", "KV-cache occupancy", "fraction of blocks"),
            ("queue", "waiting", "Queue length (waiting requests)", "requests"),
        ):
            if key in want:
                figs[key] = log_axes(timeseries_figure(series, col, title, unit), y=log and key == "queue")
    if "throughput" in want:
        figs["throughput"] = throughput_figure(res.requests)
    if "links" in want:
        figs["links"] = link_figure(res.links)
    if "scatter" in want:
        figs["scatter"] = log_axes(scatter_figure(res.requests, slo_ttft), y=log)
    o = res.summary.get("operations")
    if o is not None and want & set(GROUPS["Operations"]):
        if "instances" in want:
            figs["instances"] = instances_figure(opsviews.instances_series(o), opsviews.events_frame(o))
        if "failures" in want:
            figs["failures"] = failures_figure(opsviews.failures_series(res.requests))
        if "cost" in want:
            figs["cost"] = cost_figure(opsviews.cost_series(o, opsviews.pool_prices(res, prices)))
    return figs
