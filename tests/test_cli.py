"""The ``epdsim`` command line, run as a subprocess like a user would."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simulator.scenario import load_scenario

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "llama8b_h100_chat.yaml"
SCRIPT = Path(sys.executable).parent / "epdsim"


def epdsim(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run the installed ``epdsim`` script (or ``python -m simulator.cli`` without one)."""
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "simulator.cli"]
    r = subprocess.run([*cmd, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"})
    assert "Traceback" not in r.stderr, r.stderr
    return r


def ok(*args: str, cwd: Path = REPO) -> str:
    r = epdsim(*args, cwd=cwd)
    assert r.returncode == 0, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout


@pytest.fixture
def small_scenario(tmp_path) -> Path:
    """The default example with 300 requests: the same deployment, a fraction of the run time."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data["workload"]["num_requests"] = 300
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_simulate_without_argument_runs_default_example():
    out = ok("simulate")
    for word in ("llama8b-h100-chat", "TTFT", "TPOT", "ITL", "E2E", "throughput", "SLO attainment", "cost"):
        assert word in out, f"{word!r} not in:\n{out}"


def test_simulate_writes_all_formats(tmp_path):
    out_dir = tmp_path / "run"
    stdout = ok("simulate", EXAMPLE, "--out", out_dir, "--format", "parquet", "csv", "json")
    assert "wrote" in stdout
    for name in ("requests.parquet", "steps.parquet", "requests.csv", "steps.csv", "requests.json",
                 "summary.json", "scenario.yaml"):
        assert (out_dir / name).is_file(), f"{name} missing; got {sorted(p.name for p in out_dir.iterdir())}"
    scn = load_scenario(EXAMPLE)
    req = pd.read_parquet(out_dir / "requests.parquet")
    assert len(req) == scn.workload.num_requests
    assert len(pd.read_csv(out_dir / "requests.csv")) == scn.workload.num_requests
    assert len(pd.read_parquet(out_dir / "steps.parquet")) > 0
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["summary"]["requests"] == scn.workload.num_requests
    assert summary["info"]["seed"] == scn.seed
    # The scenario written next to the results reloads to the same scenario.
    assert load_scenario(out_dir / "scenario.yaml") == scn


def test_seed_changes_results_and_same_seed_is_byte_identical(tmp_path, small_scenario):
    def summary(seed: int, name: str) -> bytes:
        ok("simulate", small_scenario, "--seed", seed, "--out", tmp_path / name, "--format", "parquet")
        return (tmp_path / name / "summary.json").read_bytes()

    a, a_again, b = summary(1, "a"), summary(1, "a2"), summary(2, "b")
    assert a == a_again
    assert a != b
    assert json.loads(a)["info"]["seed"] == 1 and json.loads(b)["info"]["seed"] == 2


def test_perf_prints_both_regimes():
    out = ok("perf", "Llama-3.1-8B", "--gpu", "H100", "--tp", "1")
    assert "Llama-3.1-8B" in out and "H100" in out
    assert "prefill" in out and "decode" in out
    assert "compute" in out and "memory" in out


def test_hw_list_and_show():
    out = ok("hw", "list", "gpus")
    assert "gpus" in out and "H100" in out
    ok("hw", "list")
    assert "H100-SXM-80GB" in ok("hw", "show", "gpu", "H100")


def test_bad_usage_is_argparse_error():
    r = epdsim("simulate", "--format", "xlsx")
    assert r.returncode == 2 and "invalid choice" in r.stderr
