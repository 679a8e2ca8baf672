"""KV connectors as deployment strategies: what each connector needs in a plan's artefacts.

The simulation parameters of a connector (bandwidth efficiency, setup time, host staging, its TCP mode)
are data in hwdb ``connectors/<name>.yaml`` (:class:`hwdb.schema.Connector`); how it is *deployed* (its vLLM
``--kv-transfer-config`` per role, container environment and ports, proxy, README notes, SGLang's transfer
backend, the CPU calibration pair's settings) is one small subclass of
:class:`simulator.pd.connector_base.KVConnector` here, registered in :data:`CONNECTORS`.  An hwdb connector
names its class with ``strategy:`` (default: the class registered under the connector's own name), so a new
connector is one registered class plus one YAML file, or only a YAML file naming an existing class.

What each connector needs on the wire, from the engines' own documentation:

* NixlConnector (vLLM ``docs/features/nixl_connector_usage.md``): UCX transports ``UCX_TLS`` and devices
  ``UCX_NET_DEVICES`` (NCCL variables do not apply), a side channel ``VLLM_NIXL_SIDE_CHANNEL_HOST`` /
  ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (5600 in the examples) that the peer reaches; vLLM's toy proxy
  ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` (``--prefiller-hosts/--prefiller-ports/
  --decoder-hosts/--decoder-ports``) in front.  Over TCP: ``UCX_TLS=tcp,cuda_copy``.
* P2pNcclConnector (vLLM ``docs/design/p2p_nccl_connector.md``): ``kv_port``, ``kv_buffer_size`` and
  ``kv_connector_extra_config`` ``{proxy_ip, proxy_port, http_port}`` with ``http_port`` equal to
  ``--port``; the proxy ``disagg_proxy_p2p_nccl_xpyd.py`` serves clients on 10001 and takes the
  instances' registrations on 30001 (it needs ``quart``).  Over TCP NCCL uses its socket transport
  (``NCCL_IB_DISABLE=1``, ``NCCL_SOCKET_IFNAME``).
* MooncakeConnector (vLLM 0.32 ``docs/features/mooncake_connector_usage.md``, ``vllm/distributed/kv_transfer/
  kv_connector/v1/mooncake/mooncake_connector.py``): ``kv_producer``/``kv_consumer``; the prefill instance
  runs a bootstrap server on ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` (8998) where its workers register.  Its proxy
  is vLLM's ``examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py`` (``--prefill URL
  BOOTSTRAP_PORT`` per prefill instance, ``--decode URL`` per decode instance): at start it asks each
  prefill's bootstrap ``/query`` for its engine id, then sends the prefill ``kv_transfer_params``
  ``{do_remote_decode, transfer_id}`` and the decode ``{do_remote_prefill, remote_bootstrap_addr,
  remote_engine_id, transfer_id}``; without a ``transfer_id`` (the NIXL toy proxy) the prefill skips the
  send ("Missing transfer_id") and the decode recomputes.  Because the proxy pins one engine id and one
  bootstrap address per ``--prefill`` entry, every prefill pod needs its own address: the prefill pool is a
  StatefulSet behind a headless Service (``<svc>-<i>.<svc>``).  Over TCP ``kv_connector_extra_config``
  ``{"mooncake_protocol": "tcp"}`` (default "rdma") and ``MC_FORCE_TCP=1`` (Mooncake transfer engine).
* ExampleConnector (vLLM's reference connector): ``kv_producer``/``kv_consumer`` and the NIXL toy proxy.

This module imports no planner module (the simulator's transfer model asks it too); ``opts`` below is a
:class:`simulator.plan.manifests.ArtefactOptions`.
"""

from __future__ import annotations

import hwdb
from simulator.pd.connector_base import (
    CPU_FILES,
    CPU_NIXL,
    VLLM_PORT,
    VLLM_REF,
    KVConnector,
    Proxy,
    pod_ip,
    producer_or_consumer,
)
from simulator.registry import Registry

MOONCAKE_BOOTSTRAP_PORT = 8998  # vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default (prefill instances)
NIXL_SIDE_CHANNEL_PORT = 5600
P2P_KV_PORT = 21001
P2P_PROXY_HTTP_PORT = 10001
P2P_PROXY_ZMQ_PORT = 30001
P2P_PROXY = "examples/online_serving/disaggregated_serving_p2p_nccl_xpyd/disagg_proxy_p2p_nccl_xpyd.py"
MOONCAKE_PROXY = "examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py"
# The hwdb connectors a comparison uses when it names none: on GPU-direct fabrics, and on the others.
RDMA_CONNECTOR = "nixl"
HOST_STAGED_CONNECTOR = "tcp"


# Connector strategy classes by name; an hwdb connector's ``strategy`` (default: its name) picks one.
CONNECTORS: Registry[type[KVConnector]] = Registry("KV connector strategy", plural="KV connector strategies")
register = CONNECTORS.register


def connector_strategy(conn: hwdb.schema.Connector) -> KVConnector:
    """The strategy deploying hwdb connector ``conn``; an unknown ``strategy`` raises
    :class:`simulator.registry.UnknownNameError` (a ValueError) listing the registered ones."""
    return CONNECTORS.get(conn.strategy or conn.name)(conn)


@register
class Nixl(KVConnector):
    """vLLM's NixlConnector over UCX: ``kv_both`` on every pod, the side channel on 5600, the toy proxy."""

    name = "nixl"
    # UCX transports of the TCP mode; the host-staged connector uses them on every fabric.
    tcp_only = False
    cpu_pair: str | None = CPU_NIXL

    def tp_mapping_error(self, engine, prefill_tp, decode_tp):
        # vLLM's NixlConnector maps a prefill rank's KV heads onto decode ranks only when decode TP is a multiple
        # of prefill TP; SGLang's and TensorRT-LLM's transfer engines re-shard any pair of divisible TP sizes.
        if engine == "vllm" and decode_tp % prefill_tp:
            return (
                f"prefill TP={prefill_tp} and decode TP={decode_tp} cannot map KV shards with NixlConnector, "
                "which needs the decode TP to be a multiple of the prefill TP; use prefill tp <= decode tp"
            )
        return None

    def vllm_connector(self):
        return "NixlConnector"

    def kv_transfer_config(self, role, proxy_host, buffer_bytes, tcp):
        return {"kv_connector": self.vllm_connector(), "kv_role": "kv_both"}

    def env(self, tcp, opts, role):
        return [
            pod_ip(),
            {"name": "UCX_TLS", "value": "tcp,cuda_copy" if tcp or self.tcp_only else "all"},
            {"name": "UCX_NET_DEVICES", "value": opts.socket_ifname if tcp else opts.ucx_net_devices},
            {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"},
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)},
        ]

    def ports(self, role):
        return [{"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT, "protocol": "TCP"}]

    def tcp_mode(self):
        return "NIXL over UCX `UCX_TLS=tcp,cuda_copy`"

    def sglang_backend(self):
        return "nixl"

    def sglang_device_args(self, ib_device, tcp):
        # NIXL finds its NICs through UCX_NET_DEVICES (env), not through an SGLang flag.
        return []

    def cpu_kv_transfer_config(self, kv_role, kv_path):
        # kv_buffer_device cpu: the KV cache is in host memory and NIXL registers it as DRAM
        return {**super().cpu_kv_transfer_config(kv_role, kv_path), "kv_buffer_device": "cpu"}

    def cpu_env(self, free_port, pinned, progress_thread):
        env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
        if pinned:  # keep the pinning: calibration/harness/vllm_launcher.py says why
            env["EPDSIM_NIXL_KEEP_BINDING"] = "1"
        if not progress_thread:
            env["EPDSIM_NIXL_PROGRESS_THREAD"] = "0"
        return env


@register
class HostTcp(Nixl):
    """The host-staged TCP connector, deployed as NixlConnector over UCX's TCP transport."""

    name = "tcp"
    tcp_only = True
    cpu_pair = None  # it has no vLLM connector name to start the CPU pair with

    def tp_mapping_error(self, engine, prefill_tp, decode_tp):
        # Modelled as a generic host-staged path (hwdb tcp.yaml), not as vLLM's NIXL rank mapping.
        return None

    def tcp_mode(self):
        return "NixlConnector over UCX `UCX_TLS=tcp,cuda_copy` (host-staged)"

    # SGLang has no host-staged NIXL mode: its Mooncake backend (TCP transport on a TCP fabric) serves it.
    sglang_backend = KVConnector.sglang_backend
    sglang_device_args = KVConnector.sglang_device_args


@register
class P2pNccl(KVConnector):
    """vLLM's P2pNcclConnector: NCCL between the pods, registrations with its own proxy, a pinned vLLM."""

    name = "p2pnccl"

    def kv_transfer_config(self, role, proxy_host, buffer_bytes, tcp):
        cfg: dict = {"kv_connector": self.vllm_connector(), "kv_role": producer_or_consumer(role)}
        dflt = self.conn.default_buffer_bytes
        buf = buffer_bytes or (dflt.value if dflt else 1e9)
        # The prefill side receives nothing in PUT_ASYNC: its buffer is token-sized ("1e1").
        cfg.update(
            kv_buffer_size="1e1" if role == "prefill" else f"{buf:.3g}",
            kv_port=str(P2P_KV_PORT),
            kv_connector_extra_config={
                "proxy_ip": proxy_host,
                "proxy_port": str(P2P_PROXY_ZMQ_PORT),
                "http_port": str(VLLM_PORT),
                "send_type": "PUT_ASYNC",
            },
        )
        return cfg

    def env(self, tcp, opts, role):
        return [pod_ip()] + (
            [{"name": "NCCL_IB_DISABLE", "value": "1"}, {"name": "NCCL_SOCKET_IFNAME", "value": opts.socket_ifname}]
            if tcp
            else []
        )

    def ports(self, role):
        return [{"name": "kv", "containerPort": P2P_KV_PORT, "protocol": "TCP"}]

    def vllm_image(self, opts, amd):
        return opts.p2pnccl_vllm_image

    def proxy(self, ends, opts):
        # The script binds 10001 (clients) and 30001 (registrations); it is fetched at the pods' vLLM tag.
        tag = opts.p2pnccl_vllm_image.rsplit(":", 1)[-1]
        return Proxy(
            "p2pnccl",
            P2P_PROXY,
            "python3 /tmp/proxy.py",
            (("http", P2P_PROXY_HTTP_PORT), ("zmq", P2P_PROXY_ZMQ_PORT)),
            ref=tag if tag.startswith("v") else VLLM_REF,
            setup="pip install --no-cache-dir quart && ",
        )

    def tcp_mode(self):
        return "NCCL's socket transport (`NCCL_IB_DISABLE=1`, `NCCL_SOCKET_IFNAME`)"

    def readme_notes(self, opts):
        return [
            "- **P2pNcclConnector**: instances register with the proxy (`proxy_ip`/`proxy_port` 30001 "
            "in `--kv-transfer-config`); `http_port` must equal `--port`; `kv_buffer_size` on decode is "
            "the buffer the plan modelled: overflow goes to host memory and slows the transfer. "
            f"vLLM 0.32 no longer ships P2pNcclConnector: the pods run `{opts.p2pnccl_vllm_image}` "
            "(a release of its P2P NCCL guide); or plan with connector nixl."
        ]


@register
class Mooncake(KVConnector):
    """vLLM's MooncakeConnector: a bootstrap server per prefill pod, which its own proxy reaches pod by pod."""

    name = "mooncake"

    def kv_transfer_config(self, role, proxy_host, buffer_bytes, tcp):
        cfg: dict = {"kv_connector": self.vllm_connector(), "kv_role": producer_or_consumer(role)}
        if tcp:
            cfg["kv_connector_extra_config"] = {"mooncake_protocol": "tcp"}
        return cfg

    def env(self, tcp, opts, role):
        boot = (
            [{"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": str(MOONCAKE_BOOTSTRAP_PORT)}]
            if role == "prefill"
            else []
        )
        return [pod_ip()] + boot + ([{"name": "MC_FORCE_TCP", "value": "1"}] if tcp else [])

    def ports(self, role):
        return (
            [{"name": "bootstrap", "containerPort": MOONCAKE_BOOTSTRAP_PORT, "protocol": "TCP"}]
            if role == "prefill"
            else []
        )

    def per_pod(self, role):
        return role == "prefill"

    def proxy(self, ends, opts):
        # One --prefill URL BOOTSTRAP_PORT per prefill pod (the proxy queries that pod's bootstrap server for
        # its engine id and hands decode that address), one --decode URL per decode Service.
        run = (
            f"python3 /tmp/proxy.py --host 0.0.0.0 --port {VLLM_PORT} "
            + " ".join(f"--prefill {u} {MOONCAKE_BOOTSTRAP_PORT}" for u in ends["prefill"])
            + " "
            + " ".join(f"--decode {u}" for u in ends["decode"])
        )
        return Proxy("mooncake", MOONCAKE_PROXY, run, (("http", VLLM_PORT),))

    def tcp_mode(self):
        return (
            'Mooncake\'s TCP transport (`"mooncake_protocol":"tcp"` in `kv_connector_extra_config`, `MC_FORCE_TCP=1`)'
        )

    def readme_notes(self, opts):
        return [
            "- **MooncakeConnector**: the proxy is vLLM's Mooncake proxy (`--prefill URL "
            f"{MOONCAKE_BOOTSTRAP_PORT}` per prefill pod, `--decode URL` per decode Service): it gives both sides "
            "the `transfer_id` and the decode side the prefill's bootstrap address and engine id, which "
            "MooncakeConnector needs (the NIXL toy proxy sends none: prefill skips the send, decode recomputes). "
            f"Each prefill pod runs a bootstrap server on {MOONCAKE_BOOTSTRAP_PORT} "
            "(`VLLM_MOONCAKE_BOOTSTRAP_PORT`, container port `bootstrap`). The proxy learns one engine id per "
            "prefill address, so the prefill pool is a **StatefulSet behind a headless Service**: pod `i` is "
            "`<prefill>-i.<prefill>`, listed in the proxy's command; scaling the prefill pool means editing "
            "`replicas` and the proxy's `--prefill` list together. The proxy reads the engine ids once at "
            "start: after a prefill pod restarts (new engine id), restart the proxy (`kubectl rollout restart "
            "deploy/<proxy>`). The transfer engine and the side channel listen on ports chosen at start: "
            "NetworkPolicies must let prefill and decode pods reach each other on any port. The image needs "
            "the Mooncake transfer engine (`pip install mooncake-transfer-engine-cuda13`, or "
            "`mooncake-transfer-engine` on CUDA 12, per vLLM's Mooncake guide); build one `FROM` the vLLM "
            "image if `python3 -c 'import mooncake.engine'` fails in it."
        ]

    def epd_notes(self, opts):
        return [
            "- **E+P+D with MooncakeConnector**: vLLM's EPD proxy hands the prefill's "
            "`kv_transfer_params` to decode as for NIXL and sends no `transfer_id`, which "
            "MooncakeConnector needs: plan E+P+D with connector nixl, or front it with a proxy "
            "that sends them."
        ]

    def files_note(self):
        return " (the Mooncake prefill pool: a StatefulSet and headless Service)"


@register
class Example(KVConnector):
    """vLLM's reference ExampleConnector (files on a shared path): the defaults."""

    name = "example"
    cpu_pair = CPU_FILES

    def cpu_kv_transfer_config(self, kv_role, kv_path):
        return {
            **super().cpu_kv_transfer_config(kv_role, kv_path),
            "kv_connector_extra_config": {"shared_storage_path": kv_path},
        }
