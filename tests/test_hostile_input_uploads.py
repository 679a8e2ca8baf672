"""Hostile input, part 2 continued: the app's upload sandbox.  An uploaded scenario may read only files
uploaded with it (not /etc/passwd, not ../..), upload file names and YAML are checked, a plan upload and a
model config.json stay in their folder, each session gets a private folder, and a hardware upload cannot
silently replace a shipped entry.

Each refusal is an InputError within 5 s whose message shows nothing of the file it refused to read.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import yaml

from app.services import hardware, planning, scenarios
from app.services.scenarios import InputError
from tests.hostile import GPU, LAUGHS, PLAIN_HEAD, PLAN, scenario, with_cfg


def _app_error(fn, *args, **kw) -> str:
    t0 = time.monotonic()
    with pytest.raises(InputError) as info:
        fn(*args, **kw)
    assert time.monotonic() - t0 < 5.0
    msg = str(info.value)
    assert "root:" not in msg and "Traceback" not in msg  # nothing of /etc/passwd is shown
    return msg


SANDBOX_CASES = {
    "trace-etc-passwd": ("workload", {"arrival": {"kind": "trace", "path": "/etc/passwd"}}, "workload.arrival.path"),
    "trace-dotdot": (
        "workload",
        {"arrival": {"kind": "trace", "path": "../../../../etc/passwd"}},
        "workload.arrival.path",
    ),
    "empirical-lengths": (
        "workload",
        {
            "arrival": {"kind": "poisson", "rate": 1},
            "num_requests": 5,
            "input_length": {"kind": "empirical", "path": "/etc/passwd", "column": "root"},
            "output_length": {"kind": "fixed", "value": 5},
        },
        "workload.input_length.path",
    ),
    "pairs": (
        "workload",
        {
            "arrival": {"kind": "poisson", "rate": 1},
            "num_requests": 5,
            "lengths": {"kind": "pairs", "path": "/etc/passwd", "input_column": "a", "output_column": "b"},
        },
        "workload.lengths.path",
    ),
    "hwdb-etc": ("hwdb", ["/etc"], "hwdb[0]"),
    "model-etc": ("model", "/etc", "model"),
    "model-json": ("model", "/proc/self/environ.json", "model"),
}


@pytest.mark.parametrize("case", sorted(SANDBOX_CASES))
def test_uploaded_scenario_reads_only_its_own_files(case, tmp_path):
    key, value, field = SANDBOX_CASES[case]
    data = yaml.safe_dump({**scenario(), key: value}).encode()
    msg = _app_error(scenarios.parse_yaml_upload, "up.yaml", data, folder=tmp_path)
    assert "up.yaml" in msg and field in msg and "outside the files uploaded" in msg


def test_uploaded_scenario_may_name_a_trace_uploaded_with_it(tmp_path):
    d = scenario()
    d["workload"] = {"arrival": {"kind": "trace", "path": "mine.csv"}, "num_requests": 2}
    got = scenarios.parse_yaml_upload(
        "up.yaml",
        yaml.safe_dump(d).encode(),
        folder=tmp_path,
        files=(("mine.csv", (PLAIN_HEAD + "0,5,5\n1,5,5\n").encode()),),
    )
    assert got["workload"]["arrival"]["path"] == str(tmp_path / "mine.csv")


@pytest.mark.parametrize(
    "name,words",
    [("..", "not a usable file name"), ("a\x00b.csv", "NUL"), ("x" * 300 + ".csv", "255 bytes"), ("", "not a usable")],
    ids=["dotdot", "nul", "long", "empty"],
)
def test_upload_file_names(name, words, tmp_path):
    assert words in _app_error(scenarios.save_upload, "traces", name, b"x", folder=tmp_path)


@pytest.mark.parametrize("case", ["billion-laughs", "duplicate-key", "utf16", "deep"])
def test_upload_yaml_checks(case, tmp_path):
    data = {
        "billion-laughs": LAUGHS.encode(),
        "duplicate-key": b"model: a\nmodel: b\n",
        "utf16": "model: a\n".encode("utf-16"),
        "deep": b"model: " + b"[" * 20000,
    }[case]
    assert "up.yaml" in _app_error(scenarios.parse_yaml_upload, "up.yaml", data, folder=tmp_path)
    assert "up.yaml" in _app_error(planning.parse_upload, "up.yaml", data, folder=tmp_path)


def test_plan_upload_is_sandboxed(tmp_path):
    req = {**copy.deepcopy(PLAN), "hwdb": ["/etc"]}
    assert "hwdb[0]" in _app_error(planning.parse_upload, "plan.yaml", yaml.safe_dump(req).encode(), folder=tmp_path)


def test_config_upload_stays_in_its_folder(tmp_path):
    cfg = {**with_cfg(), "_name_or_path": "../../.."}
    path = Path(scenarios.model_from_config_upload("config.json", json.dumps(cfg).encode(), folder=tmp_path))
    assert tmp_path in path.parents
    msg = _app_error(
        scenarios.model_from_config_upload,
        "config.json",
        json.dumps(with_cfg(num_attention_heads=0)).encode(),
        folder=tmp_path,
    )
    assert "num_attention_heads" in msg


def test_uploads_go_to_a_private_folder_per_session():
    a, b = scenarios.new_upload_dir(), scenarios.new_upload_dir()
    try:
        assert a != b and (a.stat().st_mode & 0o077) == 0
    finally:
        a.rmdir()
        b.rmdir()


def test_hardware_upload_cannot_silently_replace_shipped_entries(tmp_path):
    shipped = GPU.replace("memory_bandwidth_Bps: {value:", "memory_bandwidth_Bps: {value: 0, x:", 0)
    msg = _app_error(hardware.add_yaml, "gpus", "h100.yaml", GPU.encode(), user_dir=tmp_path)
    assert "replace the shipped" in msg and not (tmp_path / "gpus").exists()
    bad = yaml.safe_load(GPU)
    bad["memory_bandwidth_Bps"]["value"] = 0
    msg = _app_error(
        hardware.add_yaml, "gpus", "h100.yaml", yaml.safe_dump(bad).encode(), user_dir=tmp_path, override=True
    )
    assert "memory_bandwidth_Bps" in msg
    assert shipped  # the explicit override is the only way, and even then the schema applies
    saved = hardware.add_yaml("gpus", "h100.yaml", GPU.encode(), user_dir=tmp_path, override=True)
    assert saved.exists()
