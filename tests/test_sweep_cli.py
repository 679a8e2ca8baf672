"""``epdsim sweep``: the table, the knee, sweep.csv and sweep.html; every bad input is exit 2 with the
option, the value and the fix on stderr, never a traceback."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest

from simulator.cli.commands import main
from tests.conftest import REPO

CHAT = str(REPO / "examples" / "llama8b_h100_chat.yaml")
HEADERS = (
    "offered req/s",
    "achieved req/s",
    "tok/s",
    "TTFT p50",
    "TTFT p90",
    "TTFT p99",
    "TPOT p50",
    "TPOT p90",
    "TPOT p99",
    "E2E p90",
    "SLO att.",
    "goodput req/s",
    "$/h",
)


def test_rate_sweep_prints_the_table_and_the_knee_and_writes_csv_and_html(tmp_path, capsys):
    out = tmp_path / "sweep"
    rc = main(
        [
            "sweep",
            CHAT,
            "--rates",
            "5,20,60,150",
            "--num-requests",
            "1500",
            "--workers",
            "2",
            "--quiet",
            "--out",
            str(out),
            "--report-plotly",
            "cdn",
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0
    for h in HEADERS:
        assert h in text, h
    assert "◀ knee" in text and "knee at " in text and "TTFT p90 <= 3x" in text
    with (out / "sweep.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["offered_rps"]) for r in rows] == [5.0, 20.0, 60.0, 150.0]
    assert {r["knob"] for r in rows} == {"rate"} and all(int(r["completed"]) > 0 for r in rows)
    assert float(rows[-1]["achieved_rps"]) < 0.9 * 150 < float(rows[-1]["ttft_p90_s"]) * 1e3
    page = (out / "sweep.html").read_text()
    assert page.count('class="plotly-graph-div"') == 2 and "cdn.plot.ly" in page
    assert "knee at " in page and "Latency percentiles" in page and "<table" in page


def test_knob_sweep_names_the_knob_in_the_table(capsys):
    rc = main(["sweep", CHAT, "--knob", "pools[0].instances=1,2", "--num-requests", "300", "--workers", "1", "--quiet"])
    text = capsys.readouterr().out
    assert rc == 0 and "pools[0].instances" in text and "$4.25" in text and "$8.50" in text
    assert "knee at" not in text  # a knee belongs to rate sweeps


@pytest.mark.parametrize(
    "args, words",
    [
        (["--rates", "0,1"], "--rates 0: a rate must be a positive, finite number"),
        (["--rates", "nan"], "--rates nan: a rate must be a positive"),
        (["--rates", "inf"], "--rates inf: a rate must be a positive"),
        (["--rates", ","], "--rates ',': no values"),
        (["--rates", ",".join(str(i) for i in range(1, 66))], "more than the 64 a sweep runs"),
        (["--knob", "pools[0].tpp=1,2"], "--knob pools[0].tpp: pools[0] has no field 'tpp' (did you mean tp?)"),
        (["--knob", "pools[0].tp=a,b"], "--knob pools[0].tp=a: pools[0].tp holds a number"),
        (["--knob", "pools[0].tp="], "--knob pools[0].tp=: no values after '='"),
        (["--knob", "pools[0].tp=1,16"], "--knob pools[0].tp=16: pools[main].tp=16 exceeds the 8 GPUs"),
        (["--knob", "operations.startup.compile_cache=none,warm"], "--knob operations.startup.compile_cache=warm"),
        (["--knob", "tp"], "give PATH=V1,V2"),
    ],
)
def test_bad_input_is_exit_2_naming_the_option_and_value(args, words, capsys):
    rc = main(["sweep", CHAT, *args, "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and words in " ".join(err.split()) and "Traceback" not in err, err


def test_bad_files_and_arguments_are_exit_2(tmp_path, capsys):
    assert main(["sweep", str(tmp_path / "none.yaml"), "--rates", "1"]) == 2
    assert "no such file" in capsys.readouterr().err
    closed = str(REPO / "examples" / "qwen3_moe_h200_closed_loop.yaml")
    assert main(["sweep", closed, "--rates", "auto", "--quiet"]) == 2
    assert "sweep its users instead" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["sweep", CHAT, "--rates", "1", "--out", str(tmp_path / "file")]) == 2
    assert "--out" in capsys.readouterr().err
    for argv in (
        ["sweep", CHAT],
        ["sweep", CHAT, "--rates", "1", "--knob", "pools[0].tp=1"],
        ["sweep", CHAT, "--rates", "1", "--points", "1"],
        ["sweep", CHAT, "--rates", "1", "--knee-factor", "1"],
    ):
        with pytest.raises(SystemExit) as exc:  # argparse's usage error
            main(argv)
        assert exc.value.code == 2


def test_the_installed_command_runs_without_a_traceback():
    run = subprocess.run(
        [sys.executable, "-m", "simulator.cli", "sweep", CHAT, "--knob", "pools[9].tp=1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and "pools has 1 entry, so [9] is out of range" in run.stderr
    assert "Traceback" not in run.stderr
