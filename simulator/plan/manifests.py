"""Kubernetes objects and per-connector environment for the planner's artefacts.

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
"""
from __future__ import annotations

from dataclasses import dataclass, field

VLLM_PORT = 8000
SGLANG_PORT = 30000
SGLANG_BOOTSTRAP_PORT = 8998          # SGLang's --disaggregation-bootstrap-port default
MOONCAKE_BOOTSTRAP_PORT = 8998        # vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default (prefill instances)
NIXL_SIDE_CHANNEL_PORT = 5600
P2P_KV_PORT = 21001
P2P_PROXY_HTTP_PORT = 10001
P2P_PROXY_ZMQ_PORT = 30001
VLLM_REF = "v0.32.0"
TOY_PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"
P2P_PROXY = "examples/online_serving/disaggregated_serving_p2p_nccl_xpyd/disagg_proxy_p2p_nccl_xpyd.py"
EPD_PROXY = "examples/disaggregated/disaggregated_encoder/disagg_epd_proxy.py"
MOONCAKE_PROXY = "examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py"


@dataclass(frozen=True)
class ArtefactOptions:
    """What differs between clusters; the artefact README says where each one lands.

    ``rdma_resource``: the device-plugin resource of the RDMA NICs (``rdma/ib`` for the Mellanox
    k8s-rdma-shared-dev-plugin, ``rdma/rdma_shared_device_a``, ``nvidia.com/hostdev``, ...), requested
    once per pod on RDMA fabrics; ``host_network``: run the pods in the node's network namespace (the
    simplest way to reach RDMA NICs without SR-IOV/Multus); ``registry``: prefix for every image.
    """

    registry: str | None = None
    vllm_image: str = "vllm/vllm-openai:v0.32.0"
    vllm_rocm_image: str = "rocm/vllm:latest"
    # P2pNcclConnector and KVTransferConfig.kv_buffer_size are gone from vLLM 0.32 (its connector registry
    # has no P2pNcclConnector; checked against the installed vLLM by the tests): P2pNccl plans pin v0.10.1,
    # a release that has both: vllm/distributed/kv_transfer/kv_connector/v1/p2p (listed in the v0.10.0 and
    # later API docs, docs.vllm.ai/en/v0.10.0/api/vllm/distributed/kv_transfer/kv_connector/v1/), registered as
    # "P2pNcclConnector" in vLLM's kv_connector/factory.py, and KVTransferConfig.kv_buffer_size/kv_port/
    # kv_connector_extra_config (still there in v0.12.0, docs.vllm.ai/en/v0.12.0/api/vllm/config/kv_transfer/);
    # the tag's image exists on Docker Hub (used by Azure/aks-rdma-infiniband PR #92).  Its proxy script is
    # fetched at the same tag (proxy_ref).
    p2pnccl_vllm_image: str = "vllm/vllm-openai:v0.10.1"
    # SGLang's images (docs: "latest contains the newest stable release"; AMD's ROCm build, rocm.docs.amd.com
    # SGLang inference page); pin the release you tested.
    sglang_image: str = "lmsysorg/sglang:latest"
    sglang_rocm_image: str = "rocm/sgl-dev:v0.5.13.post1-ubuntu24.04-py3.14-rocm7.14"
    proxy_image: str | None = None               # default: the vLLM image (it has fastapi/httpx/uvicorn)
    rdma_resource: str = "rdma/ib"
    rdma_per_pod: int = 1
    host_network: bool = False
    ucx_net_devices: str = "all"                 # e.g. mlx5_0:1,mlx5_1:1
    socket_ifname: str = "eth0"                  # TCP fabrics: the interface NCCL/UCX use
    storage_class: str | None = None             # model-cache PVC; None: the cluster default
    model_cache_size: str = "200Gi"
    node_selector: dict = field(default_factory=dict)

    def image(self, name: str) -> str:
        return f"{self.registry.rstrip('/')}/{name}" if self.registry else name


def proxy_ref(kind: str, opts: ArtefactOptions) -> str:
    """The vLLM git tag a proxy script is fetched at: that of the image its pods run (P2pNccl pools pin
    their own), so that script and servers speak the same protocol."""
    if kind == "p2pnccl":
        tag = opts.p2pnccl_vllm_image.rsplit(":", 1)[-1]
        return tag if tag.startswith("v") else VLLM_REF
    return VLLM_REF


def connector_env(connector: str, tcp: bool, opts: ArtefactOptions, role: str | None = None) -> list[dict]:
    """Container ``env`` for a PD pod of ``connector`` (hwdb name) over an RDMA (tcp=False) or TCP fabric;
    ``role``: prefill or decode (a Mooncake prefill pod names its bootstrap port)."""
    pod_ip = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    if connector in ("nixl", "tcp"):
        return [pod_ip, {"name": "UCX_TLS", "value": "tcp,cuda_copy" if tcp or connector == "tcp" else "all"},
                {"name": "UCX_NET_DEVICES", "value": opts.socket_ifname if tcp else opts.ucx_net_devices},
                {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"},
                {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(NIXL_SIDE_CHANNEL_PORT)}]
    if connector == "p2pnccl":
        return [pod_ip] + ([{"name": "NCCL_IB_DISABLE", "value": "1"},
                            {"name": "NCCL_SOCKET_IFNAME", "value": opts.socket_ifname}] if tcp else [])
    if connector == "mooncake":
        boot = ([{"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": str(MOONCAKE_BOOTSTRAP_PORT)}]
                if role == "prefill" else [])
        return [pod_ip] + boot + ([{"name": "MC_FORCE_TCP", "value": "1"}] if tcp else [])
    return [pod_ip]


def env_exports(env: list[dict]) -> str:
    """The same environment as shell exports (for the per-instance scripts)."""
    out = []
    for e in env:
        v = "${POD_IP:-$(hostname -i)}" if "valueFrom" in e else e["value"].replace("$(POD_IP)", "${POD_IP}")
        out.append(f"export {e['name']}={v}\n")
    return "".join(out)


def labels_for(name: str, role: str) -> dict:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "epdsim-plan", "epdsim/role": role}


def _pod_spec(containers: list[dict], opts: ArtefactOptions, volumes: list[dict], host_network: bool) -> dict:
    spec: dict = {"containers": containers}
    if host_network:
        spec.update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")
    if opts.node_selector:
        spec["nodeSelector"] = dict(opts.node_selector)
    if volumes:
        spec["volumes"] = volumes
    return spec


def engine_deployment(name: str, role: str, replicas: int, image: str, command: list[str], args: list[str],
                      gpu_resource: str, gpus: int, probes, env: list[dict], rdma: tuple[str, int] | None,
                      opts: ArtefactOptions, extra_ports: list[dict], cache_claim: str, *, engine: str = "vllm",
                      port: int = VLLM_PORT, per_pod: bool = False) -> list[dict]:
    """A pool's Deployment (GPU and RDMA resources, probes, env, shm and caches) and its Service.

    ``engine``: ``vllm`` or ``sglang`` (container name and compile-cache path); ``port``: the HTTP port the
    server listens on; ``rdma``: (device-plugin resource, count per pod) on RDMA fabrics, else None.
    ``per_pod``: a StatefulSet behind a headless Service instead, so that each pod has a stable address
    ``<name>-<i>.<name>`` (:func:`pod_urls`) for a proxy that must reach one pod, not any of them."""
    labels = labels_for(name, role)
    limits = {gpu_resource: str(gpus)}
    if rdma:
        limits[rdma[0]] = str(rdma[1])
    container = {
        "name": engine, "image": image, "command": command, "args": args,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}] + extra_ports,
        "resources": {"limits": dict(limits), "requests": dict(limits)},
        "startupProbe": probes.startup.to_k8s(), "livenessProbe": probes.liveness.to_k8s(),
        "readinessProbe": probes.readiness.to_k8s(),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "compile-cache", "mountPath": f"/root/.cache/{engine}"},
                         {"name": "hf-cache", "mountPath": "/root/.cache/huggingface"}],
    }
    if env:
        container["env"] = env
    container["envFrom"] = [{"secretRef": {"name": "hf-token", "optional": True}}]   # HF_TOKEN for gated models
    if rdma:
        # RDMA verbs need locked memory; IPC_LOCK lets the NIC pin the KV buffers.
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, {"name": "compile-cache", "emptyDir": {}},
               {"name": "hf-cache", "persistentVolumeClaim": {"claimName": cache_claim}}]
    spec = {"replicas": replicas, "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels},
                         "spec": _pod_spec([container], opts, volumes, opts.host_network and rdma)}}
    if per_pod:
        # Pods start together (not one after the other: each takes the modelled cold start).
        spec = {"serviceName": name, "podManagementPolicy": "Parallel", **spec}
    deployment = {
        "apiVersion": "apps/v1", "kind": "StatefulSet" if per_pod else "Deployment",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"epdsim/modelled-start-s": f"{probes.basis_s:.0f}"}},
        "spec": spec,
    }
    ports = [("http", port)] + [(p["name"], p["containerPort"]) for p in extra_ports if p["name"] == "bootstrap"]
    return [deployment, service(name, labels, ports, headless=per_pod)]


def pod_urls(name: str, replicas: int, port: int) -> list[str]:
    """The stable per-pod URLs of a ``per_pod`` pool (StatefulSet ``name`` behind the headless Service
    ``name``, same namespace): ``http://<name>-<i>.<name>:<port>``."""
    return [f"http://{name}-{i}.{name}:{port}" for i in range(replicas)]


def service(name: str, labels: dict, ports: list[tuple[str, int]], headless: bool = False) -> dict:
    spec = {"selector": labels, "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"}
                                          for n, p in ports]}
    if headless:
        spec = {"clusterIP": "None", **spec}       # DNS names each pod; no load-balanced virtual IP
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels}, "spec": spec}


def cache_claim(name: str, opts: ArtefactOptions) -> dict:
    """The shared Hugging Face cache (weights downloaded once for every pod): ReadWriteMany."""
    spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": opts.model_cache_size}}}
    if opts.storage_class:
        spec["storageClassName"] = opts.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "epdsim-plan"}}, "spec": spec}


def proxy_objects(name: str, kind: str, image: str, ends: dict[str, list[str]], opts: ArtefactOptions) -> list[dict]:
    """The request router in front of the pools: a Deployment running vLLM's own proxy script for ``kind``
    (``toy``: NIXL, ``mooncake``, ``p2pnccl``, ``epd``), fetched at the vLLM tag of the pods it serves
    (:func:`proxy_ref`; bake it into an image for an air-gapped cluster), and its Service, with probes.
    ``ends``: role -> URLs; for ``mooncake`` the prefill URLs are the pods' own (:func:`pod_urls`)."""
    raw = f"https://raw.githubusercontent.com/vllm-project/vllm/{proxy_ref(kind, opts)}/"
    if kind == "p2pnccl":
        script, pre = P2P_PROXY, "pip install --no-cache-dir quart && "
        run = "python3 /tmp/proxy.py"     # the script binds 10001 (clients) and 30001 (registrations)
        ports = [("http", P2P_PROXY_HTTP_PORT), ("zmq", P2P_PROXY_ZMQ_PORT)]
    elif kind == "epd":
        script, pre = EPD_PROXY, ""
        run = (f"python3 /tmp/proxy.py --host 0.0.0.0 --port {VLLM_PORT} --encode-servers-urls "
               + ",".join(ends["encoder"]) + " --prefill-servers-urls " + (",".join(ends.get("prefill", [])) or "disable")
               + " --decode-servers-urls " + ",".join(ends.get("decode", ends.get("colocated", []))))
        ports = [("http", VLLM_PORT)]
    elif kind == "mooncake":
        # One --prefill URL BOOTSTRAP_PORT per prefill pod (the proxy queries that pod's bootstrap server for
        # its engine id and hands decode that address), one --decode URL per decode Service.
        script, pre = MOONCAKE_PROXY, ""
        run = (f"python3 /tmp/proxy.py --host 0.0.0.0 --port {VLLM_PORT} "
               + " ".join(f"--prefill {u} {MOONCAKE_BOOTSTRAP_PORT}" for u in ends["prefill"]) + " "
               + " ".join(f"--decode {u}" for u in ends["decode"]))
        ports = [("http", VLLM_PORT)]
    else:
        script, pre = TOY_PROXY, ""
        hp = {r: (" ".join(u.split("//")[1].split(":")[0] for u in ends[r]),
                  " ".join(u.rsplit(":", 1)[1] for u in ends[r])) for r in ("prefill", "decode")}
        run = (f"python3 /tmp/proxy.py --host 0.0.0.0 --port {VLLM_PORT} --prefiller-hosts {hp['prefill'][0]} "
               f"--prefiller-ports {hp['prefill'][1]} --decoder-hosts {hp['decode'][0]} --decoder-ports {hp['decode'][1]}")
        ports = [("http", VLLM_PORT)]
    cmd = f"{pre}curl -fsSL {raw}{script} -o /tmp/proxy.py && exec {run}"
    return router_objects(name, image, ["/bin/sh", "-c"], [cmd], ports, opts, start_budget_s=300)


def router_objects(name: str, image: str, command: list[str], args: list[str], ports: list[tuple[str, int]],
                   opts: ArtefactOptions, start_budget_s: int = 120) -> list[dict]:
    """A request router in front of the pools (a vLLM proxy script, SGLang's router): one replica, its
    Service, and TCP probes on its first port (the scripts have no common health route; an accepted
    connection means the server listens).  The startup probe allows ``start_budget_s`` for what the
    container does first (pip install, downloading the script); liveness restarts a hung router after 30 s."""
    labels = labels_for(name, "proxy")
    first = ports[0][0]
    startup = {"tcpSocket": {"port": first}, "periodSeconds": 5, "timeoutSeconds": 3, "successThreshold": 1,
               "failureThreshold": start_budget_s // 5 + 1}
    container = {"name": "router", "image": image, "command": command, "args": args,
                 "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports],
                 "startupProbe": startup,
                 "livenessProbe": {"tcpSocket": {"port": first}, "periodSeconds": 10, "timeoutSeconds": 5,
                                   "successThreshold": 1, "failureThreshold": 3},
                 "readinessProbe": {"tcpSocket": {"port": first}, "periodSeconds": 5, "timeoutSeconds": 3,
                                    "successThreshold": 1, "failureThreshold": 3},
                 "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "labels": labels},
                  "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                           "template": {"metadata": {"labels": labels},
                                        "spec": _pod_spec([container], opts, [], False)}}}
    return [deployment, service(name, labels, ports)]
