"""epdsim what-if planner: build a scenario in the sidebar, see its results here.

Layout only: the builder is app/ui_builder.py, runs go through app/ui.py, charts come from
app/charts.py and figures from app/services.
"""

from __future__ import annotations

import streamlit as st

from app import charts, report, ui, ui_builder
from app.services import glossary, opsviews, scenarios, views
from simulator.confidence import describe
from simulator.saturation import saturation

st.set_page_config(page_title="epdsim what-if planner", page_icon="⚙️", layout="wide")
st.title("epdsim what-if planner")
st.caption(
    "Discrete-event simulation of vLLM/SGLang serving: colocated, prefill/decode (PD) and encoder (EPD) "
    "deployments. "
    "Edit the scenario on the left; results update when it changes."
)

d, prices = ui_builder.sidebar()
with st.expander("What the terms mean (layouts, TTFT/TPOT, SLO attainment, goodput, ...)"):
    st.markdown(glossary.markdown())
res, key = ui.run_scenario(d)
if res is not None:
    s, info = res.summary, res.info
    c = scenarios.cost(res, prices, ui.db(d))
    layout = " + ".join(f"{p['instances']}× {p['gpu']} TP{p['tp']} {p['role']}" for p in info["pools"])
    st.subheader(f"{info['model']} on {layout}")
    ui.result_cards(res, c)
    ui.ops_cards(res)
    sat = saturation(res)
    if sat:
        st.error(sat["message"], icon="🔥")
    elif s["unfinished"] or s["rejected"]:
        st.warning(
            f"{s['rejected']} requests rejected and {s['unfinished']} unfinished of {s['requests']}: "
            "the deployment does not keep up or prompts exceed max_model_len."
        )
    # Only the chosen view is drawn: building every figure on each change would cost more than the simulation.
    views_on_offer = [*charts.groups(res), "Tables"]
    if st.session_state.get("view") not in views_on_offer:  # Operations, left from a run that had them
        st.session_state["view"] = views_on_offer[0]
    view = st.radio("view", views_on_offer, horizontal=True, key="view", label_visibility="collapsed")
    if view == "Tables":
        ui.tables_view(res)
    else:
        log = view != "Breakdown" and st.toggle("log scale (latencies, queue length)", key="log-axes")
        figs = charts.results_figures(
            res.scenario.name,
            res,
            res.scenario.slo.ttft_s,
            res.scenario.slo.tpot_s,
            which=charts.GROUPS[view],
            log=log,
            prices=prices,
        )
        if view == "Breakdown":
            st.plotly_chart(figs["breakdown"], key="breakdown")
            st.dataframe(views.phase_frame(res.requests), hide_index=True)
        else:
            cols = st.columns(2 if len(figs) > 1 else 1)
            for i, (k, fig) in enumerate(figs.items()):
                cols[i % len(cols)].plotly_chart(fig, key=k)
        if view == "Operations":
            st.dataframe(opsviews.events_frame(res.summary["operations"]), hide_index=True, key="ops-events")
    b1, b2 = st.columns(2)
    with b1:
        ui.pin_button(d)
    # The prepared report lives under its own state key: a widget's key is read-only in session_state.
    if b2.button("Prepare HTML report", key="make-report"):
        st.session_state["report-html"] = (key, report.results_html(res, prices=prices))
    if st.session_state.get("report-html", (None,))[0] == key:
        st.download_button(
            "Download HTML report",
            st.session_state["report-html"][1],
            f"{res.scenario.name}.html",
            mime="text/html",
            key="download-report",
        )
    if "last_run_s" in st.session_state:
        st.caption(
            f"perf model: {info['perf_model']}; last simulation {st.session_state['last_run_s']:.2f} s; "
            f"scenario hash {key}"
        )
    for p in info.get("pools", []):
        if "confidence" in p:
            # How sure the numbers are: what they rest on and the measured error band (docs/validation/e2e.md).
            text = f"Confidence ({p['name']}): {describe(p['confidence'])}"
            if p["confidence"]["error_band"]:
                st.caption(text)
            else:
                st.warning(text)
