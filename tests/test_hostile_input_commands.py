"""Hostile input, part 4: numbers and names that used to slip through, and command arguments.

Numbers out of their physical range in a scenario and a plan request (each refused with the field,
the value and the range), control characters in names, output paths checked before a run, plan
fabrics that the database lacks, regress profiles and baselines named as the user gave them, a hwdb
folder given as one string, a user hardware folder that replaces a shipped GPU (a note, and the
shipped names still find it), and calibration plan counts (a 0 must not read as the default).  Same checks
as tests/test_hostile_input.py: exit code 2, no traceback, the words named, under 5 s
(:func:`tests.hostile.expect_user_error`).  Every number of every schema: tests/test_hostile_input_bounds.py.
"""

from __future__ import annotations

import errno
import sys

import pytest
import yaml

import app.cli
import hwdb
from calibration import cli as calibrate
from calibration.kernels import bench_fit as kernel_bench_fit
from calibration.pd import run as pd_run
from tests.hostile import GPU, PLAN, REPO, expect_user_error, put, run_main, scenario, setting

# A run of this many requests takes minutes: a refusal under 5 s came before it.
LONG = 2_000_000


# ---------------------------------------------------------------- numbers out of range


@pytest.mark.parametrize(
    "where,value,words",
    [
        (
            "kv_transfer.nic_Bps",
            1e-300,
            ["kv_transfer.nic_Bps", "1e-300", "from 1e8 to 1e12 bytes/s", "400 Gb/s = 50e9"],
        ),
        ("kv_transfer.nic_Bps", 1, ["kv_transfer.nic_Bps", "(got 1)", "from 1e8 to 1e12 bytes/s"]),
        ("kv_transfer.oversubscription", 1e308, ["kv_transfer.oversubscription", "1e+308", "from 1 to 64", "4:1"]),
        ("kv_transfer.pod_oversubscription", float("nan"), ["kv_transfer.pod_oversubscription", "nan", "from 1 to 64"]),
        ("kv_transfer.nodes_per_rack", 10**12, ["kv_transfer.nodes_per_rack", "from 1 to 4096 nodes"]),
        ("pools.0.encoder", {"tp_efficiency": {0: 0.5}}, ["pools[0].encoder.tp_efficiency key 0", "from 1 to 72 GPUs"]),
        ("pools.0.encoder", {"cache_bytes": 1e308}, ["pools[0].encoder.cache_bytes", "from 0 to 1e15 bytes"]),
        ("pools.0.engine", {"max_num_seqs": 10**15}, ["pools[0].engine.max_num_seqs", "from 1 to 1e6 sequences"]),
    ],
    ids=[
        "nic-1e-300",
        "nic-1",
        "oversubscription-1e308",
        "pod-oversubscription-nan",
        "nodes-per-rack-1e12",
        "tp-efficiency-key-0",
        "encoder-cache-1e308",
        "max-num-seqs-1e15",
    ],
)
def test_scenario_number_out_of_range(where, value, words, tmp_path, capsys):
    path = put(tmp_path, "s.yaml", yaml.safe_dump(setting(scenario(num_requests=LONG), where, value)))
    expect_user_error(["simulate", path], ["s.yaml", *words], capsys)


@pytest.mark.parametrize(
    "where,value,words",
    [
        ("gpus.0.price_usd_per_hour", 1e308, ["gpus[0].price_usd_per_hour", "1e+308", "from 0.01 to 10000 US dollars"]),
        ("gpus.0.max_gpus", -1, ["gpus[0].max_gpus", "(got -1)", "from 1 to 4096 GPUs"]),
        ("constraints.tp", [1, 0], ["constraints.tp[1]", "(got 0)", "from 1 to 72 GPUs", "[1, 2, 4, 8]"]),
        ("search.goodput_max_factor", float("inf"), ["search.goodput_max_factor", "above 1 up to 100"]),
    ],
    ids=["price-1e308", "max-gpus-negative", "tp-0", "goodput-factor-inf"],
)
def test_plan_number_out_of_range(where, value, words, tmp_path, capsys):
    path = put(tmp_path, "plan.yaml", yaml.safe_dump(setting(PLAN, where, value)))
    expect_user_error(["plan", path], ["plan.yaml", *words], capsys)


# ---------------------------------------------------------------- control characters

TITLE = "a\x1b]0;title\x07b"


@pytest.mark.parametrize("where", ["name", "pools.0.name", "pools.0.gpu", "description"])
def test_control_characters_are_refused_and_never_printed(where, tmp_path, capsys):
    """ESC ] 0 ; ... BEL retitles a terminal: refused at validation, and the message shows it escaped."""
    path = put(tmp_path, "s.yaml", setting(scenario(), where, TITLE))
    out = expect_user_error(
        ["simulate", path], ["s.yaml", where.rsplit(".", 1)[-1], repr(TITLE), "control character", "remove it"], capsys
    )
    assert "\x1b" not in out and "\x07" not in out


def test_control_characters_in_a_hardware_file(tmp_path, capsys):
    d = yaml.safe_load(GPU)
    d["name"], d["aliases"] = "Lab\x1b[2JGPU", []
    put(tmp_path, "hw/gpus/lab.yaml", d)
    out = expect_user_error(
        ["hw", "list", "gpus", "--hwdb", tmp_path / "hw"], ["lab.yaml", "name", "control character"], capsys
    )
    assert "\x1b" not in out


def test_tab_and_newline_stay_allowed_in_text(tmp_path, capsys):
    path = put(tmp_path, "s.yaml", setting(scenario(num_requests=5), "description", "two\nlines\tand a tab"))
    rc, out, _ = run_main(["simulate", path], capsys)
    assert rc == 0, out


# ---------------------------------------------------------------- output paths, before the run


def test_report_to_a_device_is_refused_before_the_run(tmp_path, capsys):
    path = put(tmp_path, "s.yaml", scenario(num_requests=LONG))
    expect_user_error(
        ["simulate", path, "--report", "/dev/full"],
        ["--report /dev/full", "not a regular file", "give the path of a file"],
        capsys,
    )


@pytest.mark.parametrize(
    "option,make,words",
    [
        ("--out", lambda t: put(t, "blocker", "x") / "out", ["--out", "blocker is a file, not a folder"]),
        ("--out", lambda t: put(t, "file.txt", "x"), ["--out", "file.txt", "is a file, not a folder"]),
        ("--report", lambda t: t, ["--report", "is a folder", "give the path of the file"]),
        ("--report", lambda t: put(t, "blocker", "x") / "r.html", ["--report", "blocker is a file, not a folder"]),
    ],
    ids=["out-under-a-file", "out-is-a-file", "report-is-a-folder", "report-under-a-file"],
)
def test_output_paths_are_checked_before_the_run(option, make, words, tmp_path, capsys):
    path = put(tmp_path, "s.yaml", scenario(num_requests=LONG))
    expect_user_error(["simulate", path, option, make(tmp_path)], words, capsys)


def test_a_write_that_fails_after_the_run_names_the_option(tmp_path, capsys, monkeypatch):
    """A disk that fills during the run: the option and path are named, not a bare Errno."""

    def full(*_a, **_k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(app.cli, "write_simulation_report", full)
    path = put(tmp_path, "s.yaml", scenario(num_requests=5))
    expect_user_error(
        ["simulate", path, "--report", tmp_path / "r.html"],
        ["--report", "r.html", "No space left", "the disk is full"],
        capsys,
    )


def test_plan_artefacts_folder_is_checked_before_the_plan(tmp_path, capsys):
    path = put(tmp_path, "plan.yaml", PLAN)
    expect_user_error(
        ["plan", path, "--artefacts", put(tmp_path, "blocker", "x") / "art"],
        ["--artefacts", "blocker is a file, not a folder"],
        capsys,
    )


# ---------------------------------------------------------------- plan fabrics


@pytest.mark.parametrize(
    "fabrics,words",
    [
        ({"links": ["nope"]}, ["fabrics.links[0]", "unknown link 'nope'", "Known links: aws-efa", "ib-ndr", "--hwdb"]),
        ({"links": [None, "ib-ndr", "nope2"]}, ["fabrics.links[2]", "'nope2'", "Known links"]),
        ({"connector": "carrier-pigeon"}, ["fabrics.connector", "'carrier-pigeon'", "Known connectors: example"]),
        ({"links": [3]}, ["fabrics.links[0]", "(got 3)", "a link name (ib-ndr", "null for each GPU's own NIC"]),
        ({"links": [["ib-ndr"]]}, ["fabrics.links[0]", "not ['ib-ndr']", "epdsim hw list links"]),
        ({"links": []}, ["fabrics.links", "non-empty list", "not []", "e.g. [null, ib-ndr]"]),
        ({"connector": 5}, ["fabrics.connector", "(got 5)", "name of a KV connector", "nixl"]),
    ],
    ids=[
        "unknown-link",
        "third-link",
        "unknown-connector",
        "link-a-number",
        "link-a-list",
        "no-links",
        "connector-a-number",
    ],
)
def test_plan_fabric_the_database_lacks(fabrics, words, tmp_path, capsys):
    """An unknown link is the request's error (exit 2) naming the request file, not a candidate that "misses
    the SLO" (exit 1); an empty list is refused too, since it would try no fabric and drop PD silently."""
    path = put(tmp_path, "plan.yaml", setting(PLAN, "fabrics", fabrics))
    expect_user_error(["plan", path], [str(path), *words], capsys)


@pytest.mark.parametrize(
    "gpus,words",
    [
        ([{"name": "H100"}, {"name": "H999"}], ["gpus[1].name", "unknown GPU 'H999'", "Known GPUs: A100"]),
        (["H100"], ["gpus[0]", "(got 'H100')", "a GPU offer is a mapping such as {name: H100"]),
        ({"name": "H100"}, ["gpus", "not {'name': 'H100'}", "must list the GPU types", "e.g. [{name: H100}"]),
        ([], ["gpus", "not []", "must list the GPU types"]),
        ([{"name": ["H100"]}], ["gpus[0].name", "valid string", "(got ['H100'])"]),
        ([{"name": "H100", "max_gpus": -1}], ["gpus[0].max_gpus", "(got -1)", "from 1 to 4096 GPUs"]),
        (
            [{"name": "H100", "price_usd_per_hour": float("nan")}],
            ["gpus[0].price_usd_per_hour", "(got nan)", "from 0.01 to 10000 US dollars"],
        ),
    ],
    ids=["unknown-gpu", "bare-name", "one-mapping", "none", "name-a-list", "negative-max-gpus", "nan-price"],
)
def test_plan_gpu_offers_that_make_no_sense(gpus, words, tmp_path, capsys):
    path = put(tmp_path, "plan.yaml", setting(PLAN, "gpus", gpus))
    expect_user_error(["plan", path], [str(path), *words], capsys)


@pytest.mark.parametrize(
    "where,value,words",
    [
        ("model", "NopeModel", ["model", "unknown model 'NopeModel'", "Known models", "Llama-3.1-8B"]),
        ("constraints.max_gpus", -4, ["constraints.max_gpus", "(got -4)", "from 1 to 4096 GPUs"]),
        ("constraints.tp", [-1], ["constraints.tp[0]", "(got -1)", "from 1 to 72 GPUs"]),
        ("search.verify", -2, ["search.verify", "(got -2)", "from 0 to 1000 candidates"]),
    ],
    ids=["unknown-model", "negative-max-gpus", "negative-tp", "negative-verify"],
)
def test_plan_request_names_and_counts_out_of_place(where, value, words, tmp_path, capsys):
    path = put(tmp_path, "plan.yaml", setting(PLAN, where, value))
    expect_user_error(["plan", path], [str(path), *words], capsys)


# ---------------------------------------------------------------- regress


def _suite(tmp):
    put(tmp, "s.yaml", scenario(num_requests=10))
    return put(
        tmp,
        "suite.yaml",
        {"name": "hostile", "entries": [{"id": "one", "scenario": "s.yaml", "figures": {"ttft_p50_s": None}}]},
    )


def test_compare_profiles_names_the_users_file(tmp_path, capsys):
    text = (REPO / "hwdb/data/profiles/H100-SXM-80GB_vllm-0.24.0.yaml").read_text()
    mine = put(tmp_path, "mine.yaml", text.replace("step_overhead_s: null", "step_overhead_s: -1"))
    out = expect_user_error(
        ["regress", _suite(tmp_path), "--compare-profiles", mine, mine],
        [str(mine), "step_overhead_s", "from 0 to 10 s"],
        capsys,
    )
    assert "epdsim-regress-" not in out


def test_baseline_that_is_a_folder(tmp_path, capsys):
    (tmp_path / "base").mkdir()
    out = expect_user_error(
        ["regress", _suite(tmp_path), "--baseline", tmp_path / "base"],
        ["base", "is a directory", "give the path of the regress baseline file"],
        capsys,
    )
    assert "does not exist" not in out


def test_baseline_update_into_a_folder_is_refused_before_the_run(tmp_path, capsys):
    (tmp_path / "base").mkdir()
    expect_user_error(
        ["regress", _suite(tmp_path), "--baseline", tmp_path / "base", "--update"],
        ["base", "is a folder", "give the path of the file"],
        capsys,
    )


# ---------------------------------------------------------------- hardware folders


@pytest.mark.parametrize("command,base", [("simulate", scenario()), ("plan", PLAN)])
def test_hwdb_given_as_one_string_is_one_folder(command, base, tmp_path, capsys):
    path = put(tmp_path, "in.yaml", {**base, "hwdb": "/nonexistent"})
    out = expect_user_error(
        [command, path, *(["--quiet"] if command == "plan" else [])],
        [
            "'/nonexistent'",
            "does not exist",
            "Create it or fix the path",
            "the hwdb list of the scenario or plan request",
        ],
        capsys,
    )
    assert "'n'" not in out


def _slow_h100(tmp):
    """A user folder redefining the shipped H100-SXM-80GB at 1 GB/s, without its aliases."""
    d = yaml.safe_load(GPU)
    d["aliases"] = []
    d["memory_bandwidth_Bps"]["value"] = 1e9
    put(tmp, "hw/gpus/H100-SXM-80GB.yaml", d)
    return tmp / "hw"


def test_user_folder_replacing_a_shipped_gpu_is_said_and_keeps_its_names(tmp_path, capsys):
    """The issue's case: H100-SXM-80GB redefined at 1 GB/s.  Every answer changes, so a note names the file
    and what it replaces; the shipped aliases (H100) still lead to the GPU, now the user's."""
    _slow_h100(tmp_path)
    path = put(tmp_path, "s.yaml", scenario(num_requests=5))
    rc, out, _ = run_main(["simulate", path, "--hwdb", tmp_path / "hw", "--gpu", "H100"], capsys)
    assert rc == 0, out
    assert "note:" in out and "replaces the GPU 'H100-SXM-80GB'" in out and "H100-SXM-80GB.yaml" in out
    assert hwdb.load([tmp_path / "hw"]).gpu("H100").memory_bandwidth_Bps.value == 1e9


@pytest.mark.parametrize(
    "argv",
    [
        lambda t: ["vision", "Qwen2.5-VL-7B", "--gpu", "H100"],
        lambda t: ["coldstart", "Llama-3.1-8B", "--gpu", "H100"],
        lambda t: ["probes", "Llama-3.1-8B", "--gpu", "H100"],
        lambda t: ["perf", "Llama-3.1-8B", "--gpu", "H100"],
        lambda t: ["regress", _suite(t), "--baseline", t / "b.json", "--update"],
    ],
    ids=["vision", "coldstart", "probes", "perf", "regress"],
)
def test_every_command_notes_a_user_folder_replacing_a_gpu(argv, tmp_path, capsys):
    """Each command that takes --hwdb answers with the user's GPU, so each says so."""
    rc, out, _ = run_main([*argv(tmp_path), "--hwdb", _slow_h100(tmp_path)], capsys)
    assert rc == 0, out
    assert "note:" in out and "replaces the GPU 'H100-SXM-80GB'" in out and "H100-SXM-80GB.yaml" in out, out


def _module_main(main, argv, capsys) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out + out.err


@pytest.mark.parametrize(
    "run",
    [
        lambda t, hw, cap: run_main(["calibrate", "fit", t / "none", "--hwdb", hw], cap)[:2],
        lambda t, hw, cap: run_main(["calibrate", "validate", t / "none", "--profile", t / "none", "--hwdb", hw], cap)[
            :2
        ],
        lambda t, hw, cap: _module_main(pd_run.main, ["replay", t / "none", "--hwdb", hw], cap),
        lambda t, hw, cap: _module_main(
            kernel_bench_fit.main, [t / "none", "--gpu", "H100", "--out", t / "o", "--hwdb", hw], cap
        ),
    ],
    ids=["calibrate-fit", "calibrate-validate", "pd_run-replay", "kernel_bench_fit"],
)
def test_calibration_commands_note_a_user_folder_replacing_a_gpu(run, tmp_path, capsys):
    """The calibration commands that take --hwdb say so too, before the missing bundle stops them (exit 2)."""
    rc, out = run(tmp_path, _slow_h100(tmp_path), capsys)
    assert rc == 2, out
    assert "note:" in out and "replaces the GPU 'H100-SXM-80GB'" in out, out


def test_regress_notes_a_folder_a_suite_scenario_names(tmp_path, capsys):
    """A scenario of the suite may carry its own hwdb folder: the run uses it, so regress says so."""
    hw = _slow_h100(tmp_path)
    put(tmp_path, "s.yaml", {**scenario(num_requests=10), "hwdb": [str(hw)]})
    suite = put(
        tmp_path,
        "suite.yaml",
        {"name": "hostile", "entries": [{"id": "one", "scenario": "s.yaml", "figures": {"ttft_p50_s": None}}]},
    )
    rc, out, _ = run_main(["regress", suite, "--baseline", tmp_path / "b.json", "--update"], capsys)
    assert rc == 0, out
    assert out.count("replaces the GPU 'H100-SXM-80GB'") == 1, out


def test_shipped_data_alone_has_no_notes():
    assert hwdb.load().notes == ()


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--prefill-repeats", "0"], "--prefill-repeats 0: each value must be from 1 to 1,000"),
        (["--decode-concurrency", "1,0"], "--decode-concurrency 1,0: each value must be from 1 to 4,096"),
        (["--decode-rounds", "0"], "--decode-rounds 0: each value must be from 1 to 1,000"),
        (["--load-rates", "nan"], "--load-rates nan: each value must be from 0.0001 to 10,000"),
        (["--load-prompt", "50:10"], "--load-prompt 50:10: each value must be from 1 to 10,000,000 with LO <= HI"),
    ],
)
def test_calibration_plan_counts_are_bounded_before_a_launch(argv, words, tmp_path, capsys):
    """A 0 read as "the default" would be a silent wrong plan; nothing is launched for any of them."""
    marker = tmp_path / "launched"
    serve = f"{sys.executable} -c \"open('{marker}', 'w')\""
    assert (
        calibrate.main(
            ["run", "--out", str(tmp_path / "b"), "--serve-cmd", serve, "--url", "http://127.0.0.1:9", *argv]
        )
        == 2
    )
    assert words in " ".join(capsys.readouterr().err.split())
    assert not marker.exists()
