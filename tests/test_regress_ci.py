"""epdsim's own regression suite and the CI examples in docs/ci/: they parse and agree with each other."""

from __future__ import annotations

import json
import shlex

import yaml

from simulator.regress import compare, load_suite, read_baseline
from simulator.regress.suite_schema import Suite
from tests.conftest import REPO

SUITE = REPO / ".ci" / "regress" / "suite.yaml"
BASELINE = REPO / ".ci" / "regress" / "baseline.json"


def _regress_args(command: str) -> list[str]:
    words = shlex.split(command.replace("\\\n", " "))
    return words[words.index("regress") + 1 :]


def _opt(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_project_baseline_matches_its_suite():
    """Every watched figure has a baseline value, and no entry was redefined since the baseline was written
    (otherwise: rerun with --update and commit the baseline)."""
    loaded = load_suite(SUITE)
    base = read_baseline(BASELINE, loaded)
    figures = {k: v["figures"] for k, v in base["entries"].items()}
    rows = compare(loaded, base, figures)
    assert rows and all(r.status == "held" and not r.redefined for r in rows), [
        (r.entry, r.figure, r.status, r.redefined) for r in rows if r.status != "held" or r.redefined
    ]
    assert {e.kind for e in loaded.entries} == {"scenario", "plan"}
    assert all("shared" not in str(e.scenario.workload) for e in loaded.entries if e.scenario is not None)


def test_ci_run_checks_the_project_suite():
    run = (REPO / ".ci" / "run").read_text()
    args = _regress_args(run[run.index(".venv/bin/epdsim regress") :])
    assert args[0] == ".ci/regress/suite.yaml" and _opt(args, "--baseline") == ".ci/regress/baseline.json"
    assert "--update" not in args and run.index("-m pytest") < run.index(".venv/bin/epdsim regress")


def test_github_actions_example_runs_regress_and_reports_junit():
    wf = yaml.safe_load((REPO / "docs" / "ci" / "github-actions.yml").read_text())
    steps = wf["jobs"]["regress"]["steps"]
    runs = [s["run"] for s in steps if "epdsim regress" in s.get("run", "")]
    assert len(runs) == 1
    args = _regress_args(runs[0])
    assert "--baseline" in args and "--update" not in args
    assert _opt(args, "--markdown") == "$GITHUB_STEP_SUMMARY"
    junit = _opt(args, "--junit")
    later = [s for s in steps if s.get("if") == "always()"]
    assert any(s.get("with", {}).get("report_paths") == junit for s in later)
    triggers = wf.get("on", wf.get(True))  # PyYAML 1.1 reads the bare key `on` as the boolean True
    assert "pull_request" in triggers


def test_gitlab_example_runs_regress_and_reports_junit():
    ci = yaml.safe_load((REPO / "docs" / "ci" / "gitlab-ci.yml").read_text())
    job = ci["sizing-regression"]
    assert job["stage"] in ci["stages"]
    args = _regress_args(" ".join(job["script"]))
    assert "--baseline" in args and "--update" not in args
    assert job["artifacts"]["reports"]["junit"] == _opt(args, "--junit")
    assert job["artifacts"]["when"] == "always"


def test_baseline_is_written_canonically():
    """Sorted keys, two-space indent, trailing newline: what --update writes, so diffs stay minimal."""
    text = BASELINE.read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"


def test_suite_reference_in_docs_validates():
    """The annotated suite in docs/ci.md uses only keys and figures the suite model accepts."""
    text = (REPO / "docs" / "ci.md").read_text()
    block = text.split("## The suite", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    suite = Suite.model_validate(yaml.safe_load(block))
    assert [e.kind for e in suite.entries] == ["scenario", "plan"]
