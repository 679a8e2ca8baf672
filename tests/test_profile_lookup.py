"""Calibration profiles are looked up by the key they store: GPU, engine, engine version, model."""

from __future__ import annotations

import yaml

import hwdb
from hwdb.profiles import version_matches
from simulator.confidence import assess, describe
from simulator.resolved import resolve
from simulator.scenario import load_scenario
from tests.conftest import REPO

SHIPPED = "H100-SXM-80GB_vllm-0.24.0"


def _folder(tmp_path, *profiles: dict):
    """A user hwdb folder holding copies of the shipped H100 profile with the given fields changed."""
    base = yaml.safe_load((REPO / f"hwdb/data/profiles/{SHIPPED}.yaml").read_text())
    (tmp_path / "profiles").mkdir()
    for p in profiles:
        (tmp_path / "profiles" / f"{p['name']}.yaml").write_text(yaml.safe_dump({**base, **p}))
    return hwdb.load([tmp_path])


def test_version_match_is_exact_or_a_release_line():
    assert version_matches("0.11", "0.11") and version_matches("0.11.2", "0.11")
    assert not version_matches("0.110", "0.11") and not version_matches("0.11", "0.11.2")


def test_lookup_honours_version_then_falls_back_to_newest_and_says_so(tmp_path):
    """An older profile of the asked version beats a newer one of another; none of it: the newest, reported."""
    db = _folder(tmp_path, {"name": "h100-v011", "engine_version": "0.11.3", "created": "2020-01-01"})
    exact = db.find_profile("H100-SXM-80GB", "vllm", "0.11")
    assert exact.profile.name == "h100-v011" and exact.fallback == ""  # older, but of that version
    assert db.profile_for("H100-SXM-80GB", "vllm").name == SHIPPED  # no version: newest
    other = db.find_profile("H100-SXM-80GB", "vllm", "0.9")
    assert other.profile.name == SHIPPED and "no vllm 0.9 profile" in other.fallback
    assert db.find_profile("H100-SXM-80GB", "sglang", "0.5").profile is None  # engine honoured


def test_a_model_specific_profile_serves_only_its_model(tmp_path):
    db = _folder(tmp_path, {"name": "h100-tiny", "model": "tiny-llama", "created": "2030-01-01"})
    assert db.profile_for("H100-SXM-80GB", "vllm", model="tiny-llama").name == "h100-tiny"
    assert db.profile_for("H100-SXM-80GB", "vllm", model="Llama-3.1-8B").name == SHIPPED  # never another's
    assert db.profile_for("H100-SXM-80GB", "vllm").name == "h100-tiny"  # no model given: newest of all


def test_scenario_reports_the_version_fallback():
    """The default scenario runs vLLM V1 (0.19); the shipped H100 profile is fitted under 0.24.0."""
    scn = load_scenario(REPO / "examples/llama8b_h100_chat.yaml")
    pools = resolve(scn).pools
    dep = pools[0].dep
    assert dep.profile.name == SHIPPED
    status = assess(dep)
    assert "vllm 0.24.0" in status["profile_fallback"] and "vllm 0.19" in status["profile_fallback"]
    assert status["profile_fallback"] in describe(status)
