"""Calibration: load a measurement bundle, fit a profile, and show the fit and the validation report."""

from __future__ import annotations

import tempfile
from pathlib import Path

import streamlit as st

from app import report, tool_charts, ui
from app.services import bundles, calibration, scenarios

st.set_page_config(page_title="epdsim: calibration", layout="wide")
st.title("Calibration: fit and validation")
st.caption(
    "A bundle is the folder `epdsim calibrate run --out DIR` writes. The fit and the validation are those "
    "of `epdsim calibrate fit` and `epdsim calibrate validate`."
)

SOURCES = {
    "sample": "the shipped sample bundle",
    "upload": "upload a bundle (.zip)",
    "folder": "a folder on the app's machine",
}
source = st.radio("bundle", list(SOURCES), format_func=SOURCES.get, horizontal=True, key="bundle-source")
tol = st.slider("validation tolerance (relative error)", 0.05, 1.0, 0.25, 0.05, key="tolerance")
extra: tuple[Path, ...] = ()
if source == "sample":
    path = str(calibration.SAMPLE_BUNDLE)
    st.caption(
        "Synthetic: the simulator 'measured' a tiny Llama on a known CPU-host profile with 3 % noise, as "
        "`epdsim calibrate run` records a server (examples/make_calibration_sample.py); the fit should "
        "recover that profile."
    )
elif source == "upload":
    up = st.file_uploader("bundle .zip (the folder with manifest.json and records/)", type=["zip"], key="bundle-zip")
    if up is None:
        st.info("Upload a zipped bundle to begin.")
        st.stop()
    try:
        folder = ui.upload_dir()
        path, extra = str(bundles.extract_zip(up.name, up.getvalue(), folder)), (folder,)
    except scenarios.InputError as exc:
        ui.show_error(exc)
        st.stop()
else:
    path = st.text_input("bundle folder", value=st.session_state.get("bundle-path", ""), key="bundle")
    if not path.strip():
        st.info("Enter a bundle folder to begin.")
        st.stop()
try:
    ov = calibration.overview(path, extra_roots=extra)
except scenarios.InputError as exc:
    ui.show_error(exc)
    st.stop()
c1, c2, c3 = st.columns(3)
c1.metric("model", str(ov["model"]))
c2.metric("vLLM", str(ov["vllm"]))
c3.metric("mode", str(ov["mode"]))
st.dataframe(ov["phases"], hide_index=True, key="bundle-phases")

run_key = f"calib-{Path(path).resolve()}-{tol}"
if not (st.button("Fit and validate", type="primary", key="fit") or run_key in st.session_state):
    st.stop()
if run_key not in st.session_state:
    out = Path(tempfile.mkdtemp(prefix="epdsim-calib-"))
    res = ui.run_job(
        run_key, calibration.fit_and_validate, (path, str(out)), label="calibrating", kwargs={"tolerance": tol}
    )
    if res is None:
        st.stop()
    st.session_state[run_key] = res
res = st.session_state[run_key]
st.subheader(f"Fitted profile {res['profile']}")
st.dataframe(res["params"], hide_index=True, key="params")
st.dataframe(res["quality"], hide_index=True, key="quality")
r = res["residuals"][["kind", "measured_s", "predicted_s"]].rename(
    columns={"kind": "phase", "measured_s": "measured", "predicted_s": "predicted"}
)
st.plotly_chart(tool_charts.predicted_vs_measured_figure(r, "step time (fit)"), key="fit-chart")
v = res["validation"]
checks = calibration.checks_frame(v)
passed = v["checks"] - v["failed"]
(st.success if v["passed"] else st.error)(f"validation: {passed} of {v['checks']} checks within {tol:.0%}")
st.dataframe(checks, hide_index=True, key="checks")
a, b = st.columns(2)
a.plotly_chart(tool_charts.predicted_vs_measured_figure(calibration.series_frame(v, "ttft"), "TTFT"), key="val-ttft")
b.plotly_chart(tool_charts.predicted_vs_measured_figure(calibration.series_frame(v, "e2e"), "E2E"), key="val-e2e")

st.subheader("Use the fitted profile")
st.caption(
    "The profile, its engine (host costs) and the model's config.json, as `epdsim calibrate fit` writes "
    "them: a hardware folder to pass with `--hwdb`, or saved into your hardware folder "
    f"({scenarios.user_hwdb_dir()}), where every page and scenario finds it."
)
d1, d2, d3 = st.columns(3)
d1.download_button(
    "Download fitted profile (zip)",
    bundles.zip_files(res["files"]),
    f"{res['profile']}.zip",
    mime="application/zip",
    key="profile-zip",
)
d2.download_button(
    "Download validation report (HTML)",
    report.validation_html(v),
    "validation.html",
    mime="text/html",
    key="val-report",
)
if d3.button(
    "Save to my hardware folder and simulate it on Home",
    key="use-profile",
    type="primary",
    disabled=res.get("scenario") is None,
    help=res.get("scenario_error"),
):
    try:
        bundles.save_to_user_hwdb(res["files"], scenarios.user_hwdb_dir())
    except scenarios.InputError as exc:
        ui.show_error(exc)
        st.stop()
    ui.load_scenario(res["scenario"])
    st.switch_page("Home.py")
