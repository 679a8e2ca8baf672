"""The host a CPU bundle was measured on, against the ``CPU-host`` hardware entry the fit uses.

The shipped ``hwdb/data/gpus/CPU-host.yaml`` describes one machine: a 2-vCPU Intel Xeon VM with AMX
(4.3 TFLOP/s bf16).  A fit's efficiencies are relative to that entry's peaks, so on another CPU
(an AMD EPYC without AMX, say) they come out an order of magnitude lower and mean nothing.  This
module reads what the bundle recorded (``hardware.server.cpu``: vendor, family, ISA features,
clock; ``runs[].conditions``: load averages) and

* derives a ``CPU-host`` entry from the detected CPU family (:func:`derived_cpu_host`), with the
  derivation as each figure's source, when the host is not the one the shipped entry describes;
* says why not, when it cannot (no ISA recorded, an unknown ISA): the shipped entry is then used
  and a warning says so, never silently;
* warns when the host was busy (1-min load average above its cores before a run started).

Peaks per core and cycle (dense matmul, the bound oneDNN/PyTorch kernels approach):

===================================  ==============  ==============
ISA                                  bf16 FLOP/cyc   fp32 FLOP/cyc
===================================  ==============  ==============
AMX (``amx_bf16``)                   1024            64
AVX-512 with 2 x 512-bit FMA units   128 (VDPBF16PS) 64
  AMD Zen 4 (family 25, AVX-512)     64              32 (512-bit ops on 256-bit datapaths)
AVX2 + FMA (2 x 256-bit FMA units)   32 (via fp32)   32
===================================  ==============  ==============
"""

from __future__ import annotations

from dataclasses import dataclass

from hwdb.schema import GPU, Figure

#: what the shipped CPU-host entry describes (its file header and figure sources say so)
SHIPPED_HOST = {
    "vendor": "GenuineIntel",
    "isa": "amx_bf16",
    "text": "a 2-vCPU Intel Xeon VM with AMX (4.3 TFLOP/s bf16 = 1,024 FLOP/cycle x 2 cores x 2.1 GHz)",
}


@dataclass(frozen=True)
class Family:
    name: str
    bf16_per_cycle: int
    fp32_per_cycle: int
    source: str


def cpu_family(cpu: dict) -> Family | None:
    """The peak-setting family of a CPU recorded by :func:`calibration.harness.env.cpu_id`, or None."""
    isa = set(cpu.get("isa") or [])
    vendor, fam = cpu.get("vendor"), cpu.get("family")
    if "amx_bf16" in isa:
        return Family(
            "Intel AMX",
            1024,
            64,
            "Intel AMX: 1,024 BF16 FLOP per cycle per core (Intel AMX overview); "
            "fp32 on AVX-512, 2 FMA units x 16 lanes x 2",
        )
    if vendor == "AuthenticAMD" and fam == 25 and "avx512f" in isa:
        bf = 64 if "avx512_bf16" in isa else 32
        return Family(
            "AMD Zen 4 (AVX-512 on 256-bit datapaths)",
            bf,
            32,
            "AMD family 25 with AVX-512 (Zen 4): 2 FMA pipes of 256 bits, a 512-bit op takes two passes: "
            "fp32 2 x 8 lanes x 2 = 32 FLOP per cycle per core; bf16 "
            + ("VDPBF16PS 2 x 16 pairs x 2 = 64" if bf == 64 else "through fp32, 32"),
        )
    if "avx512f" in isa:
        bf = 128 if "avx512_bf16" in isa else 64
        return Family(
            "AVX-512" + (" BF16" if bf == 128 else ""),
            bf,
            64,
            "AVX-512 with 2 FMA units: fp32 2 x 16 lanes x 2 = 64 FLOP per cycle per core; bf16 "
            + ("VDPBF16PS 2 x 32 pairs x 2 = 128" if bf == 128 else "through fp32, 64")
            + " (a CPU with one 512-bit FMA unit reaches half)",
        )
    if "avx2" in isa and "fma" in isa:
        return Family(
            "AVX2 + FMA",
            32,
            32,
            "AVX2 with 2 FMA units: fp32 2 x 8 lanes x 2 = 32 FLOP per cycle per "
            "core; bf16 converted to fp32, the same rate",
        )
    return None


def matches_shipped(cpu: dict) -> bool:
    return cpu.get("vendor") == SHIPPED_HOST["vendor"] and SHIPPED_HOST["isa"] in (cpu.get("isa") or [])


def derived_cpu_host(base: GPU, cpu: dict, cores: int, memory_bytes: int | None, fam: Family) -> GPU:
    """``base`` (the shipped CPU-host GPU entry) with peaks from ``fam`` x ``cores`` x the recorded clock."""
    ghz = cpu["clock_ghz"]
    what = (
        f"derived by epdsim calibrate fit from the bundle's host: {cpu.get('model_name')} "
        f"({cpu.get('vendor')}, family {cpu.get('family')}, model {cpu.get('model')}), {cores} cores x "
        f"{ghz:g} GHz ({cpu.get('clock_source')}); ISA {', '.join(cpu.get('isa') or []) or 'none'}; "
    )
    peaks = {
        "bf16": Figure(
            value=fam.bf16_per_cycle * cores * ghz * 1e9,
            empirical=True,
            source=what + f"{fam.bf16_per_cycle} bf16 FLOP per cycle per core: {fam.source}",
        ),
        "fp32": Figure(
            value=fam.fp32_per_cycle * cores * ghz * 1e9,
            empirical=True,
            source=what + f"{fam.fp32_per_cycle} fp32 FLOP per cycle per core: {fam.source}",
        ),
    }
    upd = {
        "peak_flops": peaks,
        "vendor": "other",
        "memory_bandwidth_Bps": base.memory_bandwidth_Bps.model_copy(
            update={
                "source": "not measured on this host: the shipped CPU-host figure ("
                + base.memory_bandwidth_Bps.source
                + "); measure it with python -m calibration.harness.kernels --phases membw"
            }
        ),
        "notes": f"CPU-host derived for {cpu.get('model_name')} ({fam.name}) by epdsim calibrate fit; the shipped "
        f"entry describes {SHIPPED_HOST['text']}. " + (base.notes or ""),
    }
    if memory_bytes:
        upd["memory_bytes"] = Figure(
            value=float(memory_bytes), source="the bundle's hardware.server.memory_bytes (MemTotal of the server host)"
        )
    return base.model_copy(update=upd)


def host_check(manifest: dict, base: GPU, explicit_gpu: bool) -> tuple[GPU | None, dict]:
    """(derived CPU-host entry or None, report) for a CPU bundle; the report's ``warnings`` say what
    the fit cannot vouch for.  ``explicit_gpu``: the user named the entry with --gpu (kept as given)."""
    hw = (manifest.get("hardware") or {}).get("server")
    hw = hw if isinstance(hw, dict) else {}  # attach mode: a note, or nothing
    warnings: list[str] = []
    rep: dict = {"entry": "shipped", "warnings": warnings}
    cpu = hw.get("cpu")
    cores = hw.get("cpu_affinity") or hw.get("cpu_count")
    derived = None
    if not cpu or not cpu.get("isa"):
        warnings.append(
            f"the bundle records no CPU ISA of its server (hardware.server.cpu; bundles from before it "
            f"was recorded, or attach mode): the fit uses the shipped CPU-host entry, which describes "
            f"{SHIPPED_HOST['text']}; if the server is another CPU the efficiencies are relative to a "
            f"wrong peak. Re-measure in launch mode, or pass --hwdb with your own CPU-host entry"
        )
    elif matches_shipped(cpu):
        rep["cpu"] = cpu
    else:
        rep["cpu"] = cpu
        fam = cpu_family(cpu)
        if explicit_gpu:
            warnings.append(
                f"the server is {cpu.get('model_name')} (ISA {', '.join(cpu['isa'])}), not "
                f"{SHIPPED_HOST['text']}; --gpu was given, so that entry is used as it is"
            )
        elif fam is None or not cpu.get("clock_ghz") or not cores:
            warnings.append(
                f"the server is {cpu.get('model_name')} (ISA {', '.join(cpu['isa'])}), not "
                f"{SHIPPED_HOST['text']}, and its peak cannot be derived (no known ISA family, clock "
                f"or core count): the shipped CPU-host entry is used; its efficiencies mean little. "
                f"Give your own CPU-host entry with --hwdb DIR"
            )
        else:
            derived = derived_cpu_host(base, cpu, int(cores), hw.get("memory_bytes"), fam)
            rep.update(
                entry="derived",
                family=fam.name,
                peak_bf16=derived.peak_flops["bf16"].value,
                shipped_peak_bf16=base.peak_flops["bf16"].value,
            )
            warnings.append(
                f"the server is {cpu.get('model_name')} ({fam.name}), not {SHIPPED_HOST['text']}: "
                f"the fit uses a CPU-host entry derived from it (bf16 peak "
                f"{derived.peak_flops['bf16'].value / 1e9:.0f} GFLOP/s, written to gpus/CPU-host.yaml "
                f"of the output folder)"
            )
    busy = []
    for i, r in enumerate(manifest.get("runs") or []):
        before = ((r.get("conditions") or {}).get("before") or {}) if isinstance(r, dict) else {}
        load, n = before.get("loadavg"), before.get("cores")
        if load and n and load[0] > n:
            busy.append(f"run {i} (load {load[0]:.2f} on {n} cores at {before.get('at')})")
    rep["busy_runs"] = busy
    if busy:
        warnings.append(
            "the host was busy before " + "; ".join(busy) + ": other work competed with the server, "
            "and a profile fitted then can be 40-100% off on a quieter launch; re-measure on an idle host"
        )
    return derived, rep
