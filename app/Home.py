"""epdsim what-if planner: build a scenario in the sidebar, see its results here.

Layout only: the builder is app/ui_builder.py, runs go through app/ui.py, charts come from
app/charts.py and figures from app/services.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # `streamlit run app/Home.py` from anywhere

import streamlit as st  # noqa: E402

from app import charts, report, ui, ui_builder  # noqa: E402
from app.services import scenarios, views  # noqa: E402

st.set_page_config(page_title="epdsim what-if planner", page_icon="⚙️", layout="wide")
st.title("epdsim what-if planner")
st.caption("Discrete-event simulation of vLLM/SGLang serving: colocated and prefill/decode (PD) deployments. "
           "Edit the scenario on the left; results update when it changes.")

d, prices = ui_builder.sidebar()
res, key = ui.run_scenario(d)
if res is not None:
    s, info = res.summary, res.info
    c = scenarios.cost(res, prices)
    layout = " + ".join(f"{p['instances']}× {p['gpu']} TP{p['tp']} {p['role']}" for p in info["pools"])
    st.subheader(f"{info['model']} on {layout}")
    cols = st.columns(6)
    cols[0].metric("TTFT p50", f"{s['ttft_s']['p50'] * 1e3:,.1f} ms", help=f"p99 {s['ttft_s']['p99'] * 1e3:,.1f} ms")
    cols[1].metric("TPOT p50", f"{s['tpot_s']['p50'] * 1e3:,.2f} ms", help=f"p99 {s['tpot_s']['p99'] * 1e3:,.2f} ms")
    cols[2].metric("output tok/s", f"{s['output_tokens_per_s']:,.0f}")
    cols[3].metric("SLO attainment", f"{s['slo_attainment']:.1%}")
    cols[4].metric("cost per hour", f"${c['usd_per_hour']:,.2f}")
    cols[5].metric("$ per M output tokens", f"${c['usd_per_million_output_tokens']:,.3f}")
    if s["unfinished"] or s["rejected"]:
        st.warning(f"{s['rejected']} requests rejected and {s['unfinished']} unfinished of {s['requests']}: "
                   "the deployment does not keep up or prompts exceed max_model_len.")
    figs = charts.results_figures(res.scenario.name, res, res.scenario.slo.ttft_s, res.scenario.slo.tpot_s)
    t_lat, t_brk, t_ts, t_sc, t_tab = st.tabs(["Latency CDFs", "Breakdown", "Time series", "Per request", "Tables"])
    with t_lat:
        a, b = st.columns(2)
        a.plotly_chart(figs["cdf_ttft"], key="cdf_ttft")
        b.plotly_chart(figs["cdf_tpot"], key="cdf_tpot")
        a.plotly_chart(figs["cdf_itl"], key="cdf_itl")
        b.plotly_chart(figs["cdf_e2e"], key="cdf_e2e")
    with t_brk:
        st.plotly_chart(figs["breakdown"], key="breakdown")
        st.dataframe(views.phase_frame(res.requests), hide_index=True)
    with t_ts:
        a, b = st.columns(2)
        a.plotly_chart(figs["batch"], key="batch")
        b.plotly_chart(figs["kv"], key="kv")
        a.plotly_chart(figs["queue"], key="queue")
        b.plotly_chart(figs["links"], key="links")
    with t_sc:
        st.plotly_chart(figs["scatter"], key="scatter")
    with t_tab:
        st.dataframe(res.requests.head(1000), hide_index=True)
    st.download_button("Download HTML report", report.results_html(res, prices=prices),
                       f"{res.scenario.name}.html", mime="text/html", key="report")
    if "last_run_s" in st.session_state:
        st.caption(f"perf model: {info['perf_model']}; last simulation {st.session_state['last_run_s']:.2f} s; "
                   f"scenario hash {key}")
