"""The KV connector strategy interface: :class:`KVConnector`, whose defaults deploy a vLLM connector that needs
nothing beyond its name, and the :class:`Proxy` a connector puts in front of the pools.

The registered connectors (NIXL, host-staged TCP, P2P NCCL, Mooncake, the reference ExampleConnector) and their
registry :data:`simulator.pd.connectors.CONNECTORS` are in :mod:`simulator.pd.connectors`.  Ports are TCP port
numbers; script paths are paths in vLLM's repository.  This module imports no planner module (the simulator's
transfer model asks it too); ``opts`` below is a :class:`simulator.plan.manifests.ArtefactOptions`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import hwdb

VLLM_PORT = 8000  # the HTTP port every vLLM server and vLLM proxy of a plan listens on
VLLM_REF = "v0.32.0"  # the vLLM git tag proxy scripts are fetched at (that of the default image)
TOY_PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"
# How the CPU calibration pair (calibration.pd.run) reads a connector's transfers (KVConnector.cpu_pair): KV
# through the shared kv_path folder, seen in the decode log and timed by a file probe; or NIXL reads, from the
# decode server's vllm:nixl_* histograms, after a check that the vLLM Python has NIXL.
CPU_FILES = "files"
CPU_NIXL = "nixl"


def pod_ip() -> dict:
    """The ``POD_IP`` EnvVar: the pod's own address, from the downward API (a new dict each call)."""
    return {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def producer_or_consumer(role: str) -> str:
    """vLLM's ``kv_role`` of a one-way connector: the prefill pod produces the KV, the decode pod consumes it."""
    return "kv_producer" if role == "prefill" else "kv_consumer"


@dataclass(frozen=True)
class Proxy:
    """The request router in front of the pools: one of vLLM's proxy scripts, fetched when its pod starts.

    ``kind``: its name in ``router.yaml`` (``toy``, ``p2pnccl``, ``mooncake``, ``epd``); ``script``: its path
    in vLLM's repository, fetched at git tag ``ref``; ``command``: the shell command that runs it once saved
    as ``/tmp/proxy.py``; ``setup``: shell run before the download (e.g. a pip install, ending in ``&& ``);
    ``ports``: (name, TCP port) pairs, the first the one clients call.
    """

    kind: str
    script: str
    command: str
    ports: tuple[tuple[str, int], ...]
    ref: str = VLLM_REF
    setup: str = ""


class KVConnector:
    """How one KV connector is deployed.  Subclasses are registered in
    :data:`simulator.pd.connectors.CONNECTORS` under ``name``; an instance wraps the hwdb record ``conn`` it
    deploys (its ``name``, ``vllm_name``, ``default_buffer_bytes``).

    The defaults are those of a vLLM connector that needs nothing beyond its name: ``kv_producer`` on
    prefill and ``kv_consumer`` on decode, the pod's address in the environment, vLLM's NIXL toy proxy.
    ``role`` is always ``prefill`` or ``decode``; ``tcp``: the fabric has no GPU-direct path, so the
    connector runs in its TCP mode.
    """

    name = ""
    # How the CPU calibration pair measures it (CPU_FILES or CPU_NIXL); None: that pair does not run it.
    cpu_pair: str | None = None

    def __init__(self, conn: hwdb.schema.Connector) -> None:
        self.conn = conn

    def tp_mapping_error(self, engine: str, prefill_tp: int, decode_tp: int) -> str | None:
        """Why this connector cannot move KV between these TP sizes on ``engine`` (None: it can)."""
        return None

    def vllm_connector(self) -> str | None:
        """vLLM's ``kv_connector`` name; None: no vLLM flag is written."""
        return self.conn.vllm_name

    def kv_transfer_config(self, role: str, proxy_host: str, buffer_bytes: float | None, tcp: bool) -> dict | None:
        """vLLM ``--kv-transfer-config`` of a ``role`` pod; ``proxy_host``: the proxy Service's name;
        ``buffer_bytes``: the scenario's ``kv_buffer_size`` in bytes (None: the connector's default)."""
        name = self.vllm_connector()
        return None if name is None else {"kv_connector": name, "kv_role": producer_or_consumer(role)}

    def env(self, tcp: bool, opts, role: str) -> list[dict]:
        """Container ``env`` of a ``role`` pod (Kubernetes EnvVar objects)."""
        return [pod_ip()]

    def ports(self, role: str) -> list[dict]:
        """Container ports of a ``role`` pod besides ``http`` (Kubernetes ContainerPort objects)."""
        return []

    def per_pod(self, role: str) -> bool:
        """Whether the ``role`` pool must give each pod its own address (a StatefulSet behind a headless
        Service) because the proxy talks to pods, not to the pool."""
        return False

    def vllm_image(self, opts, amd: bool) -> str:
        """The vLLM image of every pool of a plan using this connector (before ``opts.registry``)."""
        return opts.vllm_rocm_image if amd else opts.vllm_image

    def proxy(self, ends: dict[str, list[str]], opts) -> Proxy:
        """The PD proxy; ``ends``: role -> the URLs it reaches (per pod where :meth:`per_pod`)."""
        hp = {
            r: (
                " ".join(u.split("//")[1].split(":")[0] for u in ends[r]),
                " ".join(u.rsplit(":", 1)[1] for u in ends[r]),
            )
            for r in ("prefill", "decode")
        }
        run = (
            f"python3 /tmp/proxy.py --host 0.0.0.0 --port {VLLM_PORT} --prefiller-hosts {hp['prefill'][0]} "
            f"--prefiller-ports {hp['prefill'][1]} --decoder-hosts {hp['decode'][0]} "
            f"--decoder-ports {hp['decode'][1]}"
        )
        return Proxy("toy", TOY_PROXY, run, (("http", VLLM_PORT),))

    def tcp_mode(self) -> str:
        """README: what the connector does over a TCP fabric."""
        return self.conn.name

    def readme_notes(self, opts) -> list[str]:
        """README bullets on this connector behind its own PD proxy."""
        return []

    def epd_notes(self, opts) -> list[str]:
        """README bullets on this connector behind vLLM's EPD proxy (an encoder pool in front)."""
        return []

    def files_note(self) -> str:
        """README: what ``k8s/deployment.yaml`` holds beyond a Deployment and Service per pool."""
        return ""

    def sglang_backend(self) -> str:
        """SGLang's ``--disaggregation-transfer-backend``: SGLang moves KV with its own transfer engines, not
        vLLM's connectors; Mooncake's stands in for a connector SGLang has no backend for."""
        return "mooncake"

    def sglang_device_args(self, ib_device: str | None, tcp: bool) -> list[str]:
        """SGLang arguments naming the RDMA NIC of its backend (``ib_device``; None: no RDMA NIC requested).
        Mooncake's engine takes ``--disaggregation-ib-device``; over TCP it needs none."""
        return ["--disaggregation-ib-device", ib_device] if ib_device and not tcp else []

    def cpu_kv_transfer_config(self, kv_role: str, kv_path: str) -> dict:
        """``--kv-transfer-config`` of one server of the CPU calibration pair (:mod:`calibration.pd.launch`):
        ``kv_role`` is vLLM's (``kv_producer`` / ``kv_consumer``), ``kv_path`` a folder both servers share."""
        return {"kv_connector": self.vllm_connector(), "kv_role": kv_role}

    def cpu_env(self, free_port: Callable[[], int], pinned: bool, progress_thread: bool) -> dict[str, str]:
        """Environment of one server of the CPU calibration pair beyond vLLM's own; ``free_port()``: a free
        local TCP port; ``pinned``: the pair's threads are bound to cores; ``progress_thread``: the
        connector's background progress thread is wanted."""
        return {}
