"""Issue 18 item 9: the inputs a user needs are on the page (weights dtype, PP, arrival process, seed,
shipped examples), the terms are defined where they are used, and two of your own configurations
compare in one click ("Pin for Compare", then the Compare page shows pinned vs current)."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.services import builder, glossary, scenarios
from tests.conftest import REPO
from tests.test_app_ops import expected_ops


@pytest.fixture(autouse=True)
def user_hwdb(tmp_path, monkeypatch):
    monkeypatch.setenv("EPDSIM_HWDB", str(tmp_path / "user-hwdb"))


def _home() -> AppTest:
    return AppTest.from_file(str(REPO / "app" / "Home.py"), default_timeout=240)


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_fp8_weights_make_a_model_fit_that_bf16_does_not():
    """The error for Llama-3.1-70B on two H100s names fp8 as a fix; the weights field applies it."""
    at = _home().run()
    at.number_input(key="rate-0").set_value(2.0)
    at.number_input(key="nreq-0").set_value(200)
    at.selectbox(key="model-0").set_value("Llama-3.1-70B")
    at.number_input(key="inst-0-colocated-0").set_value(1)
    at.selectbox(key="tp-0-colocated-0").set_value(2).run()
    _ok(at)
    assert at.error and "KV cache" in at.error[0].value and not at.metric
    at.selectbox(key="dtype-0-colocated-0").set_value("fp8").run()
    _ok(at)
    assert not at.error, [e.value for e in at.error]
    assert at.session_state["scenario"]["pools"][0]["dtype"] == "fp8" and _metrics(at)["TTFT p50"]


def test_pp_multiplies_the_gpus_and_the_cost():
    at = _home().run()
    assert _metrics(at)["cost per hour"] == "$8.50"
    at.selectbox(key="pp-0-colocated-0").set_value(2).run()
    _ok(at)
    assert at.session_state["scenario"]["pools"][0]["pp"] == 2
    assert _metrics(at)["cost per hour"] == "$17.00"  # 2 instances x TP1 x PP2 at $4.25/h
    at.selectbox(key="pp-0-colocated-0").set_value(1).run()
    assert "pp" not in at.session_state["scenario"]["pools"][0]  # back to the default: not written


def test_dp_attention_and_expert_parallel_for_a_moe_model():
    """Issue 15: the builder offers attention DP and EP; DP multiplies the GPUs of an instance, EP spans them."""
    at = _home().run()
    at.number_input(key="nreq-0").set_value(200)
    at.selectbox(key="model-0").set_value("Qwen3-30B-A3B")
    at.number_input(key="inst-0-colocated-0").set_value(1).run()
    _ok(at)
    one = float(_metrics(at)["cost per hour"].strip("$").replace(",", ""))
    at.selectbox(key="dp-0-colocated-0").set_value(2).run()
    _ok(at)
    at.selectbox(key="ep-0-colocated-1-2-0").set_value(2).run()
    _ok(at)
    pool = at.session_state["scenario"]["pools"][0]
    assert (pool["dp"], pool["ep"]) == (2, 2)
    assert not at.error, [e.value for e in at.error]
    assert float(_metrics(at)["cost per hour"].strip("$").replace(",", "")) == pytest.approx(2 * one)
    assert _metrics(at)["TTFT p50"]


def test_arrival_process_closed_loop_and_bursty():
    at = _home().run()
    poisson = _metrics(at)["TTFT p50"]
    at.selectbox(key="arrival-0").set_value("closed").run()
    _ok(at)
    assert at.session_state["scenario"]["workload"]["arrival"] == {"kind": "closed", "concurrency": 16}
    at.number_input(key="users-0").set_value(64).run()
    _ok(at)
    assert at.session_state["scenario"]["workload"]["arrival"]["concurrency"] == 64
    assert _metrics(at)["TTFT p50"] != poisson
    at.selectbox(key="arrival-0").set_value("gamma").run()
    at.number_input(key="cv-0").set_value(4.0).run()
    _ok(at)
    a = at.session_state["scenario"]["workload"]["arrival"]
    assert a["kind"] == "gamma" and a["cv"] == 4.0 and a["rate"] == 10.0
    assert not at.error, [e.value for e in at.error]


def test_set_arrival_keeps_the_rate_between_open_loops():
    d = builder.set_arrival(scenarios.default_scenario(), "gamma", cv=3.0)
    assert d["workload"]["arrival"] == {"kind": "gamma", "rate": 20.0, "cv": 3.0}
    assert builder.set_arrival(d, "poisson")["workload"]["arrival"] == {"kind": "poisson", "rate": 20.0}
    with pytest.raises(ValueError, match="choose one of"):
        builder.set_arrival(d, "fractal")


def test_terms_are_defined_where_they_are_used():
    at = _home().run()
    _ok(at)
    helps = at.radio(key="layout-0").help
    assert "E+PD" in helps and "E+P+D" in helps and "encoder" in helps
    assert "SLO target" in glossary.TERMS["SLO attainment"]
    fold = next(e for e in at.expander if e.label.startswith("What the terms mean"))
    text = " ".join(m.value for m in fold.markdown)
    for term in ("goodput", "families", "SLO attainment", "E+P+D", "TPOT"):
        assert f"**{term}**" in text, term
    plan = AppTest.from_file(str(REPO / "app" / "pages" / "2_Plan.py"), default_timeout=240).run()
    _ok(plan)
    assert "planner's kinds of deployment" in plan.multiselect(key="plan-families").help


def test_every_example_on_offer_loads_and_the_picker_replaces_the_scenario():
    for name in scenarios.EXAMPLES:
        scenarios.to_scenario(scenarios.example(name), origin=name, sandboxed=True)
    at = _home().run()
    at.selectbox(key="example-0").set_value("fp8_decode_crashes_pd.yaml").run()
    _ok(at)
    assert at.radio(key="layout-1").value == "pd"
    assert at.text_input(key="scn-name-1").value == "fp8-decode-crashes-pd"
    assert at.selectbox(key="dtype-0-pd-1").value == "fp8"
    assert "Operations" in at.radio(key="view").options
    assert _metrics(at)["crashes"] == expected_ops("fp8_decode_crashes_pd.yaml")["crashes"]


def test_pin_then_compare_two_of_your_own_configurations():
    at = _home().run()
    at.button(key="pin-home").click().run()
    _ok(at)
    at.number_input(key="inst-0-colocated-0").set_value(3).run()
    at.switch_page("pages/1_Compare.py").run()
    _ok(at)
    assert at.selectbox(key="preset").value == "pinned vs current"
    df = at.dataframe[0].value
    assert [c for c in df.columns if c not in ("best", "better")] == [
        "llama8b-h100-chat",
        "current: Llama-3.1-8B-3xH100-SXM-80GB-TP1",
    ]
    assert df.loc["GPUs"].tolist()[:2] == [2, 3]
    assert (
        df.loc["TTFT p50 (s)", "current: Llama-3.1-8B-3xH100-SXM-80GB-TP1"]
        < df.loc["TTFT p50 (s)", "llama8b-h100-chat"]
    )
