"""The ``epdsim`` command line, run as a subprocess like a user would."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from rich.console import Console

import hwdb
from hwdb import listing
from simulator import console
from simulator.cli.commands import hw_tables
from simulator.cli.plan import candidate_tables
from simulator.console import PIPED_WIDTH, stdout_console
from simulator.scenario import load_scenario

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "llama8b_h100_chat.yaml"
SCRIPT = Path(sys.executable).parent / "epdsim"


def epdsim(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """Run the installed ``epdsim`` script (or ``python -m simulator.cli`` without one)."""
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "simulator.cli"]
    r = subprocess.run(
        [*cmd, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"},
    )
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
    for name in (
        "requests.parquet",
        "steps.parquet",
        "requests.csv",
        "steps.csv",
        "requests.json",
        "summary.json",
        "scenario.yaml",
    ):
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


# ---------------------------------------------------------------- issue 18, item 10: the CLI as users expect


def _piped(*args: str, columns: int = 80) -> subprocess.CompletedProcess:
    """``epdsim ARGS | cat`` at ``columns`` columns: stdout and stderr are pipes, not terminals."""
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "simulator.cli"]
    r = subprocess.run(
        [*cmd, *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": str(columns)},
    )
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_hw_list_piped_at_80_columns_shows_every_full_name():
    db = hwdb.load()
    for kind, rows in (
        ("models", listing.model_rows(db)),
        ("links", listing.link_rows(db)),
        ("gpus", listing.gpu_rows(db)),
    ):
        r = _piped("hw", "list", kind)
        assert r.returncode == 0, r.stderr
        assert "…" not in r.stdout, r.stdout
        cells = {c.strip() for line in r.stdout.splitlines() for c in line.split("│")}
        for row in rows:
            assert row["name"] in cells, f"{row['name']!r} not a whole cell of `epdsim hw list {kind} | cat`"
    assert {"tcp-10gbe", "tcp-100gbe"} <= {row["name"] for row in listing.link_rows(db)}


def test_hw_list_on_an_80_column_terminal_splits_columns_instead_of_cutting_names():
    rows = listing.model_rows(hwdb.load())
    con = Console(width=80, force_terminal=True, no_color=True, record=True)
    tables = hw_tables("models", rows, con.width)
    assert len(tables) > 1  # ten columns do not fit in 80: groups, each with the names
    for t in tables:
        con.print(t)
    text = con.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    for row in rows:
        assert text.count(f" {row['name']} ") == len(tables), row["name"]
        assert f" {row['kv_bytes_per_token_bf16']:,} " in text


def test_plan_tables_keep_names_and_words_whole_in_a_ci_log(capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    layout = "2x H100-SXM-80GB TP2 prefill + 6x H200-SXM-141GB TP4 decode over ib-ndr (nixl)"
    reason = (
        "simulated: attainment 57.1% (95% CI 0.0-100.0% over 2 seeds) < 90% at 20 req/s; p90 TTFT 1.23 s, TPOT 0.0456 s"
    )
    df = pd.DataFrame(
        [
            dict(
                layout=layout,
                cost_usd_per_hour=12.5,
                cost_usd_per_million_tokens=1.2,
                goodput_rps=17.0,
                goodput_capped=False,
                ttft_s=1.23,
                tpot_s=0.0456,
                verified=True,
                rejected_reason=reason,
            )
        ]
    )
    con = stdout_console()  # capsys: not a terminal, so the CI log's width
    assert con.width == PIPED_WIDTH
    for t in candidate_tables("simulated candidates", df, 90, con.width, full_reason=True):
        con.print(t)
    out = capsys.readouterr().out
    # wrapped at spaces within the log's width: every word whole, nothing cut with "…"
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= PIPED_WIDTH, out
    words = out.replace("│", " ").replace("┃", " ").split()
    for word in (layout + " " + reason).split():
        assert word in words, word


def test_version():
    r = _piped("--version")
    assert r.returncode == 0 and r.stdout.startswith("epdsim ") and r.stdout.split()[1][0].isdigit(), r.stdout


def test_simulate_overrides_rate_requests_gpu_tp(tmp_path):
    out = ok(
        "simulate",
        "--rate",
        "4",
        "--num-requests",
        "120",
        "--gpu",
        "H200",
        "--tp",
        "2",
        "--out",
        tmp_path / "run",
        "--format",
        "json",
    )
    assert "2x H200-SXM-141GB TP2" in out, out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["summary"]["requests"] == 120 and summary["info"]["tp"] == 2
    scn = load_scenario(tmp_path / "run" / "scenario.yaml")
    assert scn.workload.arrival.rate == 4 and scn.pools[0].gpu == "H200"


@pytest.mark.parametrize(
    "args, words",
    [
        (("--rate", "0"), ("--rate", "positive")),
        (("--num-requests", "0"), ("--num-requests", "at least 1")),
        (("--tp", "3"), ("tp", "3")),
        (("--tp", "0"), ("tp", "0")),
        (("--gpu", "NoSuchGPU"), ("NoSuchGPU",)),
        ((REPO / "examples" / "qwen3_moe_h200_closed_loop.yaml", "--rate", "5"), ("--rate", "closed loop")),
    ],
)
def test_simulate_bad_overrides_are_one_paragraph_errors(args, words):
    r = epdsim("simulate", *args, "--num-requests", "50") if "--num-requests" not in args else epdsim("simulate", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    for w in words:
        assert w in r.stderr, r.stderr


def test_simulate_prints_a_vllm_bench_serve_style_block_and_no_progress_when_piped(tmp_path, small_scenario):
    r = _piped("simulate", small_scenario, "--out", tmp_path / "run", "--format", "csv")
    assert r.returncode == 0 and r.stderr == "", r.stderr  # stderr is a pipe: no progress
    out = r.stdout
    assert "Serving Benchmark Result" in out
    req = pd.read_csv(tmp_path / "run" / "requests.csv")
    done = req[req["outcome"] == "completed"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())["summary"]

    def value(label: str) -> str:
        line = next(ln for ln in out.splitlines() if ln.startswith(label + ":"))
        return line.split(":", 1)[1].strip()

    assert value("Successful requests") == f"{len(done):,}"
    assert value("Total input tokens") == f"{int(done['input_tokens'].sum()):,}"
    assert value("Total generated tokens") == f"{int(done['output_tokens'].sum()):,}"
    assert float(value("Benchmark duration (s)").replace(",", "")) == pytest.approx(summary["duration_s"], abs=0.01)
    for label in (
        "Request throughput (req/s)",
        "Request goodput (req/s)",
        "Output token throughput (tok/s)",
        "Total token throughput (tok/s)",
        "Peak concurrent requests",
    ):
        assert float(value(label).replace(",", "")) > 0, label
    assert value("  SLO") == "TTFT <= 500 ms, TPOT <= 50.0 ms"
    assert value("  SLO attainment").endswith("%")
    assert "±" not in out


def test_simulate_progress_goes_to_a_terminal_stderr(monkeypatch, capsys):
    monkeypatch.setattr(console, "is_tty", lambda stream: True)
    with console.elapsed_status("simulating x", min_s=0.0):
        time.sleep(0.8)
    err = capsys.readouterr()
    assert "simulating x" in err.err and err.out == ""
    monkeypatch.setattr(console, "is_tty", lambda stream: False)
    with console.elapsed_status("simulating y", min_s=0.0):
        time.sleep(0.3)
    assert capsys.readouterr().err == ""
