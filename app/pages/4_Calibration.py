"""Calibration: load a measurement bundle, fit a profile, and show the fit and the validation report."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import streamlit as st  # noqa: E402

from app import charts, report, ui  # noqa: E402
from app.services import calibration, scenarios  # noqa: E402

st.set_page_config(page_title="epdsim: calibration", layout="wide")
st.title("Calibration: fit and validation")
st.caption("A bundle is the folder `epdsim calibrate run --out DIR` writes on the machine running the app. "
           "The fit and the validation are those of `epdsim calibrate fit` and `epdsim calibrate validate`.")

path = st.text_input("bundle folder", value=st.session_state.get("bundle-path", ""), key="bundle")
tol = st.slider("validation tolerance (relative error)", 0.05, 1.0, 0.25, 0.05, key="tolerance")
if not path.strip():
    st.info("Enter a bundle folder to begin.")
    st.stop()
try:
    ov = calibration.overview(path)
except scenarios.InputError as exc:
    ui.show_error(exc)
    st.stop()
c1, c2, c3 = st.columns(3)
c1.metric("model", str(ov["model"]))
c2.metric("vLLM", str(ov["vllm"]))
c3.metric("mode", str(ov["mode"]))
st.dataframe(ov["phases"], hide_index=True, key="bundle-phases")

run_key = f"calib-{Path(path).resolve()}-{tol}"
if st.button("Fit and validate", type="primary", key="fit") or run_key in st.session_state:
    if run_key not in st.session_state:
        out = Path(tempfile.mkdtemp(prefix="epdsim-calib-"))
        res = ui.run_job(run_key, calibration.fit_and_validate, (path, str(out)), label="calibrating",
                         kwargs={"tolerance": tol})
        if res is None:
            st.stop()
        st.session_state[run_key] = res
    res = st.session_state[run_key]
    st.subheader(f"Fitted profile {res['profile']}")
    st.dataframe(res["params"], hide_index=True, key="params")
    st.dataframe(res["quality"], hide_index=True, key="quality")
    r = res["residuals"][["kind", "measured_s", "predicted_s"]].rename(columns={"kind": "phase", "measured_s": "measured", "predicted_s": "predicted"})
    st.plotly_chart(charts.predicted_vs_measured_figure(r, "step time (fit)"), key="fit-chart")
    v = res["validation"]
    checks = calibration.checks_frame(v)
    passed = v["checks"] - v["failed"]
    (st.success if v["passed"] else st.error)(f"validation: {passed} of {v['checks']} checks within {tol:.0%}")
    st.dataframe(checks, hide_index=True, key="checks")
    a, b = st.columns(2)
    a.plotly_chart(charts.predicted_vs_measured_figure(calibration.series_frame(v, "ttft"), "TTFT"), key="val-ttft")
    b.plotly_chart(charts.predicted_vs_measured_figure(calibration.series_frame(v, "e2e"), "E2E"), key="val-e2e")
    st.download_button("Download validation report (HTML)", report.validation_html(v), "validation.html",
                       mime="text/html", key="val-report")
