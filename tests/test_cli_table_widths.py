"""Every command that prints tables keeps its lines within 80 and 120 columns and, piped with no
``COLUMNS``, within ``PIPED_WIDTH``; and ``simulate`` writes each TTFT/TPOT/E2E figure with its model
error band (table and summary.json), or says "no band".

The commands run in process (``main`` with capsys: stdout is not a terminal, the piped case), with
``COLUMNS`` set or unset; one run goes through a real pipe.  No line is exempt from the width.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simulator.cli import main
from simulator.cli.ops import yaml_within
from simulator.confidence import band_text
from simulator.console import PIPED_WIDTH, stdout_console

REPO = Path(__file__).resolve().parents[1]
CHAT = REPO / "examples" / "llama8b_h100_chat.yaml"  # calibrated H100: a band
PD = REPO / "examples" / "interference_pd.yaml"  # two pools, each with its band
AUTOSCALE = REPO / "examples" / "autoscale_step_load.yaml"  # adds the operations table
SCENARIO = {
    "name": "width-chat",
    "seed": 3,
    "model": "Llama-3.1-8B",
    "pools": [{"gpu": "H100", "tp": 1, "instances": 1}],
    "workload": {
        "arrival": {"kind": "poisson", "rate": 10},
        "input_length": {"kind": "fixed", "value": 512},
        "output_length": {"kind": "fixed", "value": 64},
        "num_requests": 60,
    },
    "slo": {"ttft_s": 0.2, "tpot_s": 0.010, "attainment": 0.9},
}
# the same load on a datasheet-only GPU (no calibration profile): no band
NO_BAND = {**SCENARIO, "name": "width-no-band", "pools": [{"gpu": "L40S", "tp": 1, "instances": 1}]}
PLAN = {
    "name": "width-plan",
    "model": "Llama-3.1-8B",
    "workload": {
        "arrival": {"kind": "poisson", "rate": 10.0},
        "input_length": {"kind": "lognormal", "mean": 1000, "cv": 1.0, "low": 16, "high": 8000},
        "output_length": {"kind": "lognormal", "mean": 200, "cv": 1.0, "low": 4, "high": 1500},
        "num_requests": 200,
    },
    "slo": {"ttft_s": 1.0, "tpot_s": 0.05, "attainment": 0.9},
    "gpus": [{"name": "L40S"}, {"name": "H100"}],
    "constraints": {"max_gpus": 4, "max_instances_per_pool": 4, "tp": [1]},
    "search": {
        "verify": 1,
        "borderline": 0,
        "verify_front": 0,
        "replications": 1,
        "requests": 200,
        "goodput_iterations": 1,
    },
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A tiny regress suite with its baseline, and a tiny plan request (about a second each)."""
    d = tmp_path_factory.mktemp("widths")
    (d / "scn.yaml").write_text(yaml.safe_dump(SCENARIO))
    (d / "noband.yaml").write_text(yaml.safe_dump(NO_BAND))
    suite = {
        "name": "width-suite",
        "tolerance": {"rel": 0.02},
        "entries": [
            {
                "id": "chat",
                "scenario": "scn.yaml",
                "seeds": [1],
                "goodput": {"rate_hi": 40, "iterations": 2},
                "figures": {"goodput_rps": {"rel": 0.05}, "ttft_p99_s": None, "gpus": {"abs": 0}},
            }
        ],
    }
    (d / "suite.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    assert main(["regress", str(d / "suite.yaml"), "--baseline", str(d / "base.json"), "--update", "--jobs", "1"]) == 0
    (d / "plan.yaml").write_text(yaml.safe_dump(PLAN))
    return {
        "suite": d / "suite.yaml",
        "baseline": d / "base.json",
        "plan": d / "plan.yaml",
        "noband": d / "noband.yaml",
    }


# command -> (arguments, a word its table prints: the output is the command's, not an error)
COMMANDS = {
    "simulate": (["simulate", str(CHAT), "--num-requests", "100"], "model error band"),
    "simulate-pd": (["simulate", str(PD), "--num-requests", "60"], "TTFT breakdown"),
    "simulate-no-band": (["simulate", "{noband}", "--num-requests", "60"], "no band"),
    "simulate-autoscale": (["simulate", str(AUTOSCALE)], "operations"),
    "perf": (["perf", "Llama-3.1-8B", "--gpu", "H100"], "decode step"),
    "hw-list": (["hw", "list"], "models"),
    "hw-show-gpu": (["hw", "show", "gpu", "H100"], "calibration_profile"),
    "hw-show-model": (["hw", "show", "model", "Llama-3.1-8B"], "Llama-3.1-8B"),
    "pd-crossover": (["pd-crossover", "Llama-3.1-8B", "--gpu", "H100"], "fabrics"),
    "coldstart": (["coldstart", "Llama-3.1-8B", "--gpu", "H100"], "weights load"),
    "probes": (["probes", "Llama-3.1-8B", "--gpu", "H100", "--startup-probe"], "container attempts"),
    "vision": (["vision", "Qwen2.5-VL-7B"], "3840x2160"),
    "vision-tp": (["vision", "Qwen2.5-VL-7B", "--tp-times", "1=0.1", "2=0.06"], "speed-up"),
    "calibrate-show": (["calibrate", "show", str(REPO / "examples" / "calibration_sample")], "load_poisson"),
    "regress": (["regress", "{suite}", "--baseline", "{baseline}", "--jobs", "1"], "goodput_rps"),
    "plan": (["plan", "{plan}", "--workers", "1", "--quiet"], "Pareto front"),
}


def run(capsys, argv: list[str], files: dict[str, Path]) -> str:
    code = main([a.format(**files) for a in argv])
    out = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in out.err, out.err  # plan/regress: 1 is a verdict
    return out.out


def assert_within(out: str, width: int, word: str) -> None:
    lines = out.splitlines()
    assert word in out and lines, out
    widest = max(lines, key=len)
    assert len(widest) <= width, f"{len(widest)} > {width}: {widest!r}"
    assert "…" not in out, "a name or figure was cut"


@pytest.mark.parametrize("name", COMMANDS)
def test_tables_fit_80_and_120_columns_and_a_pipe(name, files, capsys, monkeypatch):
    argv, word = COMMANDS[name]
    for width in (80, 120):
        monkeypatch.setenv("COLUMNS", str(width))
        assert_within(run(capsys, argv, files), width, word)
    monkeypatch.delenv("COLUMNS")
    assert_within(run(capsys, argv, files), PIPED_WIDTH, word)


def test_a_real_pipe_without_columns_is_piped_width():
    env = {"PATH": "/usr/bin:/bin", "NO_COLOR": "1"}  # no COLUMNS, stdout a pipe
    r = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "simulate", str(CHAT), "--num-requests", "60"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert_within(r.stdout, PIPED_WIDTH, "confidence (main)")
    assert max(len(line) for line in r.stdout.splitlines()) > 80  # the pipe's width is used, not 80


@pytest.mark.parametrize("columns, width", [("95", 95), ("", PIPED_WIDTH), ("wide", PIPED_WIDTH), ("0", PIPED_WIDTH)])
def test_piped_console_width_is_columns_or_piped_width(columns, width, monkeypatch):
    monkeypatch.setenv("COLUMNS", columns)
    assert stdout_console().width == width


def test_probe_yaml_comments_wrap_and_the_snippet_stays_the_same_yaml():
    text = (
        "# " + "a long comment about the startup probe budget " * 4 + "\nstartupProbe:\n"
        "  # " + "indented comment words " * 6 + "\n  periodSeconds: 10\n  failureThreshold: 25"
    )
    wrapped = yaml_within(text, 60)
    assert max(len(line) for line in wrapped.splitlines()) <= 60
    assert all(line.lstrip().startswith("#") for line in wrapped.splitlines() if line.strip() and ":" not in line), (
        wrapped
    )
    assert (
        yaml.safe_load(wrapped)
        == yaml.safe_load(text)
        == {"startupProbe": {"periodSeconds": 10, "failureThreshold": 25}}
    )
    assert wrapped.count("\n") > text.count("\n")  # the long comments were re-broken
    words = [[w for w in t.split() if w != "#"] for t in (wrapped, text)]
    assert words[0] == words[1]  # the same words, each piece a comment


def test_band_text_is_the_figure_times_one_plus_minus_the_error_in_its_unit():
    assert band_text(0.0851, 0.28) == "(61–109)"  # 85.1 ms: 61.3 ms to 108.9 ms
    assert band_text(1.63, 0.3052) == "(1.1–2.1)"  # seconds, two figures
    assert band_text(0.0, 0.28) == "" and band_text(float("nan"), 0.28) == ""


def _band(out_dir: Path) -> tuple[dict, dict, dict]:
    data = json.loads((out_dir / "summary.json").read_text())
    return data["summary"], data["summary"]["model_error_band"], data["info"]


def test_simulate_writes_each_figure_with_its_band_in_table_and_json(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    assert (
        main(["simulate", str(CHAT), "--num-requests", "100", "--out", str(tmp_path / "run"), "--format", "json"]) == 0
    )
    out = capsys.readouterr().out
    summary, band, info = _band(tmp_path / "run")
    conf = info["pools"][0]["confidence"]["error_band"]
    rel = {"ttft_s": conf["ttft_mape"], "tpot_s": conf["tpot_mape"], "e2e_s": max(conf["ttft_mape"], conf["tpot_mape"])}
    assert conf["basis"] in band["basis"] and "not a seed-noise interval" in band["source"]
    for key, r in rel.items():
        assert band[key]["relative_error"] == r
        for st in ("p50", "p90", "p99", "mean"):
            v = summary[key][st]
            assert band[key][f"{st}_low"] == pytest.approx(v * (1 - r))
            assert band[key][f"{st}_high"] == pytest.approx(v * (1 + r))
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.count("│") > 5}
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        for st in ("p50", "p99"):
            assert band_text(summary[key][st], rel[key]) in rows[label], (label, rows[label])
    assert "(" not in rows["ITL"] and "(" not in rows["queue"]  # no band on ITL and queue
    assert f"TTFT {rel['ttft_s']:.0%}" in " ".join(out.split()) and "model error band" in out


def test_simulate_without_a_band_says_no_band_and_writes_nulls(files, tmp_path, capsys):
    run_dir = str(tmp_path / "run")
    assert main(["simulate", str(files["noband"]), "--num-requests", "60", "--out", run_dir, "--format", "json"]) == 0
    out = capsys.readouterr().out
    _, band, info = _band(tmp_path / "run")
    assert info["pools"][0]["confidence"]["error_band"] is None
    assert "model error band: no band" in " ".join(out.split())
    assert "datasheet figures only" in band["basis"]
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        assert band[key]["relative_error"] is None and band[key]["p90_low"] is None and band[key]["mean_high"] is None
    ttft_row = next(line for line in out.splitlines() if line.startswith("│ TTFT"))
    assert "(" not in ttft_row  # no invented band


def test_pd_band_is_the_widest_of_the_pools_each_figure_rests_on(tmp_path, capsys):
    assert main(["simulate", str(PD), "--num-requests", "60", "--out", str(tmp_path / "run"), "--format", "json"]) == 0
    capsys.readouterr()
    _, band, info = _band(tmp_path / "run")
    pools = {p["role"]: p["confidence"]["error_band"] for p in info["pools"]}
    assert band["ttft_s"]["relative_error"] == pools["prefill"]["ttft_mape"]
    assert band["tpot_s"]["relative_error"] == pools["decode"]["tpot_mape"]
    assert band["e2e_s"]["relative_error"] == max(b[k] for b in pools.values() for k in ("ttft_mape", "tpot_mape"))
