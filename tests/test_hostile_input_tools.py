"""Hostile input, part 2: hardware folders, plan requests, regress suites and baselines, calibration
bundles, command-line numbers, messages printed literally, and the real entry point in a subprocess.
The app's upload sandbox: tests/test_hostile_input_uploads.py.

Same checks as tests/test_hostile_input.py: exit code 2, no traceback, the file or field named, under
5 s (:func:`tests.hostile.expect_user_error`).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from simulator.inputs import parse_yaml
from simulator.regress.compare import FORMAT
from tests.hostile import GPU, LAUGHS, LINK, PLAN, REPO, expect_user_error, put, scenario, setting, with_cfg

# ---------------------------------------------------------------- hardware files


def hw_case(tmp: Path, files: dict[str, object]) -> Path:
    root = tmp / "hw"
    root.mkdir()
    for rel, content in files.items():
        if content is None:
            (root / rel).mkdir(parents=True)
        else:
            put(root, rel, content)
    return root


def gpu_with(**figures) -> str:
    d = yaml.safe_load(GPU)
    d["name"], d["aliases"] = "Lab-GPU", []
    for k, v in figures.items():
        if k == "peak_flops":
            d["peak_flops"]["bf16"]["value"] = v
        elif k == "price":
            d["price_usd_per_hour"]["value"] = v
        else:
            d[k]["value"] = v
    return yaml.safe_dump(d, sort_keys=False)


def link_with(**figures) -> str:
    d = yaml.safe_load(LINK)
    d["name"], d["aliases"] = "lab-link", []
    for k, v in figures.items():
        d[k]["value"] = v
    return yaml.safe_dump(d, sort_keys=False)


HW_CASES = {
    "gpu-zero-bandwidth": ({"gpus/lab.yaml": gpu_with(memory_bandwidth_Bps=0)}, ["lab.yaml", "memory_bandwidth_Bps"]),
    "gpu-zero-flops": ({"gpus/lab.yaml": gpu_with(peak_flops=0)}, ["lab.yaml", "peak_flops"]),
    "gpu-zero-memory": ({"gpus/lab.yaml": gpu_with(memory_bytes=0)}, ["lab.yaml", "memory_bytes"]),
    "gpu-zero-nvlink": ({"gpus/lab.yaml": gpu_with(intra_node_bandwidth_Bps=0)}, ["lab.yaml", "intra_node"]),
    "gpu-infinite-price": ({"gpus/lab.yaml": gpu_with(price=float("inf"))}, ["lab.yaml", "price_usd_per_hour"]),
    "gpu-nan-memory": ({"gpus/lab.yaml": gpu_with(memory_bytes=float("nan"))}, ["lab.yaml", "memory_bytes"]),
    "gpu-memory-1e-308": ({"gpus/lab.yaml": gpu_with(memory_bytes=1e-308)}, ["lab.yaml", "memory_bytes"]),
    "gpu-bandwidth-1e-308": (
        {"gpus/lab.yaml": gpu_with(memory_bandwidth_Bps=1e-308)},
        ["lab.yaml", "memory_bandwidth_Bps"],
    ),
    "gpu-flops-1e-308": ({"gpus/lab.yaml": gpu_with(peak_flops=1e-308)}, ["lab.yaml", "peak_flops"]),
    "gpu-memory-in-GB": ({"gpus/lab.yaml": gpu_with(memory_bytes=80)}, ["lab.yaml", "memory_bytes"]),
    "gpu-flops-true": ({"gpus/lab.yaml": gpu_with(peak_flops=True)}, ["lab.yaml", "yes/no value"]),
    "gpu-same-name-twice": ({"gpus/a.yaml": gpu_with(), "gpus/b.yaml": gpu_with()}, ["b.yaml", "Lab-GPU", "a.yaml"]),
    "gpu-duplicate-key": ({"gpus/lab.yaml": gpu_with() + "vendor: amd\n"}, ["lab.yaml", "duplicate key 'vendor'"]),
    "gpu-binary": ({"gpus/lab.yaml": b"\x00\xffGPU"}, ["lab.yaml", "binary"]),
    "gpu-file-is-folder": ({"gpus/lab.yaml": None}, ["lab.yaml", "is a directory"]),
    "gpu-billion-laughs": ({"gpus/lab.yaml": LAUGHS}, ["lab.yaml", "aliases"]),
    "link-zero-bandwidth": ({"links/l.yaml": link_with(bandwidth_Bps=0)}, ["l.yaml", "bandwidth_Bps"]),
    "link-zero-efficiency": ({"links/l.yaml": link_with(efficiency=0)}, ["l.yaml", "efficiency"]),
    "link-efficiency-above-1": ({"links/l.yaml": link_with(efficiency=3)}, ["l.yaml", "efficiency"]),
    "model-zero-heads": (
        {"models/m/config.json": json.dumps(with_cfg(num_attention_heads=0))},
        ["config.json", "num_attention_heads"],
    ),
}


@pytest.mark.parametrize("case", sorted(HW_CASES))
def test_hardware_folder(case, tmp_path, capsys):
    files, words = HW_CASES[case]
    expect_user_error(["hw", "list", "gpus", "--hwdb", hw_case(tmp_path, files)], words, capsys)


def test_hwdb_folder_missing_or_a_file(tmp_path, capsys):
    expect_user_error(["hw", "list", "--hwdb", tmp_path / "none"], ["none", "does not exist"], capsys)
    expect_user_error(["hw", "list", "--hwdb", put(tmp_path, "gpu.yaml", GPU)], ["gpu.yaml", "is a file"], capsys)


# ---------------------------------------------------------------- plan


@pytest.mark.parametrize(
    "case,change,words",
    [
        ("requests-1e9", {"search": {"requests": 10**9}}, ["search.requests"]),
        ("seed-negative", {"search": {"seed": -1}}, ["search.seed"]),
        (
            "rate-inf",
            {"workload": {**PLAN["workload"], "arrival": {"kind": "poisson", "rate": float("inf")}}},
            ["workload.arrival.rate"],
        ),
        ("slo-nan", {"slo": {"ttft_s": float("nan"), "tpot_s": 0.05}}, ["slo.ttft_s"]),
        ("no-gpus", {"gpus": []}, ["gpus"]),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_plan_request(case, change, words, tmp_path, capsys):
    path = put(tmp_path, "plan.yaml", {**copy.deepcopy(PLAN), **change})
    expect_user_error(["plan", path, "--quiet"], ["plan.yaml", *words], capsys)


@pytest.mark.parametrize(
    "argv,words",
    [(["--workers", "0"], ["--workers"]), (["--top", "-1"], ["--top"]), (["--workers", "many"], ["--workers"])],
    ids=["workers-0", "top-negative", "workers-text"],
)
def test_plan_flags(argv, words, capsys):
    expect_user_error(["plan", REPO / "examples" / "plan_llama8b.yaml", *argv], words, capsys)


def test_plan_files(tmp_path, capsys):
    expect_user_error(["plan", tmp_path], [str(tmp_path), "is a directory"], capsys)
    expect_user_error(["plan", put(tmp_path, "bl.yaml", LAUGHS)], ["bl.yaml", "billion laughs"], capsys)


# ---------------------------------------------------------------- regress


def suite(tmp: Path) -> Path:
    put(tmp, "s.yaml", scenario(num_requests=10))
    return put(
        tmp,
        "suite.yaml",
        {"name": "hostile", "entries": [{"id": "one", "scenario": "s.yaml", "figures": {"ttft_p50_s": None}}]},
    )


BASELINE_CASES = {
    "list": ([1, 2], "not an epdsim regress baseline"),
    "entries-list": ({"entries": []}, "not an epdsim regress baseline"),
    "entry-number": ({"entries": {"one": 5}}, "entries.one"),
    "figures-string": ({"entries": {"one": {"fingerprint": "x", "figures": "fast"}}}, "entries.one.figures"),
    "figure-string": (
        {"entries": {"one": {"fingerprint": "x", "figures": {"ttft_p50_s": "low"}}}},
        "entries.one.figures.ttft_p50_s",
    ),
    "fingerprint-list": ({"entries": {"one": {"fingerprint": [1], "figures": {}}}}, "entries.one.fingerprint"),
}


@pytest.mark.parametrize("case", sorted(BASELINE_CASES))
def test_regress_baseline(case, tmp_path, capsys):
    content, words = BASELINE_CASES[case]
    if isinstance(content, dict) and "format" not in content:
        content = {"format": FORMAT, "suite": "hostile", **content}
    base = put(tmp_path, "base.json", json.dumps(content))
    expect_user_error(["regress", suite(tmp_path), "--baseline", base], ["base.json", words], capsys)


@pytest.mark.parametrize("case", ["directory", "binary", "utf16", "not-json", "nan"])
def test_regress_baseline_file(case, tmp_path, capsys):
    p = tmp_path / "base.json"
    {
        "directory": lambda: p.mkdir(),
        "binary": lambda: p.write_bytes(b"\x00\x01"),
        "utf16": lambda: p.write_bytes('{"format": 1}'.encode("utf-16")),
        "not-json": lambda: p.write_text("{oops"),
        "nan": lambda: p.write_text('{"format": NaN}'),
    }[case]()
    expect_user_error(["regress", suite(tmp_path), "--baseline", p], ["base.json"], capsys)


@pytest.mark.parametrize("case", ["directory", "binary", "duplicate-key", "billion-laughs", "scenario-is-folder"])
def test_regress_suite_file(case, tmp_path, capsys):
    if case == "scenario-is-folder":
        (tmp_path / "s.yaml").mkdir()
        path = put(
            tmp_path,
            "suite.yaml",
            {"name": "x", "entries": [{"id": "a", "scenario": "s.yaml", "figures": {"ttft_p50_s": None}}]},
        )
        expect_user_error(["regress", path], ["s.yaml", "is a directory"], capsys)
        return
    p = tmp_path / "suite.yaml"
    {
        "directory": lambda: p.mkdir(),
        "binary": lambda: p.write_bytes(b"\x00name: x"),
        "duplicate-key": lambda: p.write_text("name: a\nname: b\n"),
        "billion-laughs": lambda: p.write_text(LAUGHS),
    }[case]()
    expect_user_error(["regress", p], ["suite.yaml"], capsys)


# ---------------------------------------------------------------- calibration bundles


def bundle(tmp: Path, manifest, records: str | None = None) -> Path:
    b = tmp / "bundle"
    (b / "records").mkdir(parents=True)
    put(b, "manifest.json", manifest if isinstance(manifest, (str, bytes)) else json.dumps(manifest))
    if records is not None:
        put(b, "records/p.jsonl", records)
    return b


GOOD_MANIFEST = {
    "schema_version": 1,
    "created": "2026-01-01T00:00:00Z",
    "mode": "attach",
    "model": {"served_name": "m"},
    "plan": [],
    "runs": [],
}
BUNDLE_CASES = {
    "not-a-bundle": (lambda t: t, ["manifest.json"]),
    "manifest-binary": (lambda t: bundle(t, b"\x00\x01"), ["manifest.json", "binary"]),
    "manifest-list": (lambda t: bundle(t, [1]), ["manifest.json", "JSON object"]),
    "manifest-folder": (
        lambda t: (t / "bundle" / "manifest.json").mkdir(parents=True) or t / "bundle",
        ["manifest.json", "is a directory"],
    ),
    "plan-string": (lambda t: bundle(t, {**GOOD_MANIFEST, "plan": "all"}), ["manifest.json", "plan"]),
    "runs-of-numbers": (lambda t: bundle(t, {**GOOD_MANIFEST, "runs": [1, 2]}), ["manifest.json", "runs[0]"]),
    "plan-without-name": (lambda t: bundle(t, {**GOOD_MANIFEST, "plan": [{"kind": "load"}]}), ["plan[0].name"]),
    "served-name-missing": (lambda t: bundle(t, {**GOOD_MANIFEST, "model": {}}), ["served_name"]),
    "record-list": (lambda t: bundle(t, GOOD_MANIFEST, "[1, 2]\n"), ["p.jsonl"]),
    "request-without-id": (
        lambda t: bundle(t, GOOD_MANIFEST, '{"kind": "request", "model": "m"}\n'),
        ["p.jsonl", "id"],
    ),
}


@pytest.mark.parametrize(
    "content,words",
    [(b"\x00\x01", "binary"), ("- a\n- b\n", "mapping"), ("name: a\nname: b\n", "duplicate key 'name'")],
    ids=["binary", "list", "duplicate-key"],
)
def test_calibration_profile_file(content, words, tmp_path, capsys):
    b = bundle(tmp_path, GOOD_MANIFEST)
    prof = put(tmp_path, "hw/profiles/p.yaml", content)
    expect_user_error(["calibrate", "validate", b, "--profile", prof], ["p.yaml", words], capsys)


@pytest.mark.parametrize("case", sorted(BUNDLE_CASES))
def test_calibration_bundle(case, tmp_path, capsys):
    make, words = BUNDLE_CASES[case]
    expect_user_error(["calibrate", "show", make(tmp_path)], words, capsys)


# ---------------------------------------------------------------- command-line numbers


@pytest.mark.parametrize(
    "argv,words",
    [
        (["probes", "Llama-3.1-8B", "--gpu", "H100", "--horizon", "inf"], ["--horizon"]),
        (["probes", "Llama-3.1-8B", "--gpu", "H100", "--horizon", "nan"], ["--horizon"]),
        (["probes", "Llama-3.1-8B", "--gpu", "H100", "--horizon", "0"], ["--horizon"]),
        (["probes", "Llama-3.1-8B", "--gpu", "H100", "--horizon", "1e300"], ["--horizon"]),
        (["coldstart", "Llama-3.1-8B", "--gpu", "H100", "--tp", "0"], ["--tp"]),
        (["pd-crossover", "Llama-3.1-8B", "--gpu", "H100", "--prompt", "0"], ["--prompt"]),
        (["pd-crossover", "Llama-3.1-8B", "--gpu", "H100", "--prompt", "1000000"], ["--prompt", "max_model_len"]),
        (["pd-crossover", "Llama-3.1-8B", "--gpu", "H100", "--tp", "0"], ["--tp"]),
        (["pd-crossover", "Llama-3.1-8B", "--gpu", "H100", "--tp", "3"], ["tp=3"]),
        (["perf", "Llama-3.1-8B", "--gpu", "H100", "--pp", "0"], ["--pp"]),
        (["vision", "Qwen2.5-VL-7B", "--tp-times", "2=1e999"], ["--tp-times", "2=1e999"]),
        (["vision", "Qwen2.5-VL-7B", "--tp-times", "2=nan"], ["--tp-times"]),
        (["vision", "Qwen2.5-VL-7B", "--tp-times", "2=-1"], ["--tp-times"]),
        (["vision", "Qwen2.5-VL-7B", "--tp-times", "2=0.5", "2=0.4"], ["TP 2 twice"]),
        (["vision", "Qwen2.5-VL-7B", "--resolution", "99999999x99999999"], ["--resolution", "65536"]),
        (["vision", "Qwen2.5-VL-7B", "--tp", "0"], ["--tp"]),
        (
            ["calibrate", "run", "--out", REPO / "README.md" / "bundle", "--attach", "http://127.0.0.1:1"],
            ["README.md", "is a file"],
        ),
    ],
    ids=[
        "horizon-inf",
        "horizon-nan",
        "horizon-0",
        "horizon-1e300",
        "coldstart-tp-0",
        "crossover-prompt-0",
        "crossover-prompt-above-max-len",
        "crossover-tp-0",
        "crossover-tp-3",
        "perf-pp-0",
        "tp-times-1e999",
        "tp-times-nan",
        "tp-times-negative",
        "tp-times-twice",
        "vision-resolution-huge",
        "vision-tp-0",
        "calibrate-out-under-a-file",
    ],
)
def test_command_line_numbers(argv, words, capsys):
    expect_user_error(argv, words, capsys)


# ---------------------------------------------------------------- messages printed literally


def test_error_text_is_not_markup(tmp_path, capsys):
    path = put(tmp_path, "s.yaml", setting(scenario(), "pools.0.gpu", ":x: [bold]H100[/bold]"))
    out = expect_user_error(["simulate", path], [":x:", "[bold]H100[/bold]"], capsys)
    assert "\u274c" not in out


# ---------------------------------------------------------------- subprocesses (the real entry point)


@pytest.mark.parametrize("case", ["billion-laughs", "binary", "rate-nan", "markup"])
def test_subprocess(case, tmp_path):
    content = {
        "billion-laughs": LAUGHS,
        "binary": b"\x00\x01\x02",
        "rate-nan": yaml.safe_dump(setting(scenario(), "workload.arrival.rate", float("nan"))),
        "markup": yaml.safe_dump(setting(scenario(), "pools.0.gpu", ":x:")),
    }[case]
    path = put(tmp_path, "s.yaml", content)
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "simulate", str(path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "TERM": "dumb"},
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert ("pools[main].gpu" if case == "markup" else "s.yaml") in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30  # includes the interpreter's start and imports
    if case == "markup":
        assert ":x:" in r.stderr and "\u274c" not in r.stderr


# ---------------------------------------------------------------- what stays allowed


def test_ordinary_anchors_aliases_and_merge_keys_still_load():
    """The alias budget and the duplicate-key check leave ordinary YAML alone: anchors reused a few
    times, and merge keys whose entries an explicit key overrides."""
    data = parse_yaml(
        "base: &b {gpu: H100, tp: 1}\npools:\n  - {<<: *b, name: a}\n  - {<<: *b, name: b, tp: 2}\n"
        "lengths: &l [1, 2, 3]\nagain: *l\n",
        "ok.yaml",
    )
    assert data["pools"][1] == {"gpu": "H100", "tp": 2, "name": "b"} and data["again"] == [1, 2, 3]
