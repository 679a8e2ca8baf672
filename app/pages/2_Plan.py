"""Plan: the cheapest deployment that meets the SLO for the current scenario's workload."""

from __future__ import annotations

import hashlib
import json

import streamlit as st

from app import report, tool_charts, ui
from app.services import builder, glossary, planbands, planning, scenarios

st.set_page_config(page_title="epdsim: plan", layout="wide")
st.title("Capacity plan")
st.caption(
    "Searches colocated and prefill/decode deployments over the offered GPUs: an analytic screen of "
    "every candidate, then simulation of the most promising (docs/planner.md)."
)

d = ui.scenario()
opts = builder.options(ui.db(d))
up = st.file_uploader(
    "Load a plan request YAML (else the Home page's scenario is planned)", type=["yaml", "yml"], key="plan-upload"
)
data = None
if up is not None:
    try:
        data = planning.parse_upload(up.name, up.getvalue(), folder=ui.upload_dir())
    except Exception as exc:  # noqa: BLE001 - every upload error inline, never a traceback on the page
        ui.show_error(exc)
if data is None:
    c1, c2, c3 = st.columns(3)
    default = [g for g in ("H100-SXM-80GB", "H200-SXM-141GB", "L40S") if g in opts.gpus]
    gpus = c1.multiselect("GPUs on offer", opts.gpus, default=default, key="plan-gpus")
    max_gpus = c2.number_input("at most GPUs", 1, 1024, 16, key="plan-max-gpus")
    tp = c3.multiselect("TP degrees", [1, 2, 4, 8], default=[1, 2, 4], key="plan-tp")
    c1, c2, c3 = st.columns(3)
    fams = c1.multiselect(
        "families",
        planning.families(),
        default=planning.families(),
        key="plan-families",
        help=glossary.help_for("families"),
    )
    verify = c2.number_input("candidates to simulate", 0, 50, 3, key="plan-verify")
    nreq = c3.number_input("requests per simulation", 50, 100000, 400, key="plan-requests")
    edge = st.checkbox(
        "SLO must hold at the model-error band's pessimistic edge",
        key="plan-band-edge",
        help="A candidate meets the SLO only if its TTFT and TPOT, raised by the validation's error "
        "band for its pools, still meet the targets; candidates without a band are refused "
        "(docs/planner.md).",
    )
    if not gpus or not tp or not fams:
        st.error("Offer at least one GPU, one TP degree and one family.", icon="🚫")
        st.stop()
    try:
        data = planning.request_from_scenario(
            d,
            gpus,
            max_gpus=max_gpus,
            tp=tuple(sorted(tp)),
            families=tuple(fams),
            verify=verify,
            requests=nreq,
            at_band_edge=edge,
        )
        planning.parse_request(data)
    except scenarios.InputError as exc:
        ui.show_error(exc)
        st.stop()
with st.expander("plan request (YAML)"):
    import yaml

    st.code(yaml.safe_dump(data, sort_keys=False), language="yaml")

key = "plan-" + hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]
plans = st.session_state.setdefault("plans", {})
if key not in plans:
    if not st.button("Run the planner", type="primary", key="plan-run"):
        st.stop()
    res = ui.run_job(key, planning.run, (data,), label="planning")
    if res is None:
        st.stop()
    plans[key] = res
res = plans[key]

rec = res.recommended
# The model error band of every candidate's latencies (computed once per plan: it resolves each pool).
bands = st.session_state.setdefault("plan-bands", {})
if key not in bands:
    bands[key] = planbands.band_frame(res)
band = bands[key]
if rec:
    head = (
        f"Recommended: {rec['layout']} — {rec['gpus']} GPUs, ${rec['cost_usd_per_hour']:,.2f}/h, "
        f"goodput {rec['goodput_rps']:,.1f} req/s. "
    )
    edge = band.set_index("id").loc[rec["id"], "meets_slo_at_band_edge"]
    holds = edge is not None and edge == edge and bool(edge)
    (st.success if holds else st.warning)(ui.plain(head + planbands.verdict(res, band)), icon="✅" if holds else "⚠️")
else:
    st.warning("No candidate meets the SLO. " + " ".join(res.notes))
c = planbands.with_bands(res.candidates, band)
pareto = planbands.with_bands(res.pareto, band)
st.caption(
    f"Goodput: {glossary.TERMS['goodput']} Rows with `verified` true were simulated (the banner's "
    "figure); the others carry the analytic screen's estimate, which the simulation may correct either way. "
    "`ttft_band`/`tpot_band`: the model error band (the validation's mean |error| on the subset that fits "
    "the candidate's pools, simulator/confidence.py), its ends `*_low_s`/`*_high_s`, and "
    "`meets_slo_at_band_edge` judged at the high end; `attainment_ci95` is seed noise, a different thing."
)
q = res.request.percentile
for frame in (c, pareto):
    frame["hover"] = [
        f"{r['layout']}<br>{planbands.latency_text(r, r, q)}<br>${r['cost_usd_per_hour']:,.2f}/h, "
        f"goodput {r['goodput_rps']:,.2f} req/s"
        for r in frame.to_dict("records")
    ]
st.plotly_chart(
    tool_charts.pareto_figure(
        c, pareto, "cost_usd_per_hour", "goodput_rps", rec, label="hover", target_rate=res.request.target_rate
    ),
    key="pareto",
)
st.subheader("Pareto front")
pareto, c = pareto.drop(columns="hover"), c.drop(columns="hover")
st.dataframe(pareto, hide_index=True, key="pareto-table", column_config=ui.column_config(pareto))
with st.expander(f"all {len(c)} candidates"):
    st.dataframe(c, hide_index=True, key="candidates", column_config=ui.column_config(c))
if res.families is not None and len(res.families):
    st.dataframe(res.families, hide_index=True, key="families", column_config=ui.column_config(res.families))

cid = planning.candidate_for_artefacts(res)
if cid:
    try:
        files = planning.artefact_files(res, cid)
    except scenarios.InputError as exc:
        ui.show_error(exc)
        st.stop()
    st.subheader("Artefacts" + ("" if rec else f" (closest candidate {cid})"))
    st.download_button(
        "Download all (zip)",
        planning.zip_bytes(files),
        f"{res.request.name}-artefacts.zip",
        mime="application/zip",
        key="artefacts-zip",
    )
    for name, text in sorted(files.items()):
        with st.expander(name):
            st.code(text, language="yaml" if name.endswith(".yaml") else "bash" if name.endswith(".sh") else None)
st.download_button(
    "Download plan report (HTML)",
    report.plan_html(res),
    f"{res.request.name}.html",
    mime="text/html",
    key="plan-report",
)
