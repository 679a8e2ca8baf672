"""Where a bundle's and a fit's figures come from, as they say it.

* Under ``--pin`` the manifest records the host's CPUs and the server's (engine and front-end lists
  together), not the one CPU the harness itself ran on; ``calibrate show`` prints those cores, and
  ``calibrate fit`` derives the CPU peak from them, also for a bundle written before they were
  recorded (its ``hardware.server.cpu_affinity`` then held the harness's pinned CPU: 1 on 2 cores).
* The calibrated engine's ``frontend_*`` figures say they were fitted, by which command on which
  bundle, or that they are 0 and why: none reads like a default.
"""

from __future__ import annotations

import json
import os

import pytest
import yaml

import hwdb
from calibration import cli
from calibration.fit.command import fit_bundle
from calibration.fit.frontend import FrontEndFit
from calibration.fit.host import host_check
from calibration.fit.report import final_engine, frontend_sources
from calibration.harness import env
from tests.synthetic_bundle import CPU_TRUTH, TINY_CONFIG, make_bundle, write_truth_hwdb
from tests.test_calibration_host import EPYC

#: Zen 4 with AVX-512 BF16: 64 bf16 FLOP per cycle and core at the recorded 2.596126 GHz
ZEN4_PER_CORE = 64 * 2.596126e9
FRONTEND = (
    "frontend_s",
    "frontend_serial_s_per_token",
    "frontend_stream_s_per_output",
    "frontend_stream_s_per_chunk",
    "frontend_stream_s_per_request",
)


def test_hardware_under_pin_records_the_host_and_the_servers_cpus():
    """The harness runs on the front end's CPU while pinned; the record is the server's two lists."""
    hw = env.hardware({0, 1, 2, 3}, ({0}, {1}))
    assert hw["cpu_count"] == os.cpu_count()
    assert hw["cpu_affinity"] == 2 and hw["cpus"] == [0, 1]
    assert hw["pinned"] == {"engine_cpus": [0], "front_cpus": [1]}
    assert hw["cores_basis"] == "the server's CPUs under --pin: engine 0, front end 1"
    free = env.hardware({0, 1})
    assert free["cpu_affinity"] == 2 and "pinned" not in free and "could use" in free["cores_basis"]
    assert env.server_cores({"hardware": {"server": hw}}) == (2, hw["cores_basis"])


def _old_pinned_manifest(m: dict) -> dict:
    """``m`` as a pinned launch on a 2-core EPYC host recorded it before the server's CPUs were kept:
    ``cpu_affinity`` 1 (the harness's own CPU), the layout only in ``launches[].pin``."""
    m["hardware"]["server"] = {
        "cpu_count": 2,
        "cpu_affinity": 1,
        "memory_bytes": 8 * 2**30,
        "cpu": env.cpu_id(EPYC),
        "gpus": [],
    }
    m["launches"] = [
        {
            "index": 0,
            "command": ["vllm", "serve"],
            "pid": 1,
            "ready_s": 30.0,
            "pin": {"engine_cpus": [0], "front_cpus": [1], "threads_moved_to_engine_cpus": 14},
        }
    ]
    return m


def test_a_bundle_pinned_before_the_cores_were_recorded_counts_the_servers_cpus():
    m = _old_pinned_manifest({"hardware": {"server": {}}})
    base = hwdb.load().gpu("CPU-host")
    halved, _ = host_check(m, base, explicit_gpu=False)  # what the recorded figure alone gives
    assert halved.peak_flops["bf16"].value == pytest.approx(ZEN4_PER_CORE, rel=1e-4)
    n, why = env.server_cores(m)
    assert n == 2 and "launches[].pin" in why and "engine 0, front end 1" in why
    derived, _ = host_check(env.with_server_cores(m), base, explicit_gpu=False)
    assert derived.peak_flops["bf16"].value == pytest.approx(2 * ZEN4_PER_CORE, rel=1e-4)
    assert m["hardware"]["server"]["cpu_affinity"] == 1  # the bundle's own manifest is not edited


@pytest.fixture(scope="module")
def pinned_fit(tmp_path_factory):
    """A synthetic bundle recorded as an old pinned launch on a 2-core EPYC, and its fit."""
    root = tmp_path_factory.mktemp("pinned")
    tiny = root / "tiny-llama"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tiny / "epdsim.yaml").write_text(yaml.safe_dump({"name": "tiny-llama", "source": "test copy"}))
    bundle = make_bundle(root / "b", write_truth_hwdb(root / "truth", tiny, CPU_TRUTH, hwdb.load()), tiny)
    mf = bundle / "manifest.json"
    mf.write_text(json.dumps(_old_pinned_manifest(json.loads(mf.read_text()))))
    return bundle, fit_bundle(bundle)


def test_show_and_fit_count_the_servers_cores_not_the_harnesss(pinned_fit, capsys, monkeypatch):
    bundle, fit = pinned_fit
    monkeypatch.setenv("COLUMNS", "250")
    assert cli.main(["show", str(bundle)]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "1 cores" not in shown
    assert "2 cores (the server's CPUs under --pin (launches[].pin): engine 0, front end 1; the host has 2)" in shown
    assert fit.derived_gpu and fit.gpu.peak_flops["bf16"].value == pytest.approx(2 * ZEN4_PER_CORE, rel=1e-4)
    assert "2 cores" in fit.gpu.peak_flops["bf16"].source
    assert fit.host["cores"] == 2 and "--pin" in fit.host["cores_basis"]


def test_the_fitted_front_end_says_it_was_fitted_and_by_what(pinned_fit):
    bundle, fit = pinned_fit
    eng = final_engine(fit)
    assert fit.frontend.frontend_s is not None
    for key in FRONTEND:
        src = getattr(eng, key).source
        assert f"`epdsim calibrate fit {fit.provenance['bundle']}`" in src and "on bundle" in src, (key, src)
        assert src.startswith(("fitted by", "0, not fitted, by")), (key, src)
    assert eng.frontend_stream_s_per_output.source.startswith("0, not fitted")
    assert "lone requests" in eng.frontend_s.source


def test_front_end_sources_of_a_kept_and_of_a_rejected_loop():
    kept = FrontEndFit(
        frontend_s=0.003,
        serial_s_per_token=2e-6,
        stream_s_per_chunk=4e-4,
        stream_s_per_request=0.0,
        lone_requests=24,
        loaded_requests=30,
        phases=["load_poisson_r4"],
    )
    s = frontend_sources(kept, "cpu-fit")
    assert s["frontend_stream_s_per_chunk"].startswith("fitted by `epdsim calibrate fit cpu-fit` on bundle cpu-fit")
    assert "30 requests of load_poisson_r4" in s["frontend_stream_s_per_chunk"]
    assert "read as 0" in s["frontend_stream_s_per_request"]  # at the scan's floor
    assert "24 lone requests" in s["frontend_s"] and "less the API server loop's share" in s["frontend_s"]
    rejected = FrontEndFit(frontend_s=0.005, lone_requests=24, stream_why="no better than none (F = 0.3 < 3.9)")
    r = frontend_sources(rejected, "cpu-fit")
    assert r["frontend_stream_s_per_chunk"] == (
        "0, not fitted, by `epdsim calibrate fit cpu-fit` on bundle cpu-fit: "
        "no API server loop kept (no better than none (F = 0.3 < 3.9))"
    )
    assert r["frontend_serial_s_per_token"].startswith("0, not fitted") and "loop" not in r["frontend_s"]
    assert frontend_sources(FrontEndFit(), "cpu-fit") == {}
