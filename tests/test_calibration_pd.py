"""PD bundles (``epdsim calibrate run --pd``, ``show``, ``validate``; calibration/pd/): every fit writes the
engine file a replay uses; a PD bundle (written here in the shape ``calibrate run --pd`` writes,
ExampleConnector and NixlConnector) is replayed, shown with its prefill, decode and transfer tables and
validated with the fitted hwdb folder, and refused by ``calibrate fit`` with the commands that read it; bad
input names the flag, value and fix; the NIXL check and counters; a run killed with SIGKILL reads as
interrupted.  ``@pytest.mark.vllm``: the launcher's two NIXL patches in the vLLM Python.  The documented
block of docs/calibration.md: tests/test_pd_docs.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import hwdb
from calibration.cli import main as calibrate_main
from calibration.fit.command import fit_bundle
from calibration.fit.report import profile_name, write_outputs
from calibration.pd import run as pd_run
from calibration.pd.bundle import measured_rows
from calibration.pd.launch import nixl_problem, nixl_transfers, parse_counters
from calibration.pd.replay import PARTS
from tests.conftest import REPO, VLLM_PY, needs_vllm
from tests.synthetic_bundle import CPU_TRUTH, TINY_CONFIG, make_bundle, write_truth_hwdb


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
    assert "per_seq_s" not in fit.result.params  # the case that used to write no engine
    name = profile_name("CPU-host", "0.32.0", "tiny-llama")
    assert fit.profile.name == name and paths["engine"] == hw / "engines" / f"{name}.yaml"
    eng = hwdb.load([hw]).engine(name)
    assert eng.cpu.step_s.value == pytest.approx(fit.result.params["step_overhead_s"], rel=1e-6)
    assert eng.cpu.per_sampled_seq_s.value == 0.0
    # the harness's own front end (client vs server timestamps), not the base engine's GPU-fitted one
    assert eng.frontend_s.value == pytest.approx(fit.frontend_s, abs=1e-9) and "lone requests" in eng.frontend_s.source
    report = json.loads((hw / "fits" / f"{name}.json").read_text())
    assert report["engine_name"] == name


def _pd_bundle(folder: Path, n: int = 8, connector: str = "ExampleConnector") -> Path:
    """A folder in the shape `calibrate run --pd` writes: manifest + records/load_pd.jsonl with router data."""
    (folder / "records").mkdir(parents=True)
    recs = []
    for i in range(n):
        prompt, out = 128 * (1 + i % 3) + 2, 16 + i
        recs.append(
            {
                "id": f"pd-0-{i}",
                "ok": True,
                "t_send": 1000.0 + 1.25 * i,
                "ttft_s": 0.050 + 0.002 * i,
                "e2e_s": 0.050 + 0.002 * i + 0.005 * (out - 1),
                "prompt_tokens": prompt,
                "output_tokens": out,
                "pd": {
                    "prefill_sent_s": 0.0,
                    "prefill_done_s": 0.030,
                    "decode_sent_s": 0.031,
                    "decode_first_byte_s": 0.045,
                    "prefill_metrics": {"time_to_first_token_ms": 20.0 + i, "queue_time_ms": 0.1},
                    "decode_metrics": {"time_to_first_token_ms": 8.0, "mean_itl_ms": 4.9, "queue_time_ms": 3.0},
                },
            }
        )
    (folder / "records" / "load_pd.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    manifest = {
        "kind": "pd_run",
        "schema_version": 1,
        "status": "completed",
        "mode": "launch",
        "connector": connector,
        "block_size": 128,
        "ready_s": {"prefill": 30.0, "decode": 31.0},
        "load": {
            "n": n,
            "rate": 0.8,
            "seed": 0,
            "blocks": [1, 2, 3],
            "extra": 2,
            "out_min": 16,
            "out_max": 64,
            "kind": "poisson",
        },
    }
    if connector == "NixlConnector":
        manifest["nixl_transfers"] = {"transfers": n, "mean_xfer_s": 0.002, "mean_bytes": 5.2e5, "bandwidth_Bps": 2.6e8}
        manifest["kv_loaded"] = {"transfers": n, "bytes": 5.2e5 * n}
        manifest["result"] = {"handshake_warmup_s": 0.7}
        manifest["nixl"] = {"kv_buffer_device": "cpu", "progress_thread": "on", "keep_binding": True}
    else:
        manifest["kv_loaded"] = {"injections": n, "tokens": 128 * n}
        manifest["file_bandwidth"] = {"write_read_Bps": 3.2e9, "per_transfer_s": 2.4e-4}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_pd_bundle_replays_with_the_fitted_engine_and_shows(fitted_hw, tmp_path, capsys):
    fit, hw, _ = fitted_hw
    pd = _pd_bundle(tmp_path / "pd-run")
    # python -m calibration.pd.run replay: --engine given, the model taken from HWDB/models/tiny-llama
    assert pd_run.main(["replay", str(pd), "--hwdb", str(hw), "--engine", fit.profile.name]) == 0
    report = json.loads((pd / "replay" / "report.json").read_text())
    assert report["n"] == 8 and report["completed_pred"] == 8
    scen = yaml.safe_load((pd / "replay" / "scenario.yaml").read_text())
    assert scen["pools"][0]["engine"]["engine"] == fit.profile.name
    assert Path(scen["model"]) == (hw / "models" / "tiny-llama").resolve()
    assert scen["kv_transfer"]["connector"] == "example" and scen["kv_transfer"]["bandwidth_Bps"] == 3.2e9
    ttft = [r for r in report["table"] if r["metric"] == "TTFT" and r["source"] == "client via router"]
    assert ttft and all(0 < r["predicted_s"] < 1.0 for r in ttft)
    capsys.readouterr()
    assert calibrate_main(["show", str(pd)]) == 0
    out = capsys.readouterr().out
    assert "PD bundle" in out and "8 of 8 ok" in out and "status completed" in out
    for table in ("prefill side", "decode side", "client (through the router)", "KV transfer (ExampleConnector)"):
        assert table in out
    assert "3.20 GB/s" in out and "8 loads" in out
    assert calibrate_main(["show", str(pd), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["figures"]["decode_tpot_p50"] == pytest.approx(4.9e-3) and s["replay"] is True
    assert s["sides"]["prefill"]["router leg (HTTP, not streamed)"]["p50"] == pytest.approx(0.030)
    # the colocated fit refuses it and says what reads it
    assert calibrate_main(["fit", str(pd)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "PD bundle" in err and "calibrate validate" in err and "--profile HWDB_DIR" in err


@pytest.mark.parametrize(
    "connector, sim, bw", [("ExampleConnector", "example", 3.2e9), ("NixlConnector", "nixl", 2.6e8 / 0.85)]
)
def test_calibrate_validate_replays_a_pd_bundle(fitted_hw, tmp_path, capsys, connector, sim, bw):
    _, hw, _ = fitted_hw
    pd = _pd_bundle(tmp_path / "pd", connector=connector)
    capsys.readouterr()
    rc = calibrate_main(["validate", str(pd), "--profile", str(hw), "--tolerance", "0.5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rep = json.loads((pd / "validation" / "report.json").read_text())
    scen = yaml.safe_load((pd / "validation" / "scenario.yaml").read_text())
    assert scen["kv_transfer"]["connector"] == sim and scen["kv_transfer"]["bandwidth_Bps"] == pytest.approx(bw)
    assert rep["n"] == rep["completed_pred"] == 8 and rep["connector"] == connector
    sources = {(r["metric"], r["stat"], r["source"]): r for r in rep["table"]}
    assert sources[("TTFT", "p50", "prefill+decode srv")]["check"] is True
    assert sources[("TTFT", "p50", "client via router")]["check"] is False
    assert sources[("TPOT", "p50", "decode server")]["measured_s"] == pytest.approx(4.9e-3)
    assert ("KV transfer", "mean", "NIXL xfer time" if sim == "nixl" else "file probe") in sources
    assert rep["checks"] == 4
    # the engines' share: each server's queue + time to first token (request 3: 23 + 0.1 ms, 8 + 3 ms)
    rows = {r["id"]: r for r in measured_rows(pd)}
    assert rows["pd-0-3"]["servers_ttft_s"] == pytest.approx(0.0341)
    assert rows["pd-0-3"]["router_client_s"] == pytest.approx(0.056 - 0.045)
    parts = {p["part"]: p for p in rep["parts"]}
    assert list(parts) == [name for name, *_ in PARTS]
    http = parts["API servers and HTTP of both legs, beyond the engines"]
    # per request: (30 - 20.1 - i) + (14 - 11) ms for i = 0..7, p50 at i = 3.5
    assert http["measured_s"] == pytest.approx(0.0094) and http["modelled"]
    router = parts["router and the client's hop to it"]
    assert router["predicted_s"] == 0.0 and not router["modelled"]
    assert router["measured_s"] == pytest.approx(0.050 + 0.002 * 3.5 - 0.045)
    # the simulated engines' share excludes the simulated front end, which the HTTP part holds
    sim_engines = rep["table"][2]["predicted_s"]
    assert rep["table"][2]["source"] == "prefill+decode srv" and sim_engines < rep["table"][0]["predicted_s"]
    assert "TTFT's largest miss:" in " ".join(out.split()) and "part by part" in out
    assert f"PD pair ({connector})" in " ".join(out.split()) and "checks within 50%" in out
    # a tolerance nothing meets: --strict exits 1, without it 0
    assert calibrate_main(["validate", str(pd), "--profile", str(hw), "--tolerance", "0.0", "--strict"]) == 1
    capsys.readouterr()
    assert calibrate_main(["show", str(pd)]) == 0
    out = capsys.readouterr().out
    assert "validated:" in out
    if sim == "nixl":
        assert "NIXL reads" in out and "8 transfers" in out and "handshake" in out
        assert "progress thread on, pinning kept: yes" in " ".join(out.split())


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
    assert calibrate_main(["validate", str(pd), "--profile", str(tmp_path / "nohw")]) == 2
    assert "--profile" in capsys.readouterr().err
    assert calibrate_main(["validate", str(pd), "--profile", str(hw), "--gpu", "H100"]) == 2
    assert "not an option for a PD bundle" in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--attach", "http://x:8000"], "--attach: not an option of `calibrate run --pd`"),
        (["--resume"], "--resume: not an option"),
        (["--load-rates", "0.5,1"], "a PD run has one load test"),
        (["--connector", "nixl", "--prefill-url", "http://127.0.0.1:1"], "needs both --prefill-url and --decode-url"),
        (["--model-dir", "nowhere"], "--model-dir nowhere: no config.json"),
        (["--nixl-progress-thread", "off"], "--nixl-progress-thread off: only with --connector nixl"),
    ],
)
def test_calibrate_run_pd_refuses_what_does_not_apply(tmp_path, capsys, argv, says):
    assert calibrate_main(["run", "--pd", "--out", str(tmp_path / "b"), *argv]) == 2
    assert says in " ".join(capsys.readouterr().err.split())


def test_pd_options_without_pd_are_refused(tmp_path, capsys):
    assert calibrate_main(["run", "--out", str(tmp_path / "b"), "--connector", "nixl"]) == 2
    assert "--connector: options of a prefill/decode pair; add --pd" in " ".join(capsys.readouterr().err.split())


def test_nixl_check_names_the_missing_module_and_the_fix(tmp_path, capsys):
    """The project's own Python has no nixl: the check says so, and `run --pd --connector nixl` stops
    before launching anything, with that reason."""
    problem = nixl_problem(sys.executable)
    assert problem and "No module named 'nixl" in problem and "pip install nixl" in problem
    rc = calibrate_main(
        ["run", "--pd", "--connector", "nixl", "--out", str(tmp_path / "b"), "--vllm-python", sys.executable]
    )
    assert rc == 2
    assert "NixlConnector cannot run" in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "b").exists()
    assert "no vLLM Python" in nixl_problem(str(tmp_path / "nopython"))


def test_nixl_counters_from_a_metrics_page():
    page = """# TYPE vllm:nixl_xfer_time_seconds histogram
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.005"} 3.0
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 4.0
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 0.008
vllm:nixl_bytes_transferred_count{engine="0",model_name="m"} 4.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 4000000.0
vllm:nixl_post_time_seconds_sum{engine="0",model_name="m"} 0.004
"""
    before = parse_counters("")
    after = parse_counters(page)
    t = nixl_transfers(before, after)
    assert t["transfers"] == 4 and t["mean_xfer_s"] == pytest.approx(0.002)
    assert t["bandwidth_Bps"] == pytest.approx(5e8) and t["mean_bytes"] == pytest.approx(1e6)
    assert nixl_transfers(after, after) == {"transfers": 0}
    assert nixl_transfers(None, after) is None


def test_pd_run_killed_with_sigkill_reads_as_interrupted(tmp_path, capsys):
    """A PD run killed before its end leaves status running; its process is gone, so show says interrupted."""
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


@pytest.mark.vllm
@needs_vllm
def test_launcher_keeps_the_binding_and_can_stop_the_nixl_progress_thread():
    """The two NIXL patches of calibration/harness/vllm_launcher.py, in the vLLM Python: the NUMA
    discovery that moves a pinned worker's main thread returns no core, and an agent config made the
    way vLLM makes it has no progress thread."""
    problem = nixl_problem(VLLM_PY)
    if problem:
        pytest.skip(f"NIXL cannot run here: {problem}")
    code = (
        "import calibration.harness.vllm_launcher\n"
        "from vllm.platforms.cpu import CpuPlatform\n"
        "import nixl._api as a\n"
        "print(CpuPlatform.discover_numa_topology(), a.nixl_agent_config(num_threads=0).enable_pthread)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), EPDSIM_NIXL_KEEP_BINDING="1", EPDSIM_NIXL_PROGRESS_THREAD="0")
    r = subprocess.run([VLLM_PY, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["[]", "False"]
    env.pop("EPDSIM_NIXL_KEEP_BINDING")
    env.pop("EPDSIM_NIXL_PROGRESS_THREAD")
    r = subprocess.run([VLLM_PY, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-1] == "True" and r.stdout.split()[-2] != "[]"
