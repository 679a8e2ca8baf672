"""Starting a disaggregated (prefill/decode) vLLM pair, and what a PD run measures besides requests.

Two connectors of vLLM, chosen with ``connector`` (``epdsim calibrate run --pd --connector``):

* ``example`` - vLLM's ``ExampleConnector``: the prefill worker writes the prompt's KV of whole
  blocks as one safetensors file per layer under ``kv_path``; the decode worker loads them back.
  Its transfer figure is the file write+read bandwidth (:func:`file_bandwidth`).
* ``nixl`` - vLLM's ``NixlConnector`` with ``kv_buffer_device: cpu``: pull-based, the decode worker
  reads the prefill worker's KV blocks through NIXL (UCX backend, DRAM to DRAM on one host), after
  a handshake on a side channel (``VLLM_NIXL_SIDE_CHANNEL_HOST`` / ``_PORT``, one free port per
  server).  A pinned pair (``--prefill-bind`` / ``--decode-bind``) keeps its pinning: NixlConnector
  would move each worker's main thread to the host's last core (``EPDSIM_NIXL_KEEP_BINDING``,
  :mod:`calibration.harness.vllm_launcher`).  ``nixl_progress_thread=False`` starts NIXL's agents
  without their progress thread, which polls with ``sched_yield`` on the worker's core
  (``EPDSIM_NIXL_PROGRESS_THREAD=0``).  Needs the ``nixl`` package in the vLLM Python (:func:`nixl_problem`
  says why not); its transfer figures come from the decode server's Prometheus histograms
  ``vllm:nixl_xfer_time_seconds`` and ``vllm:nixl_bytes_transferred`` (:func:`nixl_counters`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx

import hwdb
from calibration.harness.launch_env import (
    DEFAULT_LAUNCH_ENV,
    NO_VLLM_PYTHON,
    default_vllm_python,
    free_port,
    repo_pythonpath,
)
from calibration.harness.metrics import parse_prometheus
from calibration.harness.server import ServerError, ServerProcess
from calibration.pd.bundle import SERVED, PDReplayError
from calibration.pd.options import harness_connectors
from simulator.pd.connector_base import KVConnector
from simulator.pd.connectors import connector_strategy

REPO = Path(__file__).resolve().parents[2]
BLOCK = 128
INJECT_RX = re.compile(r"Inject KV cache of (\d+) tokens")
# What the NIXL check runs in the vLLM Python: the import and one agent with the UCX backend, as the
# connector's worker does (vllm/distributed/nixl_utils.py imports nixl._api; base_worker.py makes the agent).
NIXL_PROBE = (
    "import nixl._api as a; "
    "ag = a.nixl_agent('epdsim-probe', a.nixl_agent_config(backends=['UCX'])); "
    "print(','.join(ag.get_plugin_list()))"
)
NIXL_METRICS = {
    "xfer": "vllm:nixl_xfer_time_seconds",
    "post": "vllm:nixl_post_time_seconds",
    "bytes": "vllm:nixl_bytes_transferred",
}


def pair_python(choice: str | None) -> str:
    """The vLLM Python the pair runs with: the given one, else the harness's default (raises
    :class:`PDReplayError` naming the fix when there is none)."""
    py = choice or default_vllm_python()
    if not py:
        raise PDReplayError(NO_VLLM_PYTHON)
    return py


def harness_connector(connector: str) -> KVConnector:
    """The strategy of a ``--connector`` choice: the hwdb connector of that name, which says what its servers
    need on the CPU pair (raises :class:`PDReplayError` on a connector whose strategy the pair does not run)."""
    try:
        strategy = connector_strategy(hwdb.load().connector(connector))
    except hwdb.HwdbError:
        strategy = None
    if strategy is None or strategy.cpu_pair is None:
        raise PDReplayError(f"--connector {connector}: unknown; choose {' or '.join(harness_connectors())}")
    return strategy


def kv_transfer_config(role: str, kv_path: str, connector: str = "example") -> str:
    return json.dumps(harness_connector(connector).cpu_kv_transfer_config(role, kv_path))


def serve_command(
    py: str,
    model_dir: str,
    port: int,
    role: str,
    kv_path: str,
    extra: list[str] | None = None,
    connector: str = "example",
) -> list[str]:
    return [
        py,
        "-m",
        "calibration.harness.vllm_launcher",
        "serve",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        SERVED,
        "--enable-per-request-metrics",
        "--disable-uvicorn-access-log",
        "--seed",
        "0",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--kv-transfer-config",
        kv_transfer_config(role, kv_path, connector),
        *(extra or []),
    ]


def nixl_problem(vllm_python: str | None = None, timeout: float = 120.0) -> str | None:
    """None when the vLLM Python imports nixl and makes a UCX agent; else why not, in one line
    with the fix (the message ``calibrate run --pd --connector nixl`` stops with, and the skip reason
    of the NIXL tests)."""
    py = vllm_python or default_vllm_python()
    if not py:
        return NO_VLLM_PYTHON
    if not Path(py).exists():
        return f"no vLLM Python at {py}: run .ci/install_vllm_cpu.sh or give --vllm-python"
    try:
        r = subprocess.run(
            [py, "-c", NIXL_PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "UCX_RCACHE_MAX_UNRELEASED": "1024"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the NIXL check in {py} did not run: {type(exc).__name__}: {exc}"
    if r.returncode == 0:
        return None
    lines = [x for x in (r.stderr or r.stdout).strip().splitlines() if x.strip()]
    last = lines[-1] if lines else f"exit code {r.returncode}"
    hint = (
        f"install it with `{py} -m pip install nixl` (.ci/install_vllm_cpu.sh does)"
        if "No module named 'nixl" in last
        else "NIXL is installed but cannot make a UCX agent on this host"
    )
    return f"NixlConnector cannot run with {py}: {last[:300]}; {hint}"


def launch_pair(
    out: Path,
    model_dir: str,
    kv_path: str,
    *,
    vllm_python: str | None = None,
    prefill_bind: str | None = None,
    decode_bind: str | None = None,
    connector: str = "example",
    nixl_progress_thread: bool = True,
    ready_timeout: float = 300.0,
) -> tuple[ServerProcess, ServerProcess]:
    """Start both servers at once and wait for both (raises ServerDied / ReadyTimeout; the caller stops them)."""
    py = pair_python(vllm_python)
    strategy = harness_connector(connector)
    env = {**DEFAULT_LAUNCH_ENV, "PYTHONPATH": repo_pythonpath()}
    servers = []
    given: set[int] = set()

    def port_for_pair() -> int:  # distinct across both servers: none has bound its ports yet
        port = free_port(exclude=given)
        given.add(port)
        return port

    for role, name, bind in (("kv_producer", "prefill", prefill_bind), ("kv_consumer", "decode", decode_bind)):
        port = port_for_pair()
        e = dict(env)
        if bind:
            e["VLLM_CPU_OMP_THREADS_BIND"] = bind
        e.update(strategy.cpu_env(port_for_pair, bool(prefill_bind or decode_bind), nixl_progress_thread))
        srv = ServerProcess(
            serve_command(py, model_dir, port, role, kv_path, connector=connector),
            f"http://127.0.0.1:{port}",
            out / f"{name}.log",
            env=e,
            cwd=REPO,
        )
        servers.append(srv.start())
    for s in servers:
        s.wait_ready(timeout=ready_timeout)
    return servers[0], servers[1]


def file_bandwidth(folder: Path, bytes_per_file: int, files: int = 4, reps: int = 30) -> dict:
    """Write then read back ``files`` files of ``bytes_per_file`` (page cache, no fsync, as
    ExampleConnector does); bytes moved over write+read time, and the per-transfer time."""
    folder.mkdir(parents=True, exist_ok=True)
    payload = os.urandom(bytes_per_file)
    tw = tr = 0.0
    for r in range(reps):
        d = folder / f"bw{r}"
        d.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        for i in range(files):
            with open(d / f"l{i}", "wb") as fh:
                fh.write(payload)
        t1 = time.perf_counter()
        for i in range(files):
            with open(d / f"l{i}", "rb") as fh:
                fh.read()
        t2 = time.perf_counter()
        tw += t1 - t0
        tr += t2 - t1
        shutil.rmtree(d)
    moved = bytes_per_file * files * reps
    return {
        "bytes_per_file": bytes_per_file,
        "files": files,
        "reps": reps,
        "write_Bps": moved / tw,
        "read_Bps": moved / tr,
        "write_read_Bps": moved / (tw + tr),
        "per_transfer_s": (tw + tr) / reps,
    }


def count_injections(log_path: Path) -> list[int]:
    try:
        return [int(m.group(1)) for m in INJECT_RX.finditer(log_path.read_text(errors="replace"))]
    except OSError:
        return []


def parse_counters(text: str) -> dict:
    """``{key: {"sum": s, "count": n}}`` of the NIXL histograms in a Prometheus text page (all label sets added)."""
    sc = parse_prometheus(text)
    return {k: {p: sc.value(f"{name}_{p}") for p in ("sum", "count")} for k, name in NIXL_METRICS.items()}


def nixl_counters(base_url: str) -> dict | None:
    """The decode server's NIXL histograms now (None when its /metrics cannot be read)."""
    try:
        r = httpx.get(base_url.rstrip("/") + "/metrics", timeout=10)
        r.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_counters(r.text)


def nixl_transfers(before: dict | None, after: dict | None) -> dict | None:
    """What the decode server's NIXL reads took between two :func:`nixl_counters` (the load test):
    transfers, mean time and bytes per transfer, and bytes over transfer time."""
    if before is None or after is None:
        return None
    d = {k: {p: after[k][p] - before[k][p] for p in ("sum", "count")} for k in NIXL_METRICS}
    n = int(round(d["xfer"]["count"]))
    if n <= 0:
        return {"transfers": 0}
    return {
        "transfers": n,
        "xfer_time_s_sum": d["xfer"]["sum"],
        "post_time_s_sum": d["post"]["sum"],
        "bytes_sum": d["bytes"]["sum"],
        "mean_xfer_s": d["xfer"]["sum"] / n,
        "mean_post_s": d["post"]["sum"] / n,
        "mean_bytes": d["bytes"]["sum"] / n,
        "bandwidth_Bps": d["bytes"]["sum"] / d["xfer"]["sum"] if d["xfer"]["sum"] > 0 else None,
        "source": f"decode server /metrics: {NIXL_METRICS['xfer']}, {NIXL_METRICS['bytes']} (after - before the load)",
    }


# The NIXL handshake of the first request through the router took 0.21-0.96 s on the 2-core host
# (docs/validation/cpu.md); a prefill server whose side channel failed to bind never answers it, and neither
# vLLM nor the router times it out.
HANDSHAKE_TIMEOUT_S = 120.0


class HandshakeTimeout(ServerError):
    """The NIXL handshake of the pair did not complete (:data:`HANDSHAKE_TIMEOUT_S`)."""


def log_errors(servers, lines: int = 400, most: int = 3) -> str:
    """The last error lines in the last ``lines`` lines of each launched server's log file (its path where it
    has none), to say why a pair hung; ``''`` for servers the harness did not launch."""
    found = []
    for role, srv in zip(("prefill", "decode"), servers, strict=False):
        if not isinstance(srv, ServerProcess):
            continue
        try:
            tail = srv.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            tail = []
        errs = [ln.strip() for ln in tail if "Error" in ln or "Exception in thread" in ln][-most:]
        what = " | ".join(e[:200] for e in errs) if errs else "no error line"
        found.append(f"{role} log {srv.log_path}: {what}")
    return "; ".join(found)
