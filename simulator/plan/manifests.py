"""Kubernetes objects for the planner's artefacts: engine pools, their Services, the model cache and the
request router in front.

What a KV connector adds to a PD pod (its ``--kv-transfer-config``, environment, ports, proxy) is its
strategy's, :mod:`simulator.pd.connectors`; vLLM's EPD proxy (an encoder pool in front) is here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.pd.connector_base import VLLM_PORT, Proxy

SGLANG_PORT = 30000
SGLANG_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default
EPD_PROXY = "examples/disaggregated/disaggregated_encoder/disagg_epd_proxy.py"


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
    # fetched at the same tag (the p2pnccl strategy, simulator.pd.connectors).
    p2pnccl_vllm_image: str = "vllm/vllm-openai:v0.10.1"
    # SGLang's images (docs: "latest contains the newest stable release"; AMD's ROCm build, rocm.docs.amd.com
    # SGLang inference page); pin the release you tested.
    sglang_image: str = "lmsysorg/sglang:latest"
    sglang_rocm_image: str = "rocm/sgl-dev:v0.5.13.post1-ubuntu24.04-py3.14-rocm7.14"
    proxy_image: str | None = None  # default: the vLLM image (it has fastapi/httpx/uvicorn)
    rdma_resource: str = "rdma/ib"
    rdma_per_pod: int = 1
    host_network: bool = False
    ucx_net_devices: str = "all"  # e.g. mlx5_0:1,mlx5_1:1
    socket_ifname: str = "eth0"  # TCP fabrics: the interface NCCL/UCX use
    storage_class: str | None = None  # model-cache PVC; None: the cluster default
    model_cache_size: str = "200Gi"
    node_selector: dict = field(default_factory=dict)

    def image(self, name: str) -> str:
        return f"{self.registry.rstrip('/')}/{name}" if self.registry else name


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


def engine_deployment(
    name: str,
    role: str,
    replicas: int,
    image: str,
    command: list[str],
    args: list[str],
    gpu_resource: str,
    gpus: int,
    probes,
    env: list[dict],
    rdma: tuple[str, int] | None,
    opts: ArtefactOptions,
    extra_ports: list[dict],
    cache_claim: str,
    *,
    engine: str = "vllm",
    port: int = VLLM_PORT,
    per_pod: bool = False,
) -> list[dict]:
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
        "name": engine,
        "image": image,
        "command": command,
        "args": args,
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}] + extra_ports,
        "resources": {"limits": dict(limits), "requests": dict(limits)},
        "startupProbe": probes.startup.to_k8s(),
        "livenessProbe": probes.liveness.to_k8s(),
        "readinessProbe": probes.readiness.to_k8s(),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "compile-cache", "mountPath": f"/root/.cache/{engine}"},
            {"name": "hf-cache", "mountPath": "/root/.cache/huggingface"},
        ],
    }
    if env:
        container["env"] = env
    container["envFrom"] = [{"secretRef": {"name": "hf-token", "optional": True}}]  # HF_TOKEN for gated models
    if rdma:
        # RDMA verbs need locked memory; IPC_LOCK lets the NIC pin the KV buffers.
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    volumes = [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "compile-cache", "emptyDir": {}},
        {"name": "hf-cache", "persistentVolumeClaim": {"claimName": cache_claim}},
    ]
    spec = {
        "replicas": replicas,
        "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": labels},
            "spec": _pod_spec([container], opts, volumes, bool(opts.host_network and rdma)),
        },
    }
    if per_pod:
        # Pods start together (not one after the other: each takes the modelled cold start).
        spec = {"serviceName": name, "podManagementPolicy": "Parallel", **spec}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet" if per_pod else "Deployment",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {"epdsim/modelled-start-s": f"{probes.basis_s:.0f}"},
        },
        "spec": spec,
    }
    ports = [("http", port)] + [(p["name"], p["containerPort"]) for p in extra_ports if p["name"] == "bootstrap"]
    return [deployment, service(name, labels, ports, headless=per_pod)]


def pod_urls(name: str, replicas: int, port: int) -> list[str]:
    """The stable per-pod URLs of a ``per_pod`` pool (StatefulSet ``name`` behind the headless Service
    ``name``, same namespace): ``http://<name>-<i>.<name>:<port>``."""
    return [f"http://{name}-{i}.{name}:{port}" for i in range(replicas)]


def service(name: str, labels: dict, ports: list[tuple[str, int]], headless: bool = False) -> dict:
    spec = {"selector": labels, "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports]}
    if headless:
        spec = {"clusterIP": "None", **spec}  # DNS names each pod; no load-balanced virtual IP
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels}, "spec": spec}


def cache_claim(name: str, opts: ArtefactOptions) -> dict:
    """The shared Hugging Face cache (weights downloaded once for every pod): ReadWriteMany."""
    spec = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": opts.model_cache_size}}}
    if opts.storage_class:
        spec["storageClassName"] = opts.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "epdsim-plan"}},
        "spec": spec,
    }


def epd_proxy(ends: dict[str, list[str]]) -> Proxy:
    """vLLM's EPD proxy in front of an encoder pool and the language-model pools; ``ends``: role -> URLs."""
    run = (
        f"python3 /tmp/proxy.py --host 0.0.0.0 --port {VLLM_PORT} --encode-servers-urls "
        + ",".join(ends["encoder"])
        + " --prefill-servers-urls "
        + (",".join(ends.get("prefill", [])) or "disable")
        + " --decode-servers-urls "
        + ",".join(ends.get("decode", ends.get("colocated", [])))
    )
    return Proxy("epd", EPD_PROXY, run, (("http", VLLM_PORT),))


def proxy_objects(name: str, proxy: Proxy, image: str, opts: ArtefactOptions) -> list[dict]:
    """The request router in front of the pools: a Deployment running one of vLLM's proxy scripts (a KV
    connector's, :meth:`simulator.pd.connector_base.KVConnector.proxy`, or :func:`epd_proxy`), fetched at the
    vLLM tag of the pods it serves (bake it into an image for an air-gapped cluster), and its Service, with
    probes."""
    raw = f"https://raw.githubusercontent.com/vllm-project/vllm/{proxy.ref}/"
    cmd = f"{proxy.setup}curl -fsSL {raw}{proxy.script} -o /tmp/proxy.py && exec {proxy.command}"
    return router_objects(name, image, ["/bin/sh", "-c"], [cmd], list(proxy.ports), opts, start_budget_s=300)


def router_objects(
    name: str,
    image: str,
    command: list[str],
    args: list[str],
    ports: list[tuple[str, int]],
    opts: ArtefactOptions,
    start_budget_s: int = 120,
) -> list[dict]:
    """A request router in front of the pools (a vLLM proxy script, SGLang's router): one replica, its
    Service, and TCP probes on its first port (the scripts have no common health route; an accepted
    connection means the server listens).  The startup probe allows ``start_budget_s`` for what the
    container does first (pip install, downloading the script); liveness restarts a hung router after 30 s."""
    labels = labels_for(name, "proxy")
    first = ports[0][0]
    startup = {
        "tcpSocket": {"port": first},
        "periodSeconds": 5,
        "timeoutSeconds": 3,
        "successThreshold": 1,
        "failureThreshold": start_budget_s // 5 + 1,
    }
    container = {
        "name": "router",
        "image": image,
        "command": command,
        "args": args,
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports],
        "startupProbe": startup,
        "livenessProbe": {
            "tcpSocket": {"port": first},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "successThreshold": 1,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "tcpSocket": {"port": first},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "successThreshold": 1,
            "failureThreshold": 3,
        },
        "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": _pod_spec([container], opts, [], False)},
        },
    }
    return [deployment, service(name, labels, ports)]
