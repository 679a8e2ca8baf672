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
from simulator.memory import memory_fraction
from simulator.ops.coldstart import breakdown
from simulator.ops.k8s import recommend_probes
from simulator.pd.connector_base import VLLM_PORT
from simulator.pd.connectors import connector_strategy
from simulator.plan.manifests import (
    SGLANG_PORT,
    ArtefactOptions,
    cache_claim,
    engine_deployment,
    env_exports,
    epd_proxy,
    pod_urls,
    proxy_objects,
)
from simulator.plan.readme import readme
from simulator.plan.sglang import ROUTER_MODULE, SERVE_DTYPE, router_args, sglang_args, sglang_objects
from simulator.resolved import resolve
from simulator.scenario import deployment_for


class _NoAliases(yaml.SafeDumper):
    """Writes repeated mappings (the pod labels) in full: manifests read by people and kubectl alike."""

    def ignore_aliases(self, data) -> bool:
        return True


def dns_name(text: str) -> str:
    """A Kubernetes DNS-1123 label: lowercase alphanumerics and '-', at most 63 characters."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (s[:63].rstrip("-")) or "epdsim"


def kv_transfer_json(
    connector: hwdb.schema.Connector | None,
    role: str,
    proxy_host: str = "epdsim-proxy",
    buffer_bytes: float | None = None,
    tcp: bool = False,
) -> dict | None:
    """vLLM ``--kv-transfer-config`` for a PD pool (``role``: prefill or decode); None for colocated, or for a
    connector without a vLLM name.  The shape is the connector strategy's
    (:meth:`simulator.pd.connector_base.KVConnector.kv_transfer_config`): NixlConnector ``kv_both``,
    MooncakeConnector and P2pNcclConnector ``kv_producer``/``kv_consumer`` with their extra settings.
    ``buffer_bytes``: the scenario's ``kv_buffer_size`` (bytes); ``tcp``: the fabric has no GPU-direct path.
    """
    if connector is None or role == "colocated":
        return None
    return connector_strategy(connector).kv_transfer_config(role, proxy_host, buffer_bytes, tcp)


def ec_transfer_json(role: str) -> dict:
    """vLLM ``--ec-transfer-config`` (encoder-cache transfer, EPD): the encoder pool produces
    embeddings, the colocated or prefill pool consumes them.  vLLM 0.32 ships ECExampleConnector (disk),
    ECCPUConnector and ECMooncakeConnector; the RDMA one stands for the modelled NIXL/Mooncake path."""
    return {"ec_connector": "ECMooncakeConnector", "ec_role": "ec_producer" if role == "encoder" else "ec_consumer"}


def vllm_args(
    model_id: str,
    dep,
    role: str,
    connector,
    encoder_tier: bool = False,
    proxy_host: str = "epdsim-proxy",
    buffer_bytes: float | None = None,
    tcp: bool = False,
) -> list[str]:
    """``vllm serve`` argument vector (after ``vllm serve``) for one instance of a pool."""
    k = dep.knobs
    args = [model_id, "--host", "0.0.0.0", "--port", str(VLLM_PORT), "--tensor-parallel-size", str(dep.tp)]
    if dep.pp > 1:
        args += ["--pipeline-parallel-size", str(dep.pp)]
    if dep.dp > 1:
        args += ["--data-parallel-size", str(dep.dp)]
    if dep.ep > 1:
        # vLLM's expert parallelism spans every GPU of the instance (EP = DP x TP); a partial EP with
        # experts also sliced (SGLang's --ep-size below --tp-size) has no vLLM flag.
        if dep.ep != dep.gpus:
            raise ValueError(
                f"ep={dep.ep}: vLLM's --enable-expert-parallel spreads the experts over all "
                f"{dep.gpus} GPUs of an instance (dp x tp); use ep: 1 or ep: {dep.gpus} for vLLM"
            )
        args += ["--enable-expert-parallel"]
    args += [
        "--dtype",
        SERVE_DTYPE[dep.weight_dtype],
        "--max-model-len",
        str(k.max_model_len),
        "--max-num-seqs",
        str(k.max_num_seqs),
        "--max-num-batched-tokens",
        str(k.max_num_batched_tokens),
        "--gpu-memory-utilization",
        f"{memory_fraction(dep):.3g}",
        "--block-size",
        str(k.block_size),
    ]
    if dep.weight_dtype == "fp8":
        args += ["--quantization", "fp8"]
    if dep.kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    if k.enforce_eager:
        args += ["--enforce-eager"]
    kv = kv_transfer_json(connector, role, proxy_host, buffer_bytes, tcp) if role != "encoder" else None
    if kv is not None:
        args += ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
    if role == "encoder":
        args += ["--mm-encoder-only"]
    if role == "encoder" or (encoder_tier and role in ("colocated", "prefill")):
        args += ["--ec-transfer-config", json.dumps(ec_transfer_json(role), separators=(",", ":"))]
    return args


def _probes(dep, port: int = VLLM_PORT):
    """Probes on /health sized by the cold-start model (vLLM's phases; SGLang's start has the same ones:
    weights, warm-up, graph capture)."""
    return recommend_probes(breakdown(dep, "miss", level="high"), path="/health", port=port)


def _fabric(db, scn, dep):
    """The KV fabric of a PD scenario: (link or None for colocated, TCP i.e. no GPU-direct, network layout)."""
    if not scn.is_pd:
        return None, False, None
    kv = scn.kv_transfer
    if kv.same_node:
        return dep.intra_link, not dep.intra_link.gpu_direct, None
    link, lay = db.fabric(kv.fabric or dep.gpu.scale_out_link)
    return link, not link.gpu_direct, lay


def _rdma(link, lay, gpus: int, opts: ArtefactOptions) -> tuple[str, int]:
    """The NIC device-plugin resource a PD pod requests: on EFA the AWS plugin's vpc.amazonaws.com/efa, one
    per EFA card of the pod's GPUs (4 per GPU on p5); elsewhere ArtefactOptions.rdma_resource."""
    if link.kind == "efa" and opts.rdma_resource == ArtefactOptions.rdma_resource:
        per_gpu = lay.nics_per_node // lay.gpus_per_node if lay and lay.nics_per_node >= lay.gpus_per_node else 1
        return "vpc.amazonaws.com/efa", per_gpu * gpus
    return opts.rdma_resource, opts.rdma_per_pod


def artefacts(result, candidate_id: str | None = None, options: ArtefactOptions | None = None) -> dict[str, str]:
    """Files for the recommended candidate (or ``candidate_id``): filename -> text.

    ``vllm/<pool>.sh``, ``sglang/<pool>.sh`` (and ``sglang/router.sh`` for PD), ``k8s/deployment.yaml``
    (multi-document: model-cache claim, Deployments and Services of the pools and, for PD/EPD, of the
    proxy), ``k8s/sglang.yaml`` (the same deployment on SGLang, with its router for PD; apply one of the
    two), ``router.yaml``, ``README.md``.  ``options``: registry, RDMA resource, host networking, ...
    (:class:`ArtefactOptions`).  Raises ValueError when there is no recommendation and no id.
    """
    opts = options or ArtefactOptions()
    cid = candidate_id or (result.recommended or {}).get("id")
    if cid is None:
        raise ValueError(
            "the plan has no recommendation (nothing meets the SLO); pass candidate_id= one of "
            "result.closest['id'] to get artefacts for it anyway"
        )
    cand = result.candidate(cid)
    scn = result.to_scenario(cid)
    rs = resolve(scn)
    db, model = rs.db, rs.model
    model_id = model.sidecar.hf_id or model.name
    connector = db.connector(scn.kv_transfer.connector) if scn.is_pd else None
    strategy = connector_strategy(connector) if connector is not None else None
    base = dns_name(result.request.name)
    proxy_name = dns_name(f"{base}-proxy")
    enc = next((p for p in scn.pools if p.role == "encoder"), None)
    items = [(r.pool, r.dep) for r in rs.pools]
    if enc is not None:
        # The encoder instance runs the same vLLM with --mm-encoder-only; its cold start is sized on the
        # model's deployment on that GPU (an upper bound: it loads the vision tower only).
        items.insert(0, (enc, deployment_for(enc, model, db)))
    link, tcp, lay = _fabric(db, scn, items[-1][1])
    rdma = scn.is_pd and not tcp and link.kind in ("infiniband", "roce", "efa")
    svc = {pool.name: dns_name(f"{base}-{pool.name}") for pool, _ in items}
    claim = dns_name(f"{base}-model-cache")
    files: dict[str, str] = {}
    docs: list[dict] = [cache_claim(claim, opts)]
    sg_pools: list[dict] = []
    routes: list[dict] = []
    enc_urls = [f"http://{svc[enc.name]}:{SGLANG_PORT}"] if enc is not None else None
    for pool, dep in items:
        name = svc[pool.name]
        va = vllm_args(
            model_id,
            dep,
            pool.role,
            connector,
            encoder_tier=enc is not None,
            proxy_host=proxy_name,
            buffer_bytes=scn.kv_transfer.kv_buffer_size,
            tcp=tcp,
        )
        # the connector strategy of a PD pool (there is one exactly when the scenario is PD)
        pd_strategy = strategy if scn.is_pd and pool.role in ("prefill", "decode") else None
        env = pd_strategy.env(tcp, opts, pool.role) if pd_strategy is not None else []
        # A pool whose pods the proxy reaches one by one (Mooncake prefill: a bootstrap server per pod).
        per_pod = pd_strategy is not None and pd_strategy.per_pod(pool.role)
        head = (
            f"#!/usr/bin/env bash\n# {cand.layout}: pool {pool.name} ({pool.role}), {pool.instances} instance(s) "
            f"of {dep.gpus}x {dep.gpu.name}; run once per instance\n"
        )
        files[f"vllm/{pool.name}.sh"] = head + env_exports(env) + "vllm serve " + shlex.join(va) + "\n"
        sa = sglang_args(model_id, dep, pool.role, connector, tcp, enc_urls, "mlx5_0" if rdma else None)
        files[f"sglang/{pool.name}.sh"] = head + "python -m sglang.launch_server " + shlex.join(sa) + "\n"
        amd = dep.gpu.vendor == "amd"
        extra = pd_strategy.ports(pool.role) if pd_strategy is not None else []
        image = strategy.vllm_image(opts, amd) if strategy else opts.vllm_rocm_image if amd else opts.vllm_image
        nic = _rdma(link, lay, dep.gpus, opts) if rdma and pool.role in ("prefill", "decode") else None
        docs += engine_deployment(
            name,
            pool.role,
            pool.instances,
            opts.image(image),
            ["vllm", "serve"],
            va,
            "amd.com/gpu" if amd else "nvidia.com/gpu",
            dep.gpus,
            _probes(dep),
            env,
            nic,
            opts,
            extra,
            claim,
            per_pod=per_pod,
        )
        sg_pools.append(
            {
                "name": name,
                "role": pool.role,
                "instances": pool.instances,
                "amd": amd,
                "args": sa,
                "gpus": dep.gpus,
                "probes": _probes(dep, SGLANG_PORT),
                "env": env,
                "rdma": nic,
            }
        )
        routes.append(
            {
                "pool": pool.name,
                "role": pool.role,
                "service": f"http://{name}:{VLLM_PORT}",
                "replicas": pool.instances,
                "policy": pool.router,
            }
        )
        if per_pod:
            routes[-1]["pods"] = pod_urls(name, pool.instances, VLLM_PORT)
    ends: dict[str, list[str]] = {}
    for r in routes:
        ends.setdefault(r["role"], []).extend(r.get("pods", [r["service"]]))
    proxy = epd_proxy(ends) if enc is not None else strategy.proxy(ends, opts) if strategy is not None else None
    if proxy is not None:
        first = items[-1][1]
        image = opts.image(opts.proxy_image or (opts.vllm_rocm_image if first.gpu.vendor == "amd" else opts.vllm_image))
        docs += proxy_objects(proxy_name, proxy, image, opts)
    files["k8s/deployment.yaml"] = yaml.dump_all(docs, Dumper=_NoAliases, sort_keys=False)
    sg = {r["role"]: f"http://{svc[r['pool']]}:{SGLANG_PORT}" for r in routes}
    sg_router = router_args(sg["prefill"], sg["decode"]) if scn.is_pd else None
    files["k8s/sglang.yaml"] = yaml.dump_all(
        sglang_objects(sg_pools, cache_claim(claim, opts), opts, proxy_name if scn.is_pd else None, sg_router),
        Dumper=_NoAliases,
        sort_keys=False,
    )
    router: dict = {
        "model": model_id,
        "mode": ("e+" if enc is not None else "") + ("pd" if scn.is_pd else "colocated"),
        "pools": routes,
    }
    if proxy is not None:
        router["proxy"] = {"kind": proxy.kind, "service": f"http://{proxy_name}:{proxy.ports[0][1]}"}
    if sg_router is not None:  # PD
        kv = kv_transfer_json(connector, "decode", proxy_name)  # None: the connector has no vLLM name
        router["kv_transfer"] = {
            "connector": kv["kv_connector"] if kv is not None else None,
            "fabric": cand.fabric,
            "tcp": tcp,
            "flow": scn.kv_transfer.flow,
        }
        cmd = f"python -m {ROUTER_MODULE} " + shlex.join(sg_router)
        router["sglang_router"] = cmd
        files["sglang/router.sh"] = "#!/usr/bin/env bash\n# SGLang's PD router in front of the pools\n" + cmd + "\n"
    files["router.yaml"] = yaml.safe_dump(router, sort_keys=False)
    rec = result.recommended if result.recommended and result.recommended["id"] == cid else None
    files["README.md"] = readme(
        result,
        cand,
        model,
        rec,
        opts,
        proxy=proxy,
        tcp=tcp,
        rdma=rdma,
        layout=lay,
        amd=any(d.gpu.vendor == "amd" for _, d in items),
        link=link,
        connector=strategy,
        encoder=enc is not None,
    )
    return files
