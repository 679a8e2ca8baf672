"""The docs-reference checker's rules (tests/reference_checker.py) on planted text: stale paths, modules,
symbols, subcommands and flags are caught in a document and in a module's comments, other projects' cited
paths and generated outputs are not, and ../shared paths are checked only where ../shared is given.
"""

from __future__ import annotations

from tests.conftest import REPO
from tests.reference_checker import stale_references


def test_a_planted_stale_name_is_caught(tmp_path):
    doc = REPO / "docs" / "planted.md"  # never written: the checker reads the text it is given
    text = "\n".join(
        [
            "The pool driver lives in `simulator/nope.py`; see also `docs/nope.md` and [a link](gone.md).",
            "Verdicts come from :mod:`simulator.verdict` and `simulator.goodput.no_such_function`.",
            "Run `epdsim frobnicate` or `epdsim simulate --no-such-flag 3` or `epdsim calibrate nope`.",
            "```bash",
            ".venv/bin/epdsim plan request.yaml \\",
            "  --workers 2 --bogus-flag",
            "```",
            "- `simulator/` — the instance (`instance.py`), the step model (`stepmodel.py`).",
            "Fine: `simulator/engine/instance.py`, `simulator.goodput.VerdictWatch`, `epdsim hw list --format json`,",
            "`simulator/perf.py:plan_memory`, `run.py:146-154`, vLLM's `vllm/v1/core/sched/scheduler.py`, "
            "`out/x.html`.",
            "Another project's path is its own where it is cited so: vLLM's guide (`docs/design/p2p.md`), SGLang's",
            "`docs/server_arguments.md`; not here: `docs/design/p2p.md`, the vLLM V1 instance (`simulator/gone.py`).",
            "A moved module under a folder: `engine/instance.py`, `pages/*.py`, but `engine/gone.py`.",
        ]
    )
    found = {(s.where, s.ref) for s in stale_references(text, doc)}
    assert found == {
        ("docs/planted.md:1", "simulator/nope.py"),
        ("docs/planted.md:1", "docs/nope.md"),
        ("docs/planted.md:1", "gone.md"),
        ("docs/planted.md:2", "simulator.verdict"),
        ("docs/planted.md:2", "simulator.goodput.no_such_function"),
        ("docs/planted.md:3", "epdsim frobnicate"),
        ("docs/planted.md:3", "epdsim simulate --no-such-flag"),
        ("docs/planted.md:3", "epdsim calibrate nope"),
        ("docs/planted.md:5", "epdsim plan --bogus-flag"),
        ("docs/planted.md:8", "instance.py"),
        ("docs/planted.md:12", "docs/design/p2p.md"),
        ("docs/planted.md:12", "simulator/gone.py"),
        ("docs/planted.md:13", "engine/gone.py"),
    }, found
    # In a module's comments too, and a planted file on disk reads the same way.
    assert [
        s.ref for s in stale_references("# (see simulator.verdict)", REPO / "simulator" / "x.py", markdown=False)
    ] == ["simulator.verdict"]
    planted = tmp_path / "planted.md"
    planted.write_text("See `calibration/gone_fit.py` and `python -m calibration.gone_fit`.\n")
    assert {s.ref for s in stale_references(planted.read_text(), planted)} == {
        "calibration/gone_fit.py",
        "calibration.gone_fit",
    }


def test_shared_paths_are_skipped_without_shared(tmp_path):
    text = "The tables of `../shared/data/no_such_table.csv`."
    assert stale_references(text, REPO / "README.md") == []
    assert [s.ref for s in stale_references(text, REPO / "README.md", shared=tmp_path)] == [
        "../shared/data/no_such_table.csv"
    ]
