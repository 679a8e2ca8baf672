"""Sweep: the Home page's scenario at several offered rates (the knee), or with one knob varied."""

from __future__ import annotations

import hashlib
import json

import streamlit as st

from app import sweep_charts, ui
from app.services import scenarios, sweep

st.set_page_config(page_title="epdsim: sweep", layout="wide")
st.title("Sweep")
st.caption(
    "Runs the scenario being edited on Home at a list of offered request rates, or with one knob set to "
    "each of a list of values, and finds the knee: the highest rate whose TTFT p90 stays within 3x its "
    "low-load value (and the SLO) while the achieved throughput still follows the offered rate "
    "(docs/sweep.md; the same as `epdsim sweep`)."
)

d = ui.scenario()
mode = st.radio("sweep over", ["offered rate", "one knob"], horizontal=True, key="sweep-mode")
c1, c2, c3 = st.columns(3)
spec: dict = {}
if mode == "offered rate":
    auto = c1.checkbox("auto: a ladder around the estimated capacity", True, key="sweep-auto")
    if auto:
        spec["rates"] = "auto"
        spec["points"] = int(c2.number_input("points", 2, 64, 8, key="sweep-points"))
    else:
        spec["rates"] = c2.text_input("rates (requests/s, comma-separated)", "2,4,8,16,32", key="sweep-rates")
else:
    options = sweep.knobs(d)
    path = c1.selectbox("knob", list(options), format_func=lambda p: f"{p} ({options[p][0]})", key="sweep-knob")
    values = c2.text_input("values (comma-separated)", options[path][1], key=f"sweep-values-{path}")
    spec["knob"] = f"{path}={values}"
n0 = int((d.get("workload") or {}).get("num_requests") or 1000)
spec["num_requests"] = int(
    c3.number_input(
        "requests per point",
        20,
        100_000,
        min(n0, 2000),
        key="sweep-requests",
        help="more requests: steadier figures, longer runs",
    )
)
folder = ui.upload_dir(create=False)
try:
    prep = sweep.check(d, folder=folder, **spec)
except scenarios.InputError as exc:
    ui.show_error(exc)
    st.stop()
st.caption(
    f"{len(prep.points)} points: "
    + ", ".join(p.label for p in prep.points)
    + (f" req/s (estimated capacity {prep.capacity_rps:.3g} req/s)" if prep.capacity_rps else "")
)

key = "sweep-" + hashlib.sha256(json.dumps([d, spec], sort_keys=True, default=str).encode()).hexdigest()[:16]
done = st.session_state.setdefault("sweeps", {})
if key not in done:
    if not st.button("Run the sweep", type="primary", key="sweep-run"):
        st.stop()
    res = ui.run_job(key, sweep.run, (d,), label="sweeping", kwargs={**spec, "folder": folder})
    if res is None:
        st.stop()
    done[key] = res
res = done[key]

if res.knee is not None:
    (st.success if res.knee.reached and res.knee.rate_rps is not None else st.warning)(ui.plain(res.knee.text()))
for note in res.notes:
    st.info(ui.plain(note))
left, right = st.columns(2)
left.plotly_chart(sweep_charts.latency_figure(res), key="sweep-latency")
right.plotly_chart(sweep_charts.throughput_figure(res), key="sweep-throughput")
st.dataframe(sweep_charts.table(res), hide_index=True, key="sweep-table")
d1, d2 = st.columns(2)
d1.download_button("sweep CSV", sweep.csv_bytes(res), f"{res.name}-sweep.csv", mime="text/csv", key="sweep-csv")
if d2.button("Prepare the HTML report", key="sweep-html-prepare"):
    d2.download_button(
        "Download sweep report (HTML)",
        sweep_charts.sweep_html(res),
        f"{res.name}-sweep.html",
        mime="text/html",
        key="sweep-html",
    )
