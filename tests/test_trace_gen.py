"""``epdsim calibrate make-trace`` (calibration/harness/trace_gen.py): a bursty trace of several request kinds
that the harness replays and the simulator reads; checked against the MMPP's closed forms."""

from __future__ import annotations

import re
import shlex

import numpy as np
import pytest

from calibration import cli
from calibration.harness import trace_plan
from calibration.harness.trace_gen import DEFAULT_CLASSES, generate, mmpp_arrivals, parse_class
from tests.conftest import REPO


def test_same_arguments_and_seed_same_bytes(tmp_path, capsys):
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    assert cli.main(["make-trace", str(a), "--seed", "4"]) == 0
    assert cli.main(["make-trace", str(b), "--seed", "4"]) == 0
    assert cli.main(["make-trace", str(c), "--seed", "5"]) == 0
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    assert "240 requests over" in capsys.readouterr().out


def test_the_default_is_the_shape_the_issue_replayed(tmp_path, capsys):
    """>= 200 requests, three classes with their ranges, outputs up to 200, bursty (CV > 1.5); the
    harness's trace reader takes the file as it is."""
    rows = generate(seed=2)
    assert len(rows) == 240
    by = {c.name: c for c in DEFAULT_CLASSES}
    for _, prompt, out, name in rows:
        c = by[name]
        assert c.prompt[0] <= prompt <= c.prompt[1] and c.output[0] <= out <= c.output[1]
    assert {r[3] for r in rows} == set(by) and max(r[2] for r in rows) == 200
    f = tmp_path / "t.csv"
    assert cli.main(["make-trace", str(f), "--seed", "2"]) == 0
    d = trace_plan.describe(trace_plan.read(str(f)), f, "plain")
    assert d["requests"] == 240 and d["interarrival_cv"] > 1.5


def test_mmpp_mean_rate_and_burstiness_match_the_closed_forms():
    """Long-run rate = sum(rate_i x T_i) / sum(T_i); the count in windows much shorter than a sojourn
    is over-dispersed (index of dispersion well above Poisson's 1)."""
    rates, soj = (0.5, 6.0), (20.0, 6.5)
    arr = mmpp_arrivals(40_000, rates, soj, np.random.default_rng(7))
    expected = (rates[0] * soj[0] + rates[1] * soj[1]) / sum(soj)
    assert len(arr) / arr[-1] == pytest.approx(expected, rel=0.05)
    counts = np.bincount((arr // 2.0).astype(int))
    assert counts.var() / counts.mean() > 3.0
    # equal rates: a Poisson process (CV of the gaps 1)
    gaps = np.diff(mmpp_arrivals(20_000, (3.0, 3.0), soj, np.random.default_rng(1)))
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--rates", "0.5,nan"], "--rates 0.5,nan: give two numbers"),
        (["--rates", "1e308,1"], "<= 10000 req/s"),
        (["--rates", "a,b"], "--rates a,b: give two numbers separated by a comma"),
        (["--sojourn", "0,1"], "--sojourn 0.0,1.0: give two numbers"),
        (["--requests", "0"], "--requests 0: give a whole number from 1 to 1,000,000"),
        (["--class", "chat:0.6:200-64:32"], "prompt length '200-64' must be N or LO-HI"),
        (["--class", "chat:inf:64:32"], "share inf must be a finite number > 0"),
        (["--class", "chat:1:64"], "give NAME:SHARE:PROMPT:OUTPUT"),
    ],
)
def test_bad_arguments_name_the_flag_the_value_and_the_fix(tmp_path, capsys, argv, words):
    out = tmp_path / "t.csv"
    assert cli.main(["make-trace", str(out), *argv]) == 2
    assert words in " ".join(capsys.readouterr().err.split())
    assert not out.exists()


def test_an_existing_file_or_a_folder_is_not_overwritten(tmp_path, capsys):
    f = tmp_path / "t.csv"
    f.write_text("keep")
    assert cli.main(["make-trace", str(f)]) == 2 and f.read_text() == "keep"
    assert "--force to overwrite it" in capsys.readouterr().err
    assert cli.main(["make-trace", str(tmp_path)]) == 2 and "is a folder" in capsys.readouterr().err
    assert cli.main(["make-trace", str(f), "--force"]) == 0 and f.read_text().startswith("arrival_s,")


def test_class_lengths_are_n_or_a_range():
    c = parse_class("mid:0.15:400:200")
    assert c.prompt == (400, 400) and c.output == (200, 200)
    assert parse_class("chat:2:64-200:32-128").prompt == (64, 200)


def _commands(doc: str, heading: str) -> list[list[str]]:
    """The ``epdsim calibrate`` commands of the first code block after ``heading`` in ``doc``, as argv
    after ``epdsim calibrate`` (continuation lines joined, ``$E`` as the block sets it)."""
    text = (REPO / doc).read_text()
    block = text[text.index(heading) :].split("```")[1]
    joined = block.replace("\\\n", " ")
    env = dict(ln.split("=", 1) for ln in joined.splitlines() if re.match(r"^[A-Z]+=", ln))
    cmds = []
    for ln in joined.splitlines():
        if "epdsim calibrate" in ln:
            words = shlex.split(ln.split("#")[0])
            words = [env.get(w[1:], w) if w.startswith("$") else w for w in words]
            cmds.append(words[words.index("calibrate") + 1 :])
    return cmds


def test_the_pinned_trace_recipe_parses_and_is_pin_fit_replay_validate():
    """docs/validation/cpu.md's recipe, command by command, with `epdsim calibrate`'s own parser: the trace,
    a pinned fit bundle, the fit, the trace on another pinned launch of the same model, the check."""
    cmds = _commands("docs/validation/cpu.md", "### Recipe: a pinned fit checked on a bursty trace")
    assert [c[0] for c in cmds] == ["make-trace", "run", "fit", "run", "validate"]
    parsed = [cli.build_parser().parse_args(c) for c in cmds]
    trace, fit_run, fit, replay, check = parsed
    assert fit_run.launch and fit_run.pin == "0:1" and fit_run.out == fit.bundle and "load" in fit_run.phases
    assert replay.launch and replay.pin == "0:1" and replay.phases == "load" and replay.trace == trace.out
    assert replay.model_dir == f"{fit_run.out}/model" and check.bundle == replay.out and check.profile == fit.out
    assert fit_run.engine_arg == replay.engine_arg == ["--no-enable-prefix-caching"]


def test_the_trace_example_of_calibration_md_replays_the_trace_alone():
    (cmd,) = _commands("docs/calibration.md", "**Replaying a trace.**")
    a = cli.build_parser().parse_args(cmd)
    assert a.trace and a.phases == "load" and a.pin == "0:1"


def test_a_trace_with_the_sweeps_says_so_before_the_launch(tmp_path, capsys):
    """--trace under the default --phases runs the prefill and decode sweeps first: said before anything
    starts (here the launch then fails at once on a server command that exits)."""
    f = tmp_path / "t.csv"
    assert cli.main(["make-trace", str(f), "--requests", "5"]) == 0
    rc = cli.main(
        [
            "run",
            "--out",
            str(tmp_path / "b"),
            "--trace",
            str(f),
            "--serve-cmd",
            "false",
            "--url",
            "http://127.0.0.1:9",
            "--ready-timeout",
            "5",
        ]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 3 and "the prefill and decode sweeps run before the trace (several minutes)" in err
    assert "--phases load replays the trace alone" in err
