"""``epdsim regress``: reruns give no drift, a slower calibration profile fails with the figures named,
JUnit XML names each figure, and bad suites or baselines are clear errors."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simulator.cli import main
from simulator.regress import Tolerance, compare, load_suite, rows_frame, run_suite
from simulator.resolved import resolve
from simulator.scenario import parse_scenario
from tests.conftest import REPO

PROFILE = REPO / "hwdb" / "data" / "profiles" / "H100-SXM-80GB_vllm-0.24.0.yaml"
SCENARIO = {
    "name": "small-chat",
    "seed": 3,
    "model": "Llama-3.1-8B",
    "pools": [{"gpu": "H100", "tp": 1, "instances": 1}],
    "workload": {
        "arrival": {"kind": "poisson", "rate": 10},
        "input_length": {"kind": "fixed", "value": 512},
        "output_length": {"kind": "fixed", "value": 128},
        "num_requests": 300,
    },
    "slo": {"ttft_s": 0.2, "tpot_s": 0.010, "attainment": 0.9},
}
FIGURES = {
    "goodput_rps": {"rel": 0.05},
    "ttft_p99_s": None,
    "tpot_p50_s": None,
    "tpot_p99_s": None,
    "gpus": {"abs": 0},
    "cost_usd_per_hour": {"abs": 0.01},
}


def write_suite(folder: Path, name: str = "small-suite", **entry) -> Path:
    (folder / "scn.yaml").write_text(yaml.safe_dump(SCENARIO))
    e = {
        "id": "chat",
        "scenario": "scn.yaml",
        "seeds": [1, 2],
        "goodput": {"rate_hi": 80, "iterations": 6},
        "figures": FIGURES,
    } | entry
    path = folder / "suite.yaml"
    path.write_text(yaml.safe_dump({"name": name, "tolerance": {"rel": 0.02}, "entries": [e]}, sort_keys=False))
    return path


def slow_profile(folder: Path, factor: float = 0.8) -> Path:
    """A copy of the shipped H100 profile whose decode (memory) bandwidth efficiencies are ``factor`` times lower.

    Same name as the shipped profile, so in a user hwdb folder it replaces it.
    """
    data = yaml.safe_load(PROFILE.read_text())
    for key in ("memory_efficiency", "attention_decode_efficiency"):
        data[key]["max_eff"] = data[key]["max_eff"] * factor
    (folder / "profiles").mkdir(parents=True)
    out = folder / "profiles" / PROFILE.name
    out.write_text(yaml.safe_dump(data))
    return out


def regress(capsys, *args) -> tuple[int, str, str]:
    code = main(["regress", *map(str, args)])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out, out.err


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> tuple[Path, Path]:
    """A suite and its baseline, written by ``--update`` on the current code (serially: --jobs 1)."""
    d = tmp_path_factory.mktemp("regress")
    suite = write_suite(d)
    assert main(["regress", str(suite), "--baseline", str(d / "baseline.json"), "--update", "--jobs", "1"]) == 0
    return suite, d / "baseline.json"


def test_unchanged_code_passes_twice_and_update_is_byte_identical(baseline, capsys, tmp_path):
    suite, base = baseline
    for jobs in ("1", "2"):  # serial and two worker processes give the same floats
        code, out, _ = regress(capsys, suite, "--baseline", base, "--jobs", jobs, "--junit", tmp_path / "j.xml")
        assert code == 0, out
        assert "6 held, 0 moved or new" in out
        cases = ET.parse(tmp_path / "j.xml").getroot().iter("testcase")
        assert all(c.find("failure") is None for c in cases)
    again = tmp_path / "again.json"
    assert main(["regress", str(suite), "--baseline", str(again), "--update", "--jobs", "2"]) == 0
    assert again.read_bytes() == base.read_bytes()


def test_twenty_percent_less_decode_bandwidth_fails_naming_figures(baseline, capsys, tmp_path):
    suite, base = baseline
    slow_profile(tmp_path / "hw")
    code, out, _ = regress(
        capsys,
        suite,
        "--baseline",
        base,
        "--hwdb",
        tmp_path / "hw",
        "--jobs",
        "1",
        "--junit",
        tmp_path / "j.xml",
        "--markdown",
        tmp_path / "s.md",
    )
    assert code == 1
    root = ET.parse(tmp_path / "j.xml").getroot()
    failing = {c.get("name") for c in root.iter("testcase") if c.find("failure") is not None}
    passing = {c.get("name") for c in root.iter("testcase") if c.find("failure") is None}
    # Decode is bandwidth-bound: TPOT rises and goodput against a TPOT SLO falls; the bill does not change.
    assert {"tpot_p50_s", "tpot_p99_s", "goodput_rps"} <= failing
    assert {"gpus", "cost_usd_per_hour"} <= passing and not passing & {"tpot_p50_s", "goodput_rps"}
    assert root.find("testsuite").get("failures") == str(len(failing))
    for name in failing:
        assert f"drift chat: {name} moved" in out
        assert f"| chat | {name} " in (tmp_path / "s.md").read_text()
    old = json.loads(base.read_text())["entries"]["chat"]["figures"]
    new = run_suite(load_suite(suite), (str(tmp_path / "hw"),), jobs=1)["chat"]
    assert new["tpot_p50_s"] > old["tpot_p50_s"] * 1.02 and new["goodput_rps"] < old["goodput_rps"]


def test_slow_profile_is_what_the_simulator_uses(tmp_path):
    """The copied profile replaces the shipped one: a decode step at a fixed batch, which only reads
    memory, is slower by more than nothing and by at most 1/0.8 (compute and overheads unchanged)."""
    slow_profile(tmp_path / "hw")
    scn = parse_scenario(SCENARIO)
    step = {hw: resolve(scn.model_copy(update={"hwdb": hw})).pools[0].step for hw in ((), (str(tmp_path / "hw"),))}
    for batch, ctx in ((1, 512), (16, 640), (64, 2048)):
        ratio = step[(str(tmp_path / "hw"),)].decode_time(batch, ctx) / step[()].decode_time(batch, ctx)
        assert 1.05 < ratio <= 1.25 + 1e-9, (batch, ctx, ratio)


def test_compare_profiles_names_what_a_refresh_moves(baseline, capsys, tmp_path):
    suite, _ = baseline
    slow = slow_profile(tmp_path / "hw")
    code, out, _ = regress(
        capsys, suite, "--compare-profiles", PROFILE, slow, "--jobs", "2", "--junit", tmp_path / "j.xml"
    )
    assert code == 1
    assert "tpot_p50_s moved" in out and "OLD H100-SXM-80GB_vllm-0.24.0.yaml" in out
    failing = {
        c.get("name") for c in ET.parse(tmp_path / "j.xml").getroot().iter("testcase") if c.find("failure") is not None
    }
    assert "tpot_p99_s" in failing and "gpus" not in failing
    # The same profile on both sides moves nothing.
    code, out, _ = regress(capsys, suite, "--compare-profiles", PROFILE, PROFILE, "--jobs", "1")
    assert code == 0 and "0 moved or new" in out


def test_compare_profiles_refuses_a_profile_that_would_not_be_used(baseline, capsys, tmp_path):
    suite, _ = baseline
    data = yaml.safe_load(PROFILE.read_text()) | {"name": "H100-older", "created": "2020-01-01"}
    other = tmp_path / "older.yaml"
    other.write_text(yaml.safe_dump(data))
    code, _, err = regress(capsys, suite, "--compare-profiles", PROFILE, other)
    assert code == 2 and "'H100-older'" in err and "would not be used" in err
    (tmp_path / "hw" / "profiles").mkdir(parents=True)
    (tmp_path / "hw" / "profiles" / "older.yaml").write_text(other.read_text())
    code, _, err = regress(capsys, suite, "--baseline", "unused.json", "--hwdb", tmp_path / "hw")
    assert code == 2 and "--hwdb: profile 'H100-older'" in err and "would not be used" in err


def test_junit_names_new_and_removed_figures(baseline, capsys, tmp_path):
    suite, base = baseline
    figures = {k: v for k, v in FIGURES.items() if k != "gpus"} | {"slo_attainment": {"abs": 0.01}}
    changed = write_suite(tmp_path, figures=figures)
    code, out, _ = regress(capsys, changed, "--baseline", base, "--jobs", "1", "--junit", tmp_path / "j.xml")
    assert code == 1 and "slo_attainment is not in the baseline" in out
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")}
    assert cases["slo_attainment"].find("failure").get("type") == "figure-new"
    assert cases["gpus"].find("skipped") is not None
    assert all(c.get("classname") == "small-suite.chat" for c in cases.values())


@pytest.mark.parametrize(
    "entry, words",
    [
        (
            {"scenario": "missing.yaml"},
            ["entries[0] (id 'chat').scenario", "'missing.yaml' does not exist", "scn.yaml"],
        ),
        ({"figures": {"ttft_p99": None}}, ["entries[0] (id 'chat').figures", "'ttft_p99'", "ttft_p99_s"]),
        ({"goodput": None}, ["goodput_rps needs goodput", "rate_hi"]),
        ({"figures": {"gpus": {}}}, ["figures.gpus", "needs abs, rel or both"]),
        (
            {
                "rate": 5,
                "override": {"workload": {"arrival": {"kind": "closed", "concurrency": 8}}},
                "goodput": None,
                "figures": {"gpus": None},
            },
            ["rate=5", "'closed'", "drop rate"],
        ),
        ({"override": {"pools": [{"gpu": "H100", "tp": 0}]}}, ["entries[0] (id 'chat').scenario", "tp"]),
        ({"colour": "red"}, ["entries[0] (id 'chat').colour", "unknown key", "valid keys here: figures, goodput"]),
        ({"goodput": {"rate_hi": 80, "iter": 3}}, ["entries[0] (id 'chat').goodput.iter", "iterations, rate_hi"]),
    ],
)
def test_bad_suite_is_a_clear_error(tmp_path, capsys, entry, words):
    suite = write_suite(tmp_path, **entry)
    code, out, err = regress(capsys, suite, "--baseline", tmp_path / "b.json")
    assert code == 2 and out == ""
    for w in words:
        assert w in err, err


def test_baseline_from_another_suite_is_a_clear_error(baseline, capsys, tmp_path):
    _, base = baseline
    other = write_suite(tmp_path, name="another-suite")
    for extra in ((), ("--update",)):  # --update must not overwrite another suite's baseline either
        code, _, err = regress(capsys, other, "--baseline", base, *extra)
        assert code == 2
        assert "belongs to suite 'small-suite'" in err and "is suite 'another-suite'" in err
    code, _, err = regress(capsys, other, "--baseline", tmp_path / "absent.json")
    assert code == 2 and "does not exist" in err and "--update" in err
    (tmp_path / "junk.json").write_text('{"figures": 1}')
    code, _, err = regress(capsys, other, "--baseline", tmp_path / "junk.json")
    assert code == 2 and "not an epdsim regress baseline" in err


def test_contradictory_options_are_clear_errors(baseline, capsys):
    suite, base = baseline
    code, _, err = regress(capsys, suite, "--baseline", base, "--jobs", "0")
    assert code == 2 and "--jobs 0" in err
    code, _, err = regress(capsys, suite, "--baseline", base, "--compare-profiles", PROFILE, PROFILE)
    assert code == 2 and "drop --baseline/--update" in err
    code, _, err = regress(capsys, suite)
    assert code == 2 and "give --baseline FILE" in err


def test_missing_suite_and_hwdb_folder(baseline, capsys, tmp_path):
    suite, base = baseline
    code, _, err = regress(capsys, tmp_path / "nope.yaml", "--baseline", base)
    assert code == 2 and "suite file" in err and "does not exist" in err
    code, _, err = regress(capsys, suite, "--baseline", base, "--hwdb", tmp_path / "nohw")
    assert code == 2 and "nohw" in err


@given(old=st.floats(-1e6, 1e6), d=st.floats(-1e3, 1e3), a=st.floats(0, 1e3), r=st.floats(0, 2))
def test_tolerance_holds_exactly_within_either_bound(old, d, a, r):
    new = old + d
    diff = abs(new - old)
    assert Tolerance(abs=a).holds(old, new) == (diff <= a)
    assert Tolerance(rel=r).holds(old, new) == (diff <= r * abs(old))
    assert Tolerance(abs=a, rel=r).holds(old, new) == (diff <= a or diff <= r * abs(old))
    assert Tolerance(abs=0).holds(old, old)
    assert not Tolerance(abs=a).holds(old, None) and Tolerance(abs=a).holds(None, None)


def test_compare_flags_a_redefined_entry(baseline, tmp_path):
    suite, base = baseline
    loaded = load_suite(write_suite(tmp_path, seeds=[1]))
    old = json.loads(base.read_text())
    rows = compare(loaded, old, {"chat": old["entries"]["chat"]["figures"]})
    assert all(r.redefined and r.status == "held" for r in rows)
    frame = rows_frame(rows)
    assert list(frame["figure"]) == list(FIGURES) and (frame["change"] == 0).all()


PLAN = {
    "name": "tiny-plan",
    "model": "Llama-3.1-8B",
    "workload": {
        "arrival": {"kind": "poisson", "rate": 12},
        "input_length": {"kind": "fixed", "value": 512},
        "output_length": {"kind": "fixed", "value": 128},
        "num_requests": 200,
    },
    "slo": {"ttft_s": 0.5, "tpot_s": 0.010, "attainment": 0.9},
    "gpus": [{"name": "H100"}],
    "constraints": {"max_gpus": 4, "max_instances_per_pool": 4, "tp": [1], "families": ["colocated"]},
    "search": {"verify": 2, "borderline": 1, "replications": 1, "requests": 200, "goodput_iterations": 3},
}


def test_plan_entry_holds_on_rerun_and_moves_with_a_slower_profile(capsys, tmp_path):
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(PLAN))
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        yaml.safe_dump(
            {
                "name": "plans",
                "entries": [
                    {
                        "id": "tiny",
                        "kind": "plan",
                        "request": "plan.yaml",
                        "figures": {
                            "recommended": None,
                            "recommended_gpus": {"abs": 0},
                            "recommended_cost_usd_per_hour": {"abs": 0.01},
                            "recommended_tpot_s": {"rel": 0.02},
                        },
                    }
                ],
            }
        )
    )
    base = tmp_path / "b.json"
    assert regress(capsys, suite, "--baseline", base, "--update")[0] == 0
    figs = json.loads(base.read_text())["entries"]["tiny"]["figures"]
    assert figs["recommended"].endswith("x H100-SXM-80GB TP1") and 1 <= figs["recommended_gpus"] <= 4
    assert figs["recommended_tpot_s"] <= PLAN["slo"]["tpot_s"]
    code, out, _ = regress(capsys, suite, "--baseline", base, "--jobs", "1")
    assert code == 0 and "4 held" in out
    # With 20 % less decode bandwidth p90 TPOT at 12 req/s on one TP1 H100 rises above 10 ms (9.3 ms
    # before), so the recommendation itself moves (more instances, smaller batches, or none).
    slow_profile(tmp_path / "hw")
    code, out, _ = regress(capsys, suite, "--baseline", base, "--hwdb", tmp_path / "hw", "--junit", tmp_path / "j.xml")
    assert code == 1
    failing = {
        c.get("name") for c in ET.parse(tmp_path / "j.xml").getroot().iter("testcase") if c.find("failure") is not None
    }
    assert {"recommended", "recommended_gpus"} <= failing


def test_plan_entry_errors_name_the_field(capsys, tmp_path):
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(PLAN | {"slo": {"attainment": 0.9}}))
    suite = tmp_path / "suite.yaml"
    entry = {"id": "tiny", "kind": "plan", "request": "plan.yaml", "figures": {"recommended": None}}
    suite.write_text(yaml.safe_dump({"name": "plans", "entries": [entry]}))
    code, _, err = regress(capsys, suite, "--baseline", tmp_path / "b.json")
    assert code == 2 and "entries[0] (id 'tiny').request" in err and "ttft_s, tpot_s or both" in err
    suite.write_text(yaml.safe_dump({"name": "plans", "entries": [entry | {"figures": {"goodput_rps": None}}]}))
    code, _, err = regress(capsys, suite, "--baseline", tmp_path / "b.json")
    assert code == 2 and "unknown plan figure(s) 'goodput_rps'" in err and "recommended_gpus" in err
    suite.write_text(yaml.safe_dump({"name": "plans", "entries": [entry | {"kind": "sweep"}]}))
    code, _, err = regress(capsys, suite, "--baseline", tmp_path / "b.json")
    assert code == 2 and "kind must be scenario (the default), plan or e2e" in err
