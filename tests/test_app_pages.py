"""Every page of the app under streamlit.testing.v1.AppTest: it runs with defaults without exceptions,
and changing an input changes what it shows (asserted on elements and values).

Bad input (a model that does not fit, invalid probes, a missing bundle, a GPU without a source)
shows an inline st.error with the fix, never an exception.
"""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
import yaml
from streamlit.testing.v1 import AppTest

import hwdb
from app import ui
from tests import synthetic_bundle as tcf
from tests.conftest import REPO

APP = REPO / "app"
TIMEOUT = 240


@pytest.fixture(autouse=True)
def user_hwdb(tmp_path, monkeypatch):
    monkeypatch.setenv("EPDSIM_HWDB", str(tmp_path / "user-hwdb"))


def _page(name: str) -> AppTest:
    return AppTest.from_file(str(APP / name), default_timeout=TIMEOUT)


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _seconds(text: str) -> float:
    """A simulator.fmt duration ("412 ms", "1.23 s", "12.5 min"), its model error band after it if any
    ("412 ms (296–528)"), back in seconds."""
    num, unit = text.replace(",", "").split()[:2]
    return float(num) * {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}[unit]


def test_home_runs_default_and_reacts_to_rate():
    at = _page("Home.py").run()
    _ok(at)
    assert not at.error, [e.value for e in at.error]
    m = _metrics(at)
    assert m["SLO attainment"].endswith("%") and m["TTFT p50"].endswith("ms")
    assert m["cost per hour"] == "$8.50"  # 2 x H100 at the hwdb list price of $4.25/h
    assert "Llama-3.1-8B on 2× H100-SXM-80GB TP1 colocated" in [s.value for s in at.subheader]
    assert len(at.get("plotly_chart")) == 4  # the four latency CDFs
    at.radio(key="view").set_value("Time series").run()
    _ok(at)
    assert len(at.get("plotly_chart")) == 5  # throughput, batch, KV, queue, links
    tok = float(m["output tok/s"].replace(",", ""))
    at.number_input(key="rate-0").set_value(40.0).run()
    _ok(at)
    m2 = _metrics(at)
    # Twice the offered load on an unsaturated deployment: about twice the output rate.
    assert 1.6 < float(m2["output tok/s"].replace(",", "")) / tok < 2.2
    assert m2["TTFT p50"] != m["TTFT p50"]


def test_home_cards_show_percentiles_with_the_slo_and_an_overload_names_the_bottleneck():
    """Issue 18 item 7: p50 on the card, p90/p99 and the SLO target under it, short values (no
    truncated "144,492.…" ms), and a banner naming the bottleneck pool when the run is overloaded."""
    at = _page("Home.py").run()
    _ok(at)
    captions = [c.value for c in at.caption]
    assert any(c.startswith("p50 ") and "p90 " in c and "p99 " in c and "SLO ≤ 500 ms" in c for c in captions), captions
    # each percentile with its model error band: "p90 123 ms (88–157)"
    assert any(re.match(r"p50 [\d.]+ ms \([\d.]+–[\d.]+\) · p90 ", c) for c in captions), captions
    assert any("SLO ≤ 50.0 ms" in c for c in captions), captions
    assert any(c == "target 90% of requests" for c in captions), captions
    assert all(len(v) <= 10 for v in _metrics(at).values()), _metrics(at)
    assert not [e.value for e in at.error if "Overloaded" in e.value]
    at.number_input(key="rate-0").set_value(400.0).run()
    _ok(at)
    m = _metrics(at)
    assert all(len(v) <= 10 for v in m.values()), m
    banners = [e.value for e in at.error if "Overloaded" in e.value]
    assert banners and "Bottleneck: main (2x H100-SXM-80GB TP1, colocated)" in banners[0], [e.value for e in at.error]


def test_home_tables_view_says_what_it_shows_and_offers_full_downloads():
    """Issue 18 item 8: the page shows 1,000 of 4,000 requests and says so; the downloads hold them all."""
    at = _page("Home.py").run()
    at.radio(key="view").set_value("Tables").run()
    _ok(at)
    assert any("first 1,000 of 4,000 requests" in c.value for c in at.caption), [c.value for c in at.caption]
    labels = [b.proto.label for b in at.get("download_button")]
    assert "requests CSV (4,000 rows)" in labels
    assert {"requests Parquet", "summary JSON", "scenario YAML"} <= set(labels)


def test_log_scale_toggles_on_home_and_compare():
    at = _page("Home.py").run()
    at.toggle(key="log-axes").set_value(True).run()
    _ok(at)
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert len(specs) == 4 and all(s["layout"]["xaxis"]["type"] == "log" for s in specs)
    cmp = _page("pages/1_Compare.py").run()
    cmp.toggle(key="cmp-log").set_value(True).run()
    _ok(cmp)
    assert any(
        json.loads(c.proto.spec)["layout"].get("yaxis", {}).get("type") == "log" for c in cmp.get("plotly_chart")
    )


def test_home_pd_layout_and_prices():
    at = _page("Home.py").run()
    at.radio(key="layout-0").set_value("pd").run()
    _ok(at)
    assert any("prefill" in s.value and "decode" in s.value for s in at.subheader)
    at.number_input(key="price-H100-SXM-80GB-0").set_value(2.0).run()
    _ok(at)
    assert _metrics(at)["cost per hour"] == "$4.00"  # 1 prefill + 1 decode GPU at $2/h


def test_home_model_that_does_not_fit_is_an_inline_error():
    at = _page("Home.py").run()
    at.selectbox(key="model-0").set_value("Llama-3.1-405B").run()
    _ok(at)
    assert at.error, "expected an inline error for 405B on one H100"
    msg = at.error[0].value
    assert "pools[main]" in msg and ("tp" in msg or "GPU" in msg or "memory" in msg)
    assert not at.metric


def test_compare_presets():
    at = _page("pages/1_Compare.py").run()
    _ok(at)
    df = at.dataframe[0].value
    assert {"colocated", "PD"} <= set(df.columns)
    assert df.loc["GPUs", "colocated"] == df.loc["GPUs", "PD"] == 2
    at.selectbox(key="preset").set_value("engine generations").run()
    _ok(at)
    df = at.dataframe[0].value
    assert {"vllm-v0", "vllm-v1", "sglang"} <= set(df.columns)
    # V0 runs the CPU side of a step in series with the GPU: its TPOT is the highest of the three.
    assert df.loc["TPOT p50 (s)", "vllm-v0"] > max(df.loc["TPOT p50 (s)", "vllm-v1"], df.loc["TPOT p50 (s)", "sglang"])
    assert len(at.get("plotly_chart")) >= 3


def test_epd_scenario_breakdown_images_and_compare():
    """A multimodal E+PD scenario: encoder phases appear in the breakdown, fewer images per request
    shorten TTFT, and the deployment comparison adds an E+PD column."""
    d = yaml.safe_load((REPO / "examples" / "epd_images_epd.yaml").read_text())
    at = _page("Home.py")
    at.session_state["scenario"] = d
    at.run()
    _ok(at)
    assert at.radio(key="layout-0").value == "e+colocated"
    at.radio(key="view").set_value("Breakdown").run()
    phases = list(at.dataframe[0].value["phase"])
    assert {"encode", "embedding_transfer", "prefill", "decode"} <= set(phases)
    ttft6 = _seconds(_metrics(at)["TTFT p50"])
    at.number_input(key="images-0").set_value(1).run()
    _ok(at)
    assert _seconds(_metrics(at)["TTFT p50"]) < ttft6
    cmp = _page("pages/1_Compare.py")
    cmp.session_state["scenario"] = d
    cmp.run()
    _ok(cmp)
    df = cmp.dataframe[0].value
    assert {"colocated", "PD", "E+PD"} <= set(df.columns)
    assert df.loc["GPUs", "E+PD"] == 8  # the example's 4 encoders + TP4 LM


def test_operations_crash_loop_then_startup_probe():
    at = _page("pages/3_Operations.py").run()
    _ok(at)
    m = _metrics(at)
    start = float(m["start to API ready"].removesuffix(" s"))
    # Llama-3.1-8B from NVMe on a cold compile cache takes about a minute (the sourced phases of
    # docs/operations.md): the default liveness probe gives up at 30 s + 2 x 10 s and kills it again and again.
    assert start > 30 + 2 * 10
    assert at.error and "Crash loop" in at.error[0].value and "CrashLoopBackOff" in at.error[0].value
    at.checkbox(key="sp-on").check().run()
    at.number_input(key="sp-3").set_value(60).run()  # 10 s x 59 = 590 s of patience
    _ok(at)
    assert not at.error and at.success and "ready at" in at.success[0].value
    at.selectbox(key="ops-model").set_value("Llama-3.1-70B").run()
    at.selectbox(key="ops-tp").set_value(4).run()
    _ok(at)
    assert float(_metrics(at)["start to API ready"].removesuffix(" s")) > start
    assert not at.error and at.success and "ready at" in at.success[0].value  # the startup probe holds
    at.number_input(key="lp-2").set_value(20).run()  # timeoutSeconds >= periodSeconds
    _ok(at)
    assert at.error and "timeoutSeconds" in at.error[0].value and "Fix" in at.error[0].value


def test_hardware_add_gpu(tmp_path):
    at = _page("pages/5_Hardware.py").run()
    _ok(at)
    n = len(at.dataframe[0].value)
    at.text_input(key="gpu-name").set_value("Lab-GPU-96")
    at.button[0].click().run()  # no source: refused inline
    assert at.error and "source" in at.error[0].value
    at.text_input(key="gpu-source").set_value("our lab's datasheet (test)")
    at.button[0].click().run()
    _ok(at)
    assert at.success and "Lab-GPU-96" in at.success[0].value
    assert len(at.dataframe[0].value) == n + 1
    assert (tmp_path / "user-hwdb" / "gpus" / "Lab-GPU-96.yaml").is_file()


def test_calibration_page_reads_bundles_only_under_its_roots(tmp_path, monkeypatch):
    monkeypatch.delenv("EPDSIM_BUNDLE_ROOTS", raising=False)
    at = _page("pages/4_Calibration.py").run()
    at.radio(key="bundle-source").set_value("folder").run()
    at.text_input(key="bundle").set_value("/etc").run()
    _ok(at)
    assert at.error and "outside the folders this app reads bundles from" in at.error[0].value
    assert "passwd" not in at.error[0].value and "root:" not in at.error[0].value


def test_calibration_page_errors_inline(tmp_path, monkeypatch):
    monkeypatch.setenv("EPDSIM_BUNDLE_ROOTS", str(tmp_path))
    at = _page("pages/4_Calibration.py").run()
    _ok(at)
    at.radio(key="bundle-source").set_value("folder").run()
    assert at.info  # asks for a bundle
    at.text_input(key="bundle").set_value(str(tmp_path / "nope")).run()
    _ok(at)
    assert at.error and "does not exist" in at.error[0].value


def test_calibration_page_fits_and_validates_a_bundle(tmp_path, monkeypatch):
    monkeypatch.setenv("EPDSIM_BUNDLE_ROOTS", str(tmp_path))
    tiny = tmp_path / "tiny-llama"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(tcf.TINY_CONFIG))
    (tiny / "epdsim.yaml").write_text(yaml.safe_dump({"name": "tiny-llama", "source": "test"}))
    hw = tcf.write_truth_hwdb(tmp_path / "truth-hw", tiny, tcf.CPU_TRUTH, hwdb.load())
    bundle = tcf.make_bundle(tmp_path / "bundle", hw, tiny)
    at = _page("pages/4_Calibration.py").run()
    at.radio(key="bundle-source").set_value("folder").run()
    at.text_input(key="bundle").set_value(str(bundle)).run()
    _ok(at)
    assert _metrics(at)["model"] == "tiny-llama"
    at.button(key="fit").click().run()
    _ok(at)
    params = at.dataframe[1].value.set_index("parameter")
    # The synthetic bundle was measured on a known profile: the fit recovers its step overhead.
    assert params.loc["step_overhead_s", "value"] == pytest.approx(tcf.CPU_TRUTH["step_overhead_s"], rel=0.15)
    verdict = (at.success or at.error)[0].value
    assert "checks within 25%" in verdict


def test_plan_page_runs_the_planner():
    at = _page("pages/2_Plan.py").run()
    _ok(at)
    assert at.button(key="plan-run")  # nothing runs until asked
    at.number_input(key="plan-verify").set_value(1)
    at.number_input(key="plan-requests").set_value(100)
    at.multiselect(key="plan-tp").set_value([1])
    at.multiselect(key="plan-gpus").set_value(["L40S"]).run()
    at.button(key="plan-run").click().run()
    _ok(at)
    assert at.success or at.warning
    if at.success:
        assert "L40S" in at.success[0].value
    pareto = at.dataframe[0].value
    assert len(pareto) >= 1 and set(pareto["layout"].str.contains("L40S")) == {True}
    assert any(e.label.startswith("vllm/") for e in at.expander)


def test_home_html_report_prepares_and_offers_the_download():
    at = _page("Home.py").run()
    at.button(key="make-report").click().run()
    _ok(at)
    downloads = [b for b in at.get("download_button") if b.proto.label == "Download HTML report"]
    assert len(downloads) == 1
    at.radio(key="view").set_value("Time series").run()  # a rerun keeps the prepared report on offer
    _ok(at)
    assert [b for b in at.get("download_button") if b.proto.label == "Download HTML report"]


def test_home_removing_a_bad_trace_restores_the_workload():
    at = _page("Home.py").run()
    before = _metrics(at)
    good = b"arrival_s,input_tokens,output_tokens\n" + b"".join(b"%d,300,40\n" % i for i in range(50))
    at.file_uploader(key="upload-trace-0").set_value(("good.csv", good, "text/csv")).run()
    _ok(at)
    assert not at.error and _metrics(at) != before
    # Replacing the good trace by a bad one, then removing it, goes back past both to the workload before.
    bad = b"arrival_s,input_tokens,output_tokens\n0.0,100,20\n0.5,lots,20\n"
    at.file_uploader(key="upload-trace-0").set_value(("trace.csv", bad, "text/csv")).run()
    _ok(at)
    assert at.error and "trace.csv" in at.error[0].value and not at.metric
    at.file_uploader(key="upload-trace-0").set_value(None).run()
    _ok(at)
    assert not at.error, [e.value for e in at.error]
    assert at.number_input(key="rate-0").value == 20.0 and at.number_input(key="nreq-0").value == 4000
    assert _metrics(at) == before  # the default scenario again (cached run)


def test_result_tables_format_fractions_as_percentages_and_seconds_with_units():
    cc = ui.column_config(
        pd.DataFrame(
            {"attainment": [0.9872], "ttft_s": [0.1], "cost_usd_per_hour": [8.5], "layout": ["x"], "gpus": [2]}
        )
    )
    assert cc["attainment"]["type_config"]["format"] == "percent"
    assert cc["ttft_s"]["type_config"]["format"] == "%.3f s"
    assert cc["cost_usd_per_hour"]["type_config"]["format"] == "dollar"
    assert "layout" not in cc and "gpus" not in cc


def test_plan_page_band_edge_checkbox_sets_the_request_option():
    at = _page("pages/2_Plan.py").run()
    _ok(at)

    def yaml_of():  # the request YAML expander
        return "\n".join(c.value for c in at.code)

    assert "slo_at_band_edge" not in yaml_of()
    at.checkbox(key="plan-band-edge").check().run()
    _ok(at)
    assert "slo_at_band_edge: true" in yaml_of()
