"""``calibrate show`` never cuts a phase name or a figure: piped output is as wide as the pipe's width
(``COLUMNS``, else ``PIPED_WIDTH``) lets its tables be, and a narrow terminal gets column groups that
each repeat the phase column."""

from __future__ import annotations

import argparse
import io
import json

import yaml
from rich.console import Console

import hwdb
from calibration import cli
from simulator.console import PIPED_WIDTH
from tests.synthetic_bundle import CPU_TRUTH, TINY_CONFIG, make_bundle, write_truth_hwdb


def _bundle(tmp_path):
    tiny = tmp_path / "tiny-llama"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tiny / "epdsim.yaml").write_text(yaml.safe_dump({"name": "tiny-llama", "source": "test copy"}))
    return make_bundle(
        tmp_path / "b", write_truth_hwdb(tmp_path / "truth", tiny, CPU_TRUTH, hwdb.load()), tiny, load_rate=6.25
    )


def test_show_piped_is_not_cut_and_keeps_one_row_at_the_pipe_width(tmp_path, capsys, monkeypatch):
    b = _bundle(tmp_path)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert cli.main(["show", str(b)]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and max(len(ln) for ln in out.splitlines()) <= PIPED_WIDTH
    row = next(ln for ln in out.splitlines() if "load_poisson_r6.25" in ln)
    assert len(row) > 80 and "30/30" in row  # one row holds every column


def test_show_on_a_narrow_terminal_splits_into_column_groups(tmp_path):
    b = _bundle(tmp_path)
    buf = io.StringIO()
    con = Console(file=buf, width=60, force_terminal=False)
    assert cli.cmd_show(argparse.Namespace(bundle=str(b), json=False), con) == 0
    out = buf.getvalue()
    assert "…" not in out and max(len(ln) for ln in out.splitlines()) <= 60
    assert "(1/" in out and "tok/s" in out and "TTFT p50" in out
    assert sum("load_poisson_r6.25" in ln for ln in out.splitlines()) >= 2  # the name column repeats
