"""Issue 18 item 5: the scenario survives a refresh and travels: it lives in the page's link, saved YAML
carries no server paths, the name and description follow edits, and the seed is an input.

The link is read as carefully as an upload: a damaged, oversized or hostile link is an inline error and
the default scenario stays.
"""

from __future__ import annotations

import base64
import json
import zlib

import pytest
import yaml
from streamlit.testing.v1 import AppTest

from app.services import builder, scenarios, share
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def user_hwdb(tmp_path, monkeypatch):
    monkeypatch.setenv("EPDSIM_HWDB", str(tmp_path / "user-hwdb"))


def _home() -> AppTest:
    return AppTest.from_file(str(REPO / "app" / "Home.py"), default_timeout=240)


def _ok(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def test_link_round_trip_and_hostile_links():
    d = builder.set_workload(scenarios.default_scenario(), rate=33.0)
    text = share.encode(d)
    assert len(text) < 1500 and share.decode(text) == share.portable(d)
    with pytest.raises(scenarios.InputError, match="damaged"):
        share.decode(text[: len(text) // 2])
    evil = {**d, "workload": {"arrival": {"kind": "trace", "path": "/etc/passwd", "format": "plain"}}}
    raw = base64.urlsafe_b64encode(zlib.compress(json.dumps(evil).encode())).decode()
    with pytest.raises(scenarios.InputError, match="outside the files uploaded") as err:
        share.decode(raw)
    assert "root:" not in str(err.value)
    bomb = base64.urlsafe_b64encode(zlib.compress(b"[" * 5_000_000)).decode()
    with pytest.raises(scenarios.InputError, match="expands to over"):
        share.decode(bomb)
    with pytest.raises(scenarios.InputError, match="over the"):
        share.decode("A" * (share.MAX_URL_CHARS + 1))
    with pytest.raises(scenarios.InputError, match="not a scenario"):
        share.decode(base64.urlsafe_b64encode(zlib.compress(b"[1, 2]")).decode())


def test_portable_yaml_names_uploads_by_file_name_and_reloads_with_them(tmp_path):
    folder = scenarios.new_upload_dir()
    trace = b"arrival_s,input_tokens,output_tokens\n" + b"".join(b"%d,300,40\n" % i for i in range(20))
    path = scenarios.save_upload("traces", "mytrace.csv", trace, folder)
    d = {
        **scenarios.default_scenario(),
        "workload": scenarios.trace_workload(path, None, 20),
        "hwdb": [str(scenarios.user_hwdb_dir())],
    }
    text = share.portable_yaml(d)
    assert str(folder) not in text and "epdsim-uploads" not in text and str(scenarios.user_hwdb_dir()) not in text
    assert text.startswith("# Reads uploaded files by name: keep mytrace.csv beside this file")
    assert yaml.safe_load(text)["workload"]["arrival"]["path"] == "mytrace.csv" and "hwdb" not in yaml.safe_load(text)
    # uploaded again with its trace, it runs as before
    again = scenarios.parse_yaml_upload("s.yaml", text.encode(), files=(("mytrace.csv", trace),))
    assert scenarios.to_scenario(again).workload.arrival.limit == 20
    assert share.uploaded_files(d) == ["mytrace.csv"] and share.uploaded_files(again) == ["mytrace.csv"]


def test_the_link_restores_an_edited_scenario_after_a_refresh():
    at = _home().run()
    _ok(at)
    at.number_input(key="rate-0").set_value(30.0).run()
    at.number_input(key="seed-0").set_value(11).run()
    _ok(at)
    link = at.query_params["scenario"]
    link = link[0] if isinstance(link, list) else link
    assert share.decode(link)["workload"]["arrival"]["rate"] == 30.0
    before = _metrics(at)
    fresh = _home()  # a new session: the refresh, or a shared link
    fresh.query_params["scenario"] = link
    fresh.run()
    _ok(fresh)
    assert fresh.number_input(key="rate-0").value == 30.0 and fresh.number_input(key="seed-0").value == 11
    assert fresh.text_input(key="scn-name-0").value == at.text_input(key="scn-name-0").value
    assert _metrics(fresh) == before


def test_a_damaged_link_is_an_inline_error_and_the_default_scenario_runs():
    at = _home()
    at.query_params["scenario"] = "eJzLSM3JyVcozy_KSQEAGgQEXQ"[:9]
    at.run()
    _ok(at)
    assert at.error and "link" in at.error[0].value and "damaged" in at.error[0].value
    assert at.number_input(key="rate-0").value == 20.0 and _metrics(at)["TTFT p50"]


def test_name_and_description_follow_edits_until_the_user_types_their_own(monkeypatch):
    saved = []  # what "Save scenario YAML" offers, run by run
    real = share.portable_yaml
    monkeypatch.setattr(share, "portable_yaml", lambda d: saved.append(real(d)) or saved[-1])
    at = _home().run()
    assert at.text_input(key="scn-name-0").value == "llama8b-h100-chat"
    at.number_input(key="inst-0-colocated-0").set_value(3).run()
    _ok(at)
    name, desc = at.text_input(key="scn-name-0").value, at.text_area(key="scn-desc-0").value
    assert name == "Llama-3.1-8B-3xH100-SXM-80GB-TP1" and "3x H100-SXM-80GB TP1 colocated" in desc
    assert "Poisson 20 req/s" in desc and "2x H100" not in desc
    last = yaml.safe_load(saved[-1])
    assert last["name"] == name and last["description"] == desc
    at.text_input(key="scn-name-0").set_value("my-three-gpus").run()
    at.number_input(key="rate-0").set_value(25.0).run()
    _ok(at)
    assert at.text_input(key="scn-name-0").value == "my-three-gpus"  # typed: kept
    assert "Poisson 25 req/s" in at.text_area(key="scn-desc-0").value  # not typed: follows
    assert at.session_state["scenario"]["name"] == "my-three-gpus"
    at.text_input(key="scn-name-0").set_value("").run()  # cleared: automatic again
    assert at.text_input(key="scn-name-0").value == "Llama-3.1-8B-3xH100-SXM-80GB-TP1"


def test_seed_changes_the_draws_and_is_saved():
    at = _home().run()
    p50 = _metrics(at)["TTFT p50"], _metrics(at)["output tok/s"]
    at.number_input(key="seed-0").set_value(8).run()
    _ok(at)
    assert at.session_state["scenario"]["seed"] == 8
    assert (_metrics(at)["TTFT p50"], _metrics(at)["output tok/s"]) != p50
    at.number_input(key="seed-0").set_value(7).run()
    assert (_metrics(at)["TTFT p50"], _metrics(at)["output tok/s"]) == p50  # the same seed, the same run
