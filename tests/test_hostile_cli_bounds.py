"""Hostile input, part 5 (issue 33): bandwidths, ratios and prices out of any physical range, command
options that would disarm a gate or write nowhere, and control characters a message would print.

Grouped by area: numbers of the PD network and the plan offers (each refused with field, value and
range; the property test draws its fields and ranges from the schemas' declared bounds, so a new
bounded field of these blocks is covered without a new test), ``validate-e2e`` options, output
paths checked before a run and named when a write fails after it, and control characters from the
command line escaped in every error.  Same checks as the other hostile tests: exit code 2, no
traceback, the words named, under 5 s (:func:`tests.hostile.expect_user_error`).
"""

from __future__ import annotations

import errno
import math
from typing import Annotated, get_args, get_origin

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import app.report
import simulator.plan.runner
from calibration.e2e import score as e2e
from calibration.e2e.rows import DEFAULT_TABLE
from simulator.bounds import Range
from simulator.epd.epd_config import EmbeddingTransferConfig
from simulator.errors import escape_controls
from simulator.ops.opsconfig import LinkDegradationConfig
from simulator.pd.pd_config import KVTransferConfig
from simulator.plan.request import GpuOffer
from tests.hostile import PLAN, expect_user_error, put, run_main, scenario, setting

# A run of this many requests takes minutes: a refusal under 5 s came before it.
LONG = 2_000_000
HOSTILE = (0, -1, -1e308, 1e308, math.inf, -math.inf, math.nan, 1e-300)


def _disk_full(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


# ---------------------------------------------------------------- numbers: PD network and plan offers


@pytest.mark.parametrize(
    "where,value,words",
    [
        ("kv_transfer.bandwidth_factor", 1e-300, ["kv_transfer.bandwidth_factor", "1e-300", "from 0.001 to 1", "down"]),
        ("kv_transfer.bandwidth_Bps", 1000, ["kv_transfer.bandwidth_Bps", "(got 1000)", "from 1e7 to 1e14 bytes/s"]),
        ("kv_transfer.oversubscription", 65, ["kv_transfer.oversubscription", "(got 65)", "from 1 to 64", "4:1"]),
        ("kv_transfer.pod_oversubscription", 1e308, ["kv_transfer.pod_oversubscription", "from 1 to 64"]),
        ("embedding_transfer.bandwidth_Bps", 1, ["embedding_transfer.bandwidth_Bps", "(got 1)", "from 1e7 to 1e14"]),
        (
            "operations.faults.link_degradation",
            {"mtbf_s": 60, "duration_s": 10, "bandwidth_factor": 1e-300},
            ["link_degradation.bandwidth_factor", "1e-300", "from 0.001 to 1"],
        ),
    ],
    ids=[
        "factor-1e-300",
        "instance-bandwidth-1kB",
        "oversubscription-65",
        "pod-oversubscription-1e308",
        "embedding-bandwidth-1",
        "fault-factor-1e-300",
    ],
)
def test_scenario_network_number_out_of_range(where, value, words, tmp_path, capsys):
    path = put(tmp_path, "s.yaml", yaml.safe_dump(setting(scenario(num_requests=LONG), where, value)))
    expect_user_error(["simulate", path], ["s.yaml", *words], capsys)


@pytest.mark.parametrize(
    "value,shown", [(0, "(got 0)"), (1e-300, "(got 1e-300)"), (1e308, "(got 1e+308)")], ids=["zero", "1e-300", "1e308"]
)
def test_plan_offer_price_out_of_range(value, shown, tmp_path, capsys):
    """A zero price makes every candidate cost nothing and the recommendation arbitrary."""
    path = put(tmp_path, "plan.yaml", setting(PLAN, "gpus.0.price_usd_per_hour", value))
    expect_user_error(
        ["plan", path],
        ["plan.yaml", "gpus[0].price_usd_per_hour", shown, "from 0.01 to 10000 US dollars per GPU-hour", "amortised"],
        capsys,
    )


def test_the_ends_of_the_ranges_are_accepted():
    kv = KVTransferConfig(
        oversubscription=64, pod_oversubscription=1, bandwidth_factor=1e-3, bandwidth_Bps=1e7, nic_Bps=1e8
    )
    assert (kv.oversubscription, kv.bandwidth_factor, kv.bandwidth_Bps) == (64, 1e-3, 1e7)
    assert EmbeddingTransferConfig(bandwidth_Bps=1e14).bandwidth_Bps == 1e14
    assert GpuOffer(name="H100", price_usd_per_hour=0.01).price_usd_per_hour == 0.01
    with pytest.raises(ValidationError, match="from 1 to 64"):
        KVTransferConfig(oversubscription=64.5)


def _range(ann) -> Range | None:
    """The Range declared in a field's annotation (through Optional), for a plain number field only."""
    if get_origin(ann) is Annotated:
        base, *meta = get_args(ann)
        hit = next((m for m in meta if isinstance(m, Range)), None)
        return hit if base in (int, float) else None
    return next((r for r in map(_range, get_args(ann)) if r is not None), None)


# A valid block to put each value into (required fields; racks_per_pod needs nodes_per_rack).
BASES = {
    KVTransferConfig: {"nodes_per_rack": 4},
    EmbeddingTransferConfig: {},
    GpuOffer: {"name": "H100"},
    LinkDegradationConfig: {"mtbf_s": 600, "duration_s": 60, "bandwidth_factor": 0.2},
}
BOUNDED = [
    (model, name, rng)
    for model in BASES
    for name, info in model.model_fields.items()
    if (rng := next((m for m in info.metadata if isinstance(m, Range)), None) or _range(info.annotation))
]


def test_the_schema_walk_finds_the_bounded_fields():
    names = {f"{m.__name__}.{n}" for m, n, _ in BOUNDED}
    assert {
        "KVTransferConfig.nic_Bps",
        "KVTransferConfig.oversubscription",
        "KVTransferConfig.bandwidth_factor",
        "KVTransferConfig.bandwidth_Bps",
        "KVTransferConfig.gpus_per_nic",
        "GpuOffer.price_usd_per_hour",
        "GpuOffer.max_gpus",
        "EmbeddingTransferConfig.bandwidth_Bps",
        "LinkDegradationConfig.bandwidth_factor",
    } <= names, sorted(names)


def _outside(rng: Range):
    below = st.floats(min_value=-1e308, max_value=rng.lo, exclude_max=not rng.lo_open)
    above = st.floats(min_value=rng.hi, max_value=1e308, exclude_min=True)
    ints = st.integers(min_value=int(rng.hi) + 1, max_value=10**20) if rng.whole else st.nothing()
    return st.sampled_from([v for v in HOSTILE if not rng.contains(v)]) | below | above | ints


def _inside(rng: Range):
    if rng.whole:
        return st.integers(min_value=int(rng.lo), max_value=int(rng.hi))
    return st.floats(min_value=rng.lo, max_value=rng.hi, exclude_min=rng.lo_open)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_bounded_fields_refuse_outside_and_keep_inside(data):
    """0, negatives, 1e308, infinities, NaN, 1e-300 and random values beyond either end are refused at
    the field with its range in the message; values inside the range are kept as given."""
    model, name, rng = data.draw(st.sampled_from(BOUNDED), label="field")
    bad = data.draw(_outside(rng), label="outside")
    with pytest.raises(ValidationError) as info:
        model.model_validate({**BASES[model], name: bad})
    hits = [e for e in info.value.errors() if e["loc"] == (name,)]
    assert hits and rng.text() in hits[0]["msg"], (name, bad, info.value.errors())
    good = data.draw(_inside(rng), label="inside")
    assert getattr(model.model_validate({**BASES[model], name: good}), name) == good


# ---------------------------------------------------------------- validate-e2e options


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--engine", "nope"], ["--engine", "'nope'", "vllm", "sglang", "trtllm"]),
        (["--max-ttft-mape", "nan"], ["--max-ttft-mape", "nan", "finite number above 0 up to 10"]),
        (["--max-tpot-mape", "nan"], ["--max-tpot-mape", "nan", "finite number"]),
        (["--max-ttft-mape", "inf"], ["--max-ttft-mape", "inf", "finite number"]),
        (["--max-tpot-mape", "-0.1"], ["--max-tpot-mape", "-0.1", "above 0 up to 10"]),
        (["--max-tpot-mape", "0"], ["--max-tpot-mape", "above 0"]),
        (["--table", "/dev/zero"], ["--table /dev/zero", "not a regular file", "CSV"]),
    ],
    ids=["engine", "ttft-nan", "tpot-nan", "ttft-inf", "tpot-negative", "tpot-zero", "table-device"],
)
def test_validate_e2e_refuses_options_that_disarm_or_misread(argv, words, capsys, monkeypatch):
    monkeypatch.setattr(e2e, "predict", _never_ran)
    expect_user_error(["validate-e2e", *argv], words, capsys)


def _never_ran(*_a, **_k):
    raise AssertionError("the simulations started before the options were checked")


@pytest.mark.parametrize(
    "option,make,words",
    [
        ("--out", lambda t: put(t, "blocker", "x") / "o", ["--out", "blocker is a file, not a folder"]),
        ("--write-bands", lambda t: "/dev/full", ["--write-bands /dev/full", "not a regular file"]),
        ("--write-bands", lambda t: t, ["--write-bands", "is a folder", "give the path of the file"]),
    ],
    ids=["out-under-a-file", "bands-to-a-device", "bands-is-a-folder"],
)
def test_validate_e2e_outputs_are_checked_before_the_run(option, make, words, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(e2e, "predict", _never_ran)
    table = put(tmp_path, "rows.csv", "a,b\n1,2\n")
    expect_user_error(["validate-e2e", "--table", table, option, make(tmp_path)], words, capsys)


@pytest.mark.skipif(not DEFAULT_TABLE.is_file(), reason="../shared/data/e2e is absent (CI has it)")
def test_validate_e2e_names_its_output_when_the_disk_fills(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pd.DataFrame, "to_csv", _disk_full)
    expect_user_error(
        ["validate-e2e", "--sample", "100000", "--workers", "1", "--out", tmp_path / "o"],
        [f"--out {tmp_path / 'o'}", "No space left", "the disk is full"],
        capsys,
    )


# ---------------------------------------------------------------- output paths of report and plan


@pytest.mark.parametrize("kind", ["plan", "validation"])
def test_report_out_is_checked_before_anything_runs(kind, tmp_path, capsys):
    """The request does not even exist: the output is refused first, before a plan of minutes."""
    expect_user_error(
        ["report", kind, tmp_path / "absent.yaml", "--out", "/dev/full"],
        ["--out /dev/full", "not a regular file", "give the path of a file"],
        capsys,
    )
    expect_user_error(
        ["report", kind, tmp_path / "absent.yaml", "--out", put(tmp_path, "f", "x") / "r.html"],
        ["--out", "is a file, not a folder"],
        capsys,
    )


def test_report_names_its_output_when_the_write_fails(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(app.report, "write", _disk_full)
    src = put(tmp_path, "validation.json", "{}")
    monkeypatch.setattr(app.report, "validation_html", lambda data, plotly="inline": "<html></html>")
    expect_user_error(
        ["report", "validation", src, "--out", tmp_path / "r.html"],
        [f"--out {tmp_path / 'r.html'}", "No space left", "the disk is full"],
        capsys,
    )


TINY_PLAN = {
    "name": "tiny",
    "model": "Llama-3.1-8B",
    "workload": {
        "arrival": {"kind": "poisson", "rate": 4},
        "input_length": {"kind": "fixed", "value": 256},
        "output_length": {"kind": "fixed", "value": 32},
        "num_requests": 100,
    },
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "attainment": 0.9},
    "gpus": [{"name": "H100"}],
    "constraints": {"max_gpus": 1, "max_instances_per_pool": 1, "tp": [1], "families": ["colocated"]},
    "search": {
        "verify": 1,
        "borderline": 0,
        "verify_front": 0,
        "replications": 1,
        "requests": 100,
        "goodput_iterations": 1,
    },
}


def test_plan_names_its_out_folder_when_the_final_write_fails(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(simulator.plan.runner, "write_result", _disk_full)
    path = put(tmp_path, "plan.yaml", TINY_PLAN)
    expect_user_error(
        ["plan", path, "--workers", "1", "--quiet", "--out", tmp_path / "o"],
        [f"--out {tmp_path / 'o'}", "No space left", "the disk is full"],
        capsys,
    )


# ---------------------------------------------------------------- control characters

TITLE = "a\x1b]0;title\x07b"


@pytest.mark.parametrize(
    "argv",
    [
        ["perf", TITLE, "--gpu", "H100"],
        ["hw", "show", "gpu", TITLE],
        ["simulate", "--gpu", "H\x1b[2J"],
        ["plan", f"/nonexistent/{TITLE}.yaml"],
    ],
    ids=["perf-model", "hw-show", "simulate-gpu", "plan-path"],
)
def test_control_characters_from_the_command_line_are_escaped_in_errors(argv, capsys):
    """What the user typed comes back in the message: shown escaped, never acted on by the terminal."""
    out = expect_user_error(argv, [], capsys)
    assert "\x1b" not in out and "\x07" not in out, repr(out)
    assert "\\x1b" in out, out


@pytest.mark.parametrize("where", ["name", "gpus.0.name"])
def test_control_characters_in_plan_names_are_refused(where, tmp_path, capsys):
    path = put(tmp_path, "plan.yaml", setting(PLAN, where, TITLE))
    out = expect_user_error(["plan", path], ["plan.yaml", repr(TITLE), "control character", "remove it"], capsys)
    assert "\x1b" not in out and "\x07" not in out


def test_escape_controls_keeps_tab_newline_and_text():
    assert escape_controls("a\tb\nc é ✓") == "a\tb\nc é ✓"
    assert escape_controls("x\x1b[2J\r\x7f\x9by") == "x\\x1b[2J\\r\\x7f\\x9by"


def test_a_scenario_pool_name_with_a_title_sequence_is_refused(tmp_path, capsys):
    path = put(tmp_path, "s.yaml", setting(scenario(num_requests=LONG), "pools.0.name", TITLE))
    rc, out, _ = run_main(["simulate", path], capsys)
    assert rc == 2 and "pools[0]" in out and repr(TITLE) in out and "\x1b" not in out, out
