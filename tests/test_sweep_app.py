"""The Sweep page (app/pages/6_Sweep.py) under AppTest, and its service (app/services/sweep.py)."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from app.services import scenarios, sweep
from tests.conftest import REPO

PAGE = str(REPO / "app" / "pages" / "6_Sweep.py")


@pytest.fixture(autouse=True)
def user_hwdb(tmp_path, monkeypatch):
    monkeypatch.setenv("EPDSIM_HWDB", str(tmp_path / "user-hwdb"))


def test_page_runs_a_small_rate_sweep_and_shows_the_charts_the_knee_and_the_table():
    at = AppTest.from_file(PAGE, default_timeout=240).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.button(key="sweep-run") and not at.get("plotly_chart")  # nothing runs until asked
    at.checkbox(key="sweep-auto").uncheck().run()
    at.text_input(key="sweep-rates").set_value("5,30,150")
    at.number_input(key="sweep-requests").set_value(600).run()
    at.button(key="sweep-run").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert len(at.get("plotly_chart")) == 2
    table = at.dataframe[0].value
    assert list(table["offered req/s"]) == ["5.00", "30.00", "150.00"]
    assert "knee" in list(table["knee"]) and list(table["knee"])[-1] == "saturated"
    assert (at.success or at.warning) and "knee at " in (at.success or at.warning)[0].value
    assert any(b.label == "sweep CSV" for b in at.get("download_button"))


def test_page_knob_sweep_and_bad_values_inline():
    at = AppTest.from_file(PAGE, default_timeout=240).run()
    at.radio(key="sweep-mode").set_value("one knob").run()
    assert "pools[0].instances" in at.selectbox(key="sweep-knob").options[0]
    at.selectbox(key="sweep-knob").set_value("pools[0].tp").run()
    at.text_input(key="sweep-values-pools[0].tp").set_value("1,3").run()
    assert not at.exception
    assert at.error and "knob pools[0].tp=3" in at.error[0].value and "KV heads" in at.error[0].value
    assert "sweep-run" not in [b.key for b in at.button]  # no run of a bad sweep
    at.text_input(key="sweep-values-pools[0].tp").set_value("1,2")
    at.number_input(key="sweep-requests").set_value(100).run()
    at.button(key="sweep-run").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert list(at.dataframe[0].value["pools[0].tp"]) == ["1", "2"]
    assert len(at.get("plotly_chart")) == 2 and not at.success


def test_service_offers_the_scenarios_own_knobs_and_refuses_bad_rates():
    chat = scenarios.default_scenario()
    ks = sweep.knobs(chat)
    assert "pools[0].tp" in ks and "operations.startup.compile_cache" not in ks
    ops = scenarios.example("autoscale_step_load.yaml")
    ks = sweep.knobs(ops)
    assert {
        "operations.startup.compile_cache",
        "operations.startup.provisioning_s",
        "operations.autoscale.main.target_queue",
    } <= set(ks)
    assert ks["operations.autoscale.main.target_queue"][0].startswith("main: scale-up threshold")
    with pytest.raises(scenarios.InputError, match="rates 0: a rate must be a positive"):
        sweep.check(chat, rates="0,1")
    with pytest.raises(scenarios.InputError, match="the auto ladder: the scenario's arrivals are kind 'shaped'"):
        sweep.check(ops, rates="auto")
    prep = sweep.check(ops, knob="operations.startup.compile_cache=none,persistent", num_requests=100)
    assert [p.value for p in prep.points] == ["none", "persistent"]
