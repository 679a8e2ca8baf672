"""Self-contained HTML reports with the app's charts, for sharing by mail or as CI artefacts.

One file, no network: Plotly's JavaScript is inlined once, each figure follows as a div
(``plotly="cdn"``: a script tag loads it from cdn.plot.ly instead, for a file of kilobytes that needs
the network when opened).  Each report carries what produced it as YAML (the scenario, or the plan
request) in a ``<pre id="...-yaml">`` block, so it can be re-run.  Used by ``epdsim simulate ... --report
FILE.html``, ``epdsim report validation`` and the app's download buttons.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import yaml

from app import charts, tool_charts
from app.services import compare, views
from app.services.calibration import checks_frame, series_frame
from app.services.costs import cost_text
from app.services.scenarios import Prices, cost
from app.services.share import portable_yaml
from simulator import fmt
from simulator.confidence import band_caption, describe, error_bands, with_band
from simulator.plan.bands import verdict as band_verdict
from simulator.serving_summary import slo_text

if TYPE_CHECKING:
    from simulator.engine.results import Results
    from simulator.summary_types import LatencyKey

STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px} "
    "table{border-collapse:collapse;margin:1em 0} td,th{border:1px solid #ccc;padding:3px 9px;text-align:right} "
    "th:first-child,td:first-child{text-align:left} .grid{display:grid;grid-template-columns:1fr 1fr;gap:8px} "
    ".best{background:#dff3e3;font-weight:bold}"
)


def _page(title: str, body: list[str]) -> str:
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>" + "".join(body) + "</body></html>"
    )


PLOTLY = ("inline", "cdn")


def _figures_html(figs: list, plotly: str = "inline") -> list[str]:
    """Each figure as a div; Plotly's JavaScript once, before the first (inlined, or from the CDN)."""
    if plotly not in PLOTLY:
        raise ValueError(f"plotly={plotly!r}: choose one of {PLOTLY}")
    out = []
    for i, fig in enumerate(figs):
        out.append(
            charts.for_export(fig).to_html(
                full_html=False, include_plotlyjs=(plotly if i == 0 else False), config={"displaylogo": False}
            )
        )
    return out


def _yaml_block(title: str, text: str, ident: str) -> str:
    return (
        f"<details><summary>{html.escape(title)}</summary><pre id='{html.escape(ident)}'>"
        f"{html.escape(text)}</pre></details>"
    )


def _scenario_yaml(scn) -> str:
    return portable_yaml(scn.model_dump(mode="json"))


def summary_rows(res: Results, prices: Prices | None = None) -> list[tuple[str, str]]:
    """The headline figures of a run as (label, text) pairs."""
    s = res.summary
    c = cost(res, prices)
    rel = error_bands(res.info)
    figures: tuple[tuple[LatencyKey, str], ...] = (
        ("ttft_s", "TTFT"),
        ("tpot_s", "TPOT"),
        ("itl_s", "ITL"),
        ("e2e_s", "E2E"),
    )
    rows = [
        (f"{lab} p50 / p90 / p99", " / ".join(with_band(s[k][p], rel.get(k)) for p in ("p50", "p90", "p99")))
        for k, lab in figures
    ]
    rows += [("model error band", band_caption(res.info, rel))]
    rows += [
        ("completed / rejected / unfinished", f"{s['completed']} / {s['rejected']} / {s['unfinished']}"),
        ("throughput", f"{s['throughput_rps']:.2f} req/s, {s['output_tokens_per_s']:,.0f} output tok/s"),
        (
            "SLO attainment",
            f"{fmt.percent(s['slo_attainment'])} "
            f"(target {fmt.percent(res.scenario.slo.attainment, 0)}"
            f" within {slo_text(res.scenario.slo.ttft_s, res.scenario.slo.tpot_s)})",
        ),
        ("GPUs", str(s["gpus"])),
        ("cost", cost_text(c["named"])),
        ("perf model", res.info.get("perf_model", "")),
    ]
    o = s.get("operations")
    if o is not None:
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(o["crashes_by_kind"].items())) or "none"
        rows += [
            ("availability / failed", f"{fmt.percent(o['availability'])} / {o['failed']:,}"),
            ("retried requests (re-sends)", f"{o['retried_requests']:,} ({o['retries']:,})"),
            ("crashes", f"{o['crashes']:,} ({kinds})"),
            (
                "scale-ups / peak serving instances",
                f"{len(o['scale_ups']):,} / " + ", ".join(f"{k} {v}" for k, v in o["peak_instances"].items()),
            ),
            ("GPU-hours", f"{o['gpu_hours']:,.3f}"),
        ]
    rows += [
        (f"confidence ({p['name']})", describe(p["confidence"])) for p in res.info.get("pools", []) if "confidence" in p
    ]
    return rows


def _table(rows: list[tuple[str, str]]) -> str:
    return (
        "<table>"
        + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
        + "</table>"
    )


def results_html(res, name: str | None = None, prices: Prices | None = None, plotly: str = "inline") -> str:
    """A run's summary table and every Results chart."""
    scn = res.scenario
    name = name or scn.name
    figs = charts.results_figures(name, res, scn.slo.ttft_s, scn.slo.tpot_s, prices=prices)
    layout = ", ".join(f"{p['instances']}x {p['gpu']} TP{p['tp']} ({p['role']})" for p in res.info["pools"])
    body = [
        f"<h1>{html.escape(name)}</h1>",
        f"<p>{html.escape(res.info['model'])} on {html.escape(layout)}; seed {scn.seed}. "
        f"{html.escape(scn.description)}</p>",
        _table(summary_rows(res, prices)),
        "<div class='grid'>",
        *_figures_html(list(figs.values()), plotly),
        "</div>",
        _yaml_block(
            "Scenario (YAML: save it and run `epdsim simulate FILE.yaml` to reproduce this report)",
            _scenario_yaml(scn),
            "scenario-yaml",
        ),
    ]
    return _page(f"epdsim: {name}", body)


def comparison_html(results: dict, metrics: pd.DataFrame, plotly: str = "inline") -> str:
    """Several runs side by side: the metrics table (best per row marked) and overlaid CDFs."""
    names = list(results)
    head = "<tr><th>metric</th>" + "".join(f"<th>{html.escape(n)}</th>" for n in names) + "</tr>"
    rows = []
    for label, row in metrics.iterrows():
        win = compare.winners(row)
        f = compare.row_formatter(str(label))
        cells = "".join(f"<td class='{'best' if n in win else ''}'>{html.escape(f(row[n]))}</td>" for n in names)
        rows.append(f"<tr><td>{html.escape(str(label))}</td>{cells}</tr>")
    cdfs = {n: views.latency_cdfs(r.requests, r.steps) for n, r in results.items()}
    first = next(iter(results.values())).scenario.slo
    figs = [
        charts.cdf_figure({n: c[m] for n, c in cdfs.items()}, m, {"ttft": first.ttft_s, "tpot": first.tpot_s}.get(m))
        for m in ("ttft", "tpot", "itl", "e2e")
    ]
    figs.append(charts.breakdown_figure({n: views.phase_frame(r.requests) for n, r in results.items()}))
    yamls = [
        _yaml_block(f"Scenario {n} (YAML)", _scenario_yaml(r.scenario), f"scenario-yaml-{i}")
        for i, (n, r) in enumerate(results.items())
    ]
    return _page(
        "epdsim comparison",
        [
            "<h1>Comparison</h1>",
            f"<table>{head}{''.join(rows)}</table>",
            "<div class='grid'>",
            *_figures_html(figs, plotly),
            "</div>",
            *yamls,
        ],
    )


def plan_html(result, plotly: str = "inline") -> str:
    """A plan: the recommendation, the Pareto chart (cost vs goodput) and the Pareto and family tables."""
    rec = result.recommended
    head = (
        f"<p><b>Recommended:</b> {html.escape(str(rec['layout']))}, {rec['gpus']} GPUs, "
        f"${rec['cost_usd_per_hour']:,.2f}/h, goodput {rec['goodput_rps']:,.1f} req/s</p>"
        f"<p>{html.escape(band_verdict(result))}</p>"
        if rec
        else "<p><b>No candidate meets the SLO.</b> " + html.escape(" ".join(result.notes)) + "</p>"
    )
    fig = tool_charts.pareto_figure(
        result.candidates,
        result.pareto,
        "cost_usd_per_hour",
        "goodput_rps",
        rec,
        label="layout",
        target_rate=result.request.target_rate,
    )
    fmt = lambda x: f"{x:,.4g}"  # noqa: E731 - a one-line float format for to_html
    req = result.request
    slo = req.slo
    goal = (
        f"<p>Target {req.target_rate:g} req/s; SLO p{req.percentile}: "
        f"{html.escape(slo_text(slo.ttft_s, slo.tpot_s))}; workload: "
        f"{html.escape(_workload_text(req))}.</p>"
    )
    body = [
        f"<h1>Plan {html.escape(result.request.name)}</h1>",
        goal,
        head,
        *_figures_html([fig], plotly),
        "<h2>Pareto front</h2>",
        result.pareto.to_html(index=False, float_format=fmt),
    ]
    if result.families is not None and len(result.families):
        body += ["<h2>Families</h2>", result.families.to_html(index=False, float_format=fmt)]
    body.append(
        _yaml_block(
            "Plan request (YAML: `epdsim plan FILE.yaml` re-runs it)",
            yaml.safe_dump(req.model_dump(mode="json"), sort_keys=False),
            "plan-yaml",
        )
    )
    return _page(f"epdsim plan {result.request.name}", body)


def _workload_text(req) -> str:
    wl = getattr(req, "workload", None)
    if wl is None:
        return "-"
    d = wl.model_dump(mode="json", exclude_none=True) if hasattr(wl, "model_dump") else dict(wl)
    return ", ".join(f"{k} {v}" for k, v in d.items())


def validation_html(data: dict, plotly: str = "inline") -> str:
    """A calibration validation (``validation.json`` of ``epdsim calibrate validate``) with the app's
    predicted-vs-measured charts."""
    checks = checks_frame(data)
    figs = [tool_charts.predicted_vs_measured_figure(series_frame(data, m), m.upper()) for m in ("ttft", "tpot", "e2e")]
    passed = data["checks"] - data["failed"]
    body = [
        f"<h1>Validation of {html.escape(str(data['profile']['name']))}</h1>",
        f"<p>{html.escape(str(data['model']))} on {html.escape(str(data['gpu']))}; tolerance "
        f"{data['tolerance']:.0%}: <b>{passed} of {data['checks']} checks pass</b>.</p>",
        checks.to_html(index=False, float_format=lambda x: f"{x:,.4g}"),
        "<div class='grid'>",
        *_figures_html(figs, plotly),
        "</div>",
    ]
    return _page("epdsim validation", body)


def write(path: str | Path, text: str) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p
