"""Compare: two or more scenarios side by side (presets from the current scenario, or pinned ones)."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app import charts, report, ui
from app.services import compare, exports, jobs, scenarios, views

st.set_page_config(page_title="epdsim: compare", layout="wide")
st.title("Compare scenarios")
st.caption(
    "Variants of the scenario built on the Home page, simulated side by side; the best value of "
    "each metric is highlighted and changes are relative to the first column."
)

base = ui.scenario()
pinned = st.session_state.setdefault(ui.PINNED, {})
c1, c2 = st.columns([2, 1])
# With a pinned scenario (Home's "Pin for Compare"), the first choice is that one against the current scenario.
choices = (["pinned vs current"] if pinned else []) + [*compare.PRESETS, "pinned scenarios"]
if st.session_state.get("preset") not in choices:
    st.session_state["preset"] = choices[0]
preset = c1.selectbox("Compare", choices, key="preset")
with c2:
    name = st.text_input("pin the current scenario as", value=f"scenario {len(pinned) + 1}", key="pin-name")
    if st.button("Pin current scenario", key="pin"):
        pinned[name] = base
        st.success(f"pinned '{name}' ({len(pinned)} pinned)")

if preset == "pinned vs current":
    named = compare.with_current(pinned, base)
elif preset == "pinned scenarios":
    named = dict(pinned)
else:
    named = compare.variants(base, preset)
if len(named) < 2:
    st.info("Pin at least two scenarios (change the scenario on the Home page between pins), or pick a preset.")
    st.stop()

errors = {}
for n, d in named.items():
    try:
        scenarios.to_scenario(d, origin=n)
    except scenarios.InputError as exc:
        errors[n] = exc
for n, err in errors.items():
    st.error(f"{n}: {err}", icon="🚫")
if errors:
    st.stop()

cache = ui.run_cache()
keys = {n: scenarios.scenario_hash(scenarios.to_scenario(d)) + ":0" for n, d in named.items()}
missing = {n: d for n, d in named.items() if cache.get(keys[n]) is None}
if missing:
    done = ui.run_job(
        "compare-" + "-".join(sorted(keys[n] for n in missing)),
        jobs.run_scenarios,
        (missing,),
        label=f"simulating {len(missing)} scenarios",
        kwargs={"folder": ui.upload_dir(create=False)},
    )
    if done is None:
        st.stop()
    for n, r in done.items():
        cache.put(keys[n], r)
results = {n: cache.get(keys[n]) for n in named}

metrics = compare.metrics_frame(results)
names = list(results)


def _highlight(row):
    win = compare.winners(row)
    return ["background-color: #d8f0dc; font-weight: bold" if c in win else "" for c in row.index]


st.subheader("Metrics")
sty = metrics.style.apply(_highlight, axis=1)
rel = compare.bands(results)
for label in metrics.index:  # one formatter per cell: durations with their band, percentages, dollars
    for n in names:
        sty = sty.format(compare.cell_formatter(label, rel[n]), subset=pd.IndexSlice[[label], [n]])
st.dataframe(sty, key="metrics")
st.caption(
    "Best value per row highlighted; values within 0.5% of it tie (no highlight when all tie). "
    "(low–high) after a latency: its model error band, the validation's mean |error| on the subset that "
    "fits each scenario's pools (simulator/confidence.py); not a seed-noise interval. Cost $/h: the "
    "static cost, or for a run with autoscaling the mean billed one (docs/app.md)."
)
st.subheader("Change against " + names[0])
st.dataframe(compare.relative_change(metrics).style.format("{:+.1%}", na_rep="-"), key="changes")

cdfs = {n: views.latency_cdfs(r.requests, r.steps) for n, r in results.items()}
slo = next(iter(results.values())).scenario.slo
log = st.toggle("log scale (latencies and bars): differences over orders of magnitude", key="cmp-log")
a, b = st.columns(2)
a.plotly_chart(
    charts.log_axes(charts.cdf_figure({n: c["ttft"] for n, c in cdfs.items()}, "ttft", slo.ttft_s), x=log),
    key="cmp-ttft",
)
b.plotly_chart(
    charts.log_axes(charts.cdf_figure({n: c["tpot"] for n, c in cdfs.items()}, "tpot", slo.tpot_s), x=log),
    key="cmp-tpot",
)
a.plotly_chart(
    charts.breakdown_figure({n: views.phase_frame(r.requests) for n, r in results.items()}), key="cmp-breakdown"
)
bars = b.selectbox(
    "bars of", list(metrics.index), index=list(metrics.index).index("output tokens/s per GPU"), key="cmp-bars-metric"
)
b.plotly_chart(charts.compare_figure(metrics, [bars], log_y=log), key="cmp-bars")
d1, d2 = st.columns(2)
d1.download_button(
    "Download comparison (HTML)",
    report.comparison_html(results, metrics),
    "comparison.html",
    mime="text/html",
    key="cmp-report",
)
d2.download_button(
    "Download metrics table (CSV)", exports.comparison_csv(metrics), "comparison.csv", mime="text/csv", key="cmp-csv"
)
