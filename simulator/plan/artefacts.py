"""Deployable artefacts for a planned deployment: vLLM and SGLang command lines per pool (with the
KV-transfer configuration for PD), Kubernetes manifests (Deployments with probes sized by the
cold-start model, GPU resources, Services) and the router configuration.

``artefacts(result)`` returns ``{filename: text}`` for the recommendation (or a chosen candidate);
nothing is written to disk here.
"""
from __future__ import annotations

import json
import re
import shlex

import yaml

import hwdb
from simulator.coldstart import breakdown
from simulator.k8s import recommend_probes
from simulator.scenario import deployment_for, resolve

VLLM_IMAGE = "vllm/vllm-openai:v0.32.0"
SGLANG_IMAGE = "lmsysorg/sglang:latest"
VLLM_PORT = 8000
SGLANG_PORT = 30000
KV_PORT = 14579
_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp8": "auto"}


class _NoAliases(yaml.SafeDumper):
    """Writes repeated mappings (the pod labels) in full: manifests read by people and kubectl alike."""

    def ignore_aliases(self, data) -> bool:
        return True


def dns_name(text: str) -> str:
    """A Kubernetes DNS-1123 label: lowercase alphanumerics and '-', at most 63 characters."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (s[:63].rstrip("-")) or "epdsim"


def kv_transfer_json(connector: hwdb.schema.Connector | None, role: str) -> dict | None:
    """vLLM ``--kv-transfer-config`` for a PD pool (``role``: prefill or decode); None for colocated.

    NixlConnector serves both directions (``kv_both``); the other connectors take a producer
    (prefill) and a consumer (decode) role.
    """
    if connector is None or role == "colocated":
        return None
    name = connector.vllm_name
    if name is None:
        return None
    if name == "NixlConnector":
        return {"kv_connector": name, "kv_role": "kv_both"}
    cfg = {"kv_connector": name, "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}
    if name == "P2pNcclConnector":
        cfg.update(kv_port=KV_PORT, kv_connector_extra_config={"kv_buffer_size": "1e9"})
    return cfg


def ec_transfer_json(role: str) -> dict:
    """vLLM ``--ec-transfer-config`` (encoder-cache transfer, EPD): the encoder pool produces
    embeddings, the colocated or prefill pool consumes them.  vLLM 0.32 ships ECExampleConnector (disk),
    ECCPUConnector and ECMooncakeConnector; the RDMA one stands for the modelled NIXL/Mooncake path."""
    return {"ec_connector": "ECMooncakeConnector", "ec_role": "ec_producer" if role == "encoder" else "ec_consumer"}


def vllm_args(model_id: str, dep, role: str, connector, encoder_tier: bool = False) -> list[str]:
    """``vllm serve`` argument vector (after ``vllm serve``) for one instance of a pool."""
    k = dep.knobs
    args = [model_id, "--port", str(VLLM_PORT), "--tensor-parallel-size", str(dep.tp)]
    if dep.pp > 1:
        args += ["--pipeline-parallel-size", str(dep.pp)]
    args += ["--dtype", _DTYPE[dep.weight_dtype], "--max-model-len", str(k.max_model_len),
             "--max-num-seqs", str(k.max_num_seqs), "--max-num-batched-tokens", str(k.max_num_batched_tokens),
             "--gpu-memory-utilization", f"{k.gpu_memory_utilization:g}", "--block-size", str(k.block_size)]
    if dep.weight_dtype == "fp8":
        args += ["--quantization", "fp8"]
    if dep.kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    if k.enforce_eager:
        args += ["--enforce-eager"]
    kv = kv_transfer_json(connector, role) if role != "encoder" else None
    if kv is not None:
        args += ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
    if role == "encoder":
        args += ["--mm-encoder-only"]
    if role == "encoder" or (encoder_tier and role in ("colocated", "prefill")):
        args += ["--ec-transfer-config", json.dumps(ec_transfer_json(role), separators=(",", ":"))]
    return args


def sglang_args(model_id: str, dep, role: str, connector) -> list[str]:
    """``python -m sglang.launch_server`` arguments for one instance of a pool."""
    k = dep.knobs
    args = ["--model-path", model_id, "--host", "0.0.0.0", "--port", str(SGLANG_PORT), "--tp-size", str(dep.tp),
            "--dtype", _DTYPE[dep.weight_dtype], "--context-length", str(k.max_model_len),
            "--max-running-requests", str(k.max_num_seqs), "--chunked-prefill-size", str(k.max_num_batched_tokens),
            "--mem-fraction-static", f"{k.gpu_memory_utilization:g}"]
    if dep.kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8_e4m3"]
    if role in ("prefill", "decode"):
        backend = connector.name if connector is not None and connector.name in ("nixl", "mooncake") else "mooncake"
        args += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", backend]
    return args


def _probes(dep):
    return recommend_probes(breakdown(dep, "miss", level="high"), path="/health", port=VLLM_PORT)


def _manifests(name: str, pool, dep, args: list[str], gpu_resource: str) -> list[dict]:
    rec = _probes(dep)
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "epdsim-plan",
              "epdsim/role": pool.role}
    container = {
        "name": "vllm",
        "image": VLLM_IMAGE,
        "command": ["vllm", "serve"],
        "args": args,
        "ports": [{"name": "http", "containerPort": VLLM_PORT, "protocol": "TCP"}],
        "resources": {"limits": {gpu_resource: str(dep.gpus)}, "requests": {gpu_resource: str(dep.gpus)}},
        "startupProbe": rec.startup.to_k8s(),
        "livenessProbe": rec.liveness.to_k8s(),
        "readinessProbe": rec.readiness.to_k8s(),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "vllm-cache", "mountPath": "/root/.cache/vllm"}],
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"epdsim/modelled-start-s": f"{rec.basis_s:.0f}"}},
        "spec": {"replicas": pool.instances, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [container],
                                       "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                                                   {"name": "vllm-cache", "emptyDir": {}}]}}},
    }
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
               "spec": {"selector": labels, "ports": [{"name": "http", "port": VLLM_PORT, "targetPort": "http",
                                                       "protocol": "TCP"}]}}
    return [deployment, service]


def artefacts(result, candidate_id: str | None = None) -> dict[str, str]:
    """Files for the recommended candidate (or ``candidate_id``): filename -> text.

    ``vllm/<pool>.sh``, ``sglang/<pool>.sh``, ``k8s/deployment.yaml`` (multi-document),
    ``router.yaml``, ``README.md``.  Raises ValueError when there is no recommendation and no id.
    """
    cid = candidate_id or (result.recommended or {}).get("id")
    if cid is None:
        raise ValueError("the plan has no recommendation (nothing meets the SLO); pass candidate_id= one of "
                         "result.closest['id'] to get artefacts for it anyway")
    cand = result.candidate(cid)
    scn = result.to_scenario(cid)
    db, model, pools = resolve(scn)
    model_id = model.sidecar.hf_id or model.name
    connector = db.connector(scn.kv_transfer.connector) if scn.is_pd else None
    base = dns_name(result.request.name)
    files: dict[str, str] = {}
    docs: list[dict] = []
    routes = []
    enc = next((p for p in scn.pools if p.role == "encoder"), None)
    items = [(pool, dep) for pool, dep, _mem, _step in pools]
    if enc is not None:
        # The encoder instance runs the same vLLM with --mm-encoder-only; its cold start is sized on the
        # model's deployment on that GPU (an upper bound: it loads the vision tower only).
        items.insert(0, (enc, deployment_for(enc, model, db)))
    for pool, dep in items:
        name = dns_name(f"{base}-{pool.name}")
        va = vllm_args(model_id, dep, pool.role, connector, encoder_tier=enc is not None)
        head = (f"#!/usr/bin/env bash\n# {cand.layout}: pool {pool.name} ({pool.role}), {pool.instances} instance(s) "
                f"of {dep.gpus}x {dep.gpu.name}; run once per instance\n")
        files[f"vllm/{pool.name}.sh"] = head + "vllm serve " + shlex.join(va) + "\n"
        if pool.role != "encoder":
            sa = sglang_args(model_id, dep, pool.role, connector)
            files[f"sglang/{pool.name}.sh"] = head + "python -m sglang.launch_server " + shlex.join(sa) + "\n"
        resource = "amd.com/gpu" if dep.gpu.vendor == "amd" else "nvidia.com/gpu"
        docs += _manifests(name, pool, dep, va, resource)
        routes.append({"pool": pool.name, "role": pool.role, "service": f"http://{name}:{VLLM_PORT}",
                       "replicas": pool.instances, "policy": pool.router})
    files["k8s/deployment.yaml"] = yaml.dump_all(docs, Dumper=_NoAliases, sort_keys=False)
    router = {"model": model_id, "mode": ("e+" if enc is not None else "") + ("pd" if scn.is_pd else "colocated"),
              "pools": routes}
    if scn.is_pd:
        router["kv_transfer"] = {"connector": connector.vllm_name or connector.name, "fabric": cand.fabric,
                                 "flow": scn.kv_transfer.flow}
        ends = {r["role"]: r["service"] for r in routes}
        router["sglang_router"] = ("python -m sglang_router.launch_router --pd-disaggregation "
                                   f"--prefill {ends['prefill']} --decode {ends['decode']} --port 8080")
    files["router.yaml"] = yaml.safe_dump(router, sort_keys=False)
    rec = result.recommended if result.recommended and result.recommended["id"] == cid else None
    files["README.md"] = (
        f"# {result.request.name}: {cand.layout}\n\n"
        f"Planned by epdsim for {result.request.target_rate:g} req/s of {model.name}; cost "
        f"${cand.cost_usd_per_hour:,.2f}/h on {cand.gpus} GPUs.\n"
        + (f"Simulated goodput {rec['goodput_rps']:.3g} req/s (headroom {rec['headroom_rate']:+.0%} over the target).\n"
           if rec else "")
        + "\nFiles: vllm/*.sh and sglang/*.sh (one command per instance of each pool), k8s/deployment.yaml "
          "(Deployments and Services; probes sized by the cold-start model, `epdsim probes`), router.yaml "
          "(the pools behind the router, its policy, and for PD the connector and an SGLang router command).\n"
        + ("The encoder pool (vLLM --mm-encoder-only with an EC connector) has no SGLang command here.\n"
           if enc is not None else ""))
    return files
