"""The host a CPU bundle records, and what ``calibrate fit`` makes of it (calibration/fit/host.py).

A fit's efficiencies are relative to the ``CPU-host`` entry's peaks; the shipped entry describes an
Intel Xeon VM with AMX.  On another CPU the fit derives the entry from the recorded CPU family and
says so; where it cannot, it warns; a busy host is warned about too.
"""

from __future__ import annotations

import json

import pytest
import yaml

import hwdb
from calibration.fit.command import fit_bundle
from calibration.fit.host import cpu_family, host_check
from calibration.fit.report import write_outputs
from calibration.harness import env
from calibration.validation.command import validate
from tests.synthetic_bundle import CPU_TRUTH, TINY_CONFIG, make_bundle, write_truth_hwdb

#: /proc/cpuinfo heads as these hosts print them (flags cut to the ones that matter plus a few)
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
cpu MHz\t\t: 2596.126
bogomips\t: 5192.25
flags\t\t: fpu sse sse2 fma avx avx2 avx512f avx512dq avx512_bf16 avx512_vnni

processor\t: 1
vendor_id\t: AuthenticAMD
"""
XEON_AMX = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
bogomips\t: 4200.00
flags\t\t: fpu sse fma avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes
CPU implementer\t: 0x41
"""


def test_cpu_id_reads_vendor_family_clock_and_isa():
    c = env.cpu_id(EPYC)
    assert (c["vendor"], c["family"], c["model"], c["model_name"]) == ("AuthenticAMD", 25, 17, "AMD EPYC")
    assert c["clock_ghz"] == pytest.approx(2.596, abs=1e-3) and c["clock_source"].startswith("cpu MHz")
    assert c["isa"] == ["avx512f", "avx512_bf16", "avx512_vnni", "avx2", "fma"]
    x = env.cpu_id(XEON_AMX)
    assert "amx_bf16" in x["isa"] and x["clock_ghz"] == pytest.approx(2.1) and "BogoMIPS" in x["clock_source"]
    assert env.cpu_id(ARM)["isa"] == ["asimd"]
    cond = env.conditions()
    assert len(cond["loadavg"]) == 3 and cond["cores"] >= 1


def _manifest(cpuinfo: str | None, *, load: float = 0.3, cores: int = 2) -> dict:
    server = {"cpu_count": cores, "cpu_affinity": cores, "memory_bytes": 8 * 2**30}
    if cpuinfo is not None:
        server["cpu"] = env.cpu_id(cpuinfo)
    return {
        "hardware": {"server": server},
        "runs": [{"conditions": {"before": {"loadavg": [load, load, load], "cores": cores, "at": "t0"}}}],
    }


def test_epyc_without_amx_gets_a_derived_entry():
    base = hwdb.load().gpu("CPU-host")
    derived, rep = host_check(_manifest(EPYC), base, explicit_gpu=False)
    # Zen 4: 64 bf16 / 32 fp32 FLOP per cycle per core, 2 cores, 2.596 GHz
    assert derived.peak_flops["bf16"].value == pytest.approx(64 * 2 * 2.596126e9, rel=1e-4)
    assert derived.peak_flops["fp32"].value == pytest.approx(32 * 2 * 2.596126e9, rel=1e-4)
    assert "AMD EPYC" in derived.peak_flops["bf16"].source and "Zen 4" in derived.peak_flops["bf16"].source
    assert derived.memory_bytes.value == 8 * 2**30
    assert "not measured on this host" in derived.memory_bandwidth_Bps.source
    assert rep["entry"] == "derived" and len(rep["warnings"]) == 1 and "not a 2-vCPU Intel Xeon" in rep["warnings"][0]
    assert rep["shipped_peak_bf16"] / rep["peak_bf16"] > 10  # what the shipped entry would have been off by


def test_host_the_entry_describes_uses_it_without_warnings():
    base = hwdb.load().gpu("CPU-host")
    derived, rep = host_check(_manifest(XEON_AMX), base, explicit_gpu=False)
    assert derived is None and rep["entry"] == "shipped" and rep["warnings"] == []
    assert cpu_family(env.cpu_id(XEON_AMX)).bf16_per_cycle == 1024
    # the shipped file still describes that host (the module's SHIPPED_HOST must follow it)
    text = hwdb.__path__[0] + "/data/gpus/CPU-host.yaml"
    assert "AMX" in open(text).read() and "Intel Xeon" in open(text).read()


@pytest.mark.parametrize(
    "cpuinfo, explicit, phrase",
    [(None, False, "records no CPU ISA"), (ARM, False, "cannot be derived"), (EPYC, True, "--gpu was given")],
)
def test_hosts_it_cannot_vouch_for_are_warned_about(cpuinfo, explicit, phrase):
    derived, rep = host_check(_manifest(cpuinfo), hwdb.load().gpu("CPU-host"), explicit_gpu=explicit)
    assert derived is None and rep["entry"] == "shipped"
    assert any(phrase in w for w in rep["warnings"]), rep["warnings"]


def test_busy_host_is_warned_about():
    _, quiet = host_check(_manifest(XEON_AMX, load=1.9), hwdb.load().gpu("CPU-host"), explicit_gpu=False)
    _, busy = host_check(_manifest(XEON_AMX, load=2.8), hwdb.load().gpu("CPU-host"), explicit_gpu=False)
    assert quiet["busy_runs"] == [] and quiet["warnings"] == []
    assert busy["busy_runs"] == ["run 0 (load 2.80 on 2 cores at t0)"]
    assert "host was busy" in busy["warnings"][0]


def test_fit_on_an_epyc_bundle_writes_the_derived_entry(tmp_path):
    tiny = tmp_path / "tiny-llama"
    tiny.mkdir()
    (tiny / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tiny / "epdsim.yaml").write_text(yaml.safe_dump({"name": "tiny-llama", "source": "test copy"}))
    bundle = make_bundle(tmp_path / "b", write_truth_hwdb(tmp_path / "truth", tiny, CPU_TRUTH, hwdb.load()), tiny)
    mf = bundle / "manifest.json"
    m = json.loads(mf.read_text())
    m.update(_manifest(EPYC, load=3.5))
    mf.write_text(json.dumps(m))
    fit = fit_bundle(bundle)
    assert fit.derived_gpu and fit.gpu.peak_flops["bf16"].value == pytest.approx(64 * 2 * 2.596126e9, rel=1e-4)
    # the bundle was simulated at the shipped peak: against a 13x lower peak the efficiency is 13x higher
    shipped = hwdb.load().gpu("CPU-host").peak_flops["bf16"].value
    eff = fit.result.params["compute_max_eff"] * fit.gpu.peak_flops["bf16"].value / shipped
    assert eff == pytest.approx(CPU_TRUTH["compute_max_eff"], rel=0.3)
    paths = write_outputs(fit, tmp_path / "hw")
    db = hwdb.load([tmp_path / "hw"])
    assert db.gpu("CPU-host").peak_flops["bf16"].value == pytest.approx(fit.gpu.peak_flops["bf16"].value)
    assert paths["gpu"].name == "CPU-host.yaml"
    rep = json.loads(paths["report"].read_text())
    assert rep["host"]["entry"] == "derived" and rep["host"]["busy_runs"]
    assert "host: the host was busy" in db.profiles[fit.profile.name].notes
    # validate picks the derived entry up from the folder: the replay matches the (simulated) truth
    v = validate(bundle, tmp_path / "hw", out=tmp_path / "val")
    assert v["gpu"] == "CPU-host" and v["checks"] > 0
    errs = [abs(r["rel_error"]) for r in v["phases"][0]["rows"] if r["check"] and r["stat"] == "p50"]
    assert errs and max(errs) < 0.15, errs
