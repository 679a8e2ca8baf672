"""SGLang artefacts of a plan: ``python -m sglang.launch_server`` arguments per pool, the PD router command,
and the same deployment as Kubernetes objects (``k8s/sglang.yaml``, an alternative to the vLLM
``k8s/deployment.yaml`` with the same Service names: apply one of the two).

Flags and ports from SGLang's documentation (``docs/advanced_features/server_arguments.md``,
``pd_disaggregation.md``, ``epd_disaggregation.md``): servers listen on 30000, a PD prefill server opens a
bootstrap port (8998) that decode servers reach through the router; ``/health`` answers once the server
serves.  SGLang does not install on a CPU-only machine, so the tests check flags against those documents.
"""

from __future__ import annotations

from simulator.memory import memory_fraction
from simulator.pd.connector_base import VLLM_PORT
from simulator.pd.connectors import connector_strategy
from simulator.plan.manifests import (
    SGLANG_BOOTSTRAP_PORT,
    SGLANG_PORT,
    ArtefactOptions,
    engine_deployment,
    router_objects,
)

# fp8/fp4/int4: the checkpoint's own quantization_config decides (pre-quantised weights), as in vLLM.
SERVE_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp8": "auto", "fp4": "auto", "int4": "auto"}
ROUTER_MODULE = "sglang_router.launch_router"


def sglang_args(
    model_id: str,
    dep,
    role: str,
    connector,
    tcp: bool = False,
    encoder_urls: list[str] | None = None,
    ib_device: str | None = None,
) -> list[str]:
    """``python -m sglang.launch_server`` arguments for one instance of a pool (role: colocated, prefill,
    decode or encoder).  ``connector``: the hwdb connector of a PD plan (its strategy names SGLang's transfer
    backend; required for prefill and decode); ``encoder_urls``: the encoder Service(s) of an EPD plan, given
    to the language model's ``--language-only`` server."""
    k = dep.knobs
    # SGLang's --tp-size counts every GPU of the instance; with --enable-dp-attention the attention runs
    # as --dp-size ranks of tp-size / dp-size GPUs each and the experts over --ep-size of them.
    args = [
        "--model-path",
        model_id,
        "--host",
        "0.0.0.0",
        "--port",
        str(SGLANG_PORT),
        "--tp-size",
        str(dep.tp * dep.dp),
        "--dtype",
        SERVE_DTYPE[dep.weight_dtype],
        "--context-length",
        str(k.max_model_len),
    ]
    if dep.dp > 1:
        args += ["--dp-size", str(dep.dp), "--enable-dp-attention"]
    if dep.ep > 1:
        args += ["--ep-size", str(dep.ep)]
    if role == "encoder":
        return args + ["--encoder-only", "--encoder-transfer-backend", "mooncake" if not tcp else "zmq_to_scheduler"]
    args += [
        "--max-running-requests",
        str(k.max_num_seqs),
        "--chunked-prefill-size",
        str(k.max_num_batched_tokens),
        "--mem-fraction-static",
        f"{memory_fraction(dep):.3f}",
    ]
    if dep.kv_dtype == "fp8":
        args += ["--kv-cache-dtype", "fp8_e4m3"]
    if role in ("prefill", "decode"):
        strategy = connector_strategy(connector)
        args += ["--disaggregation-mode", role, "--disaggregation-transfer-backend", strategy.sglang_backend()]
        if role == "prefill":
            args += ["--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP_PORT)]
        args += strategy.sglang_device_args(ib_device, tcp)
    if encoder_urls and role in ("colocated", "prefill"):
        args += [
            "--language-only",
            "--encoder-urls",
            *encoder_urls,
            "--encoder-transfer-backend",
            "mooncake" if not tcp else "zmq_to_scheduler",
        ]
    return args


def router_args(prefill_url: str, decode_url: str) -> list[str]:
    """SGLang's PD router: the prefill Service with its bootstrap port, the decode Service; clients on 8000."""
    return [
        "--pd-disaggregation",
        "--prefill",
        prefill_url,
        str(SGLANG_BOOTSTRAP_PORT),
        "--decode",
        decode_url,
        "--host",
        "0.0.0.0",
        "--port",
        str(VLLM_PORT),
    ]


def sglang_env(env: list[dict]) -> list[dict]:
    """The connector environment for an SGLang pod: UCX and Mooncake variables apply, vLLM's NIXL side channel
    does not (SGLang's bootstrap server replaces it)."""
    return [e for e in env if not e["name"].startswith("VLLM_")]


def sglang_objects(
    pools: list[dict], claim_doc: dict, opts: ArtefactOptions, router_name: str | None, router_argv: list[str] | None
) -> list[dict]:
    """``k8s/sglang.yaml``: the model-cache claim, per pool a Deployment running ``sglang.launch_server`` and
    its Service (prefill pools also expose the bootstrap port), and for PD the router's Deployment and
    Service.  ``pools``: one mapping per pool with ``name``, ``role``, ``instances``, ``amd``, ``args``,
    ``gpus``, ``probes`` (startup/liveness/readiness on /health:30000), ``env``, ``rdma`` (resource, count or
    None)."""
    docs = [claim_doc]
    for p in pools:
        extra = (
            [{"name": "bootstrap", "containerPort": SGLANG_BOOTSTRAP_PORT, "protocol": "TCP"}]
            if p["role"] == "prefill"
            else []
        )
        image = opts.image(opts.sglang_rocm_image if p["amd"] else opts.sglang_image)
        docs += engine_deployment(
            p["name"],
            p["role"],
            p["instances"],
            image,
            ["python3", "-m", "sglang.launch_server"],
            p["args"],
            "amd.com/gpu" if p["amd"] else "nvidia.com/gpu",
            p["gpus"],
            p["probes"],
            sglang_env(p["env"]),
            p["rdma"],
            opts,
            extra,
            claim_doc["metadata"]["name"],
            engine="sglang",
            port=SGLANG_PORT,
        )
    if router_name is not None:
        assert router_argv is not None, "the PD router comes with its arguments"
        docs += router_objects(
            router_name,
            opts.image(opts.sglang_image),
            ["python3", "-m", ROUTER_MODULE],
            router_argv,
            [("http", VLLM_PORT)],
            opts,
        )
    return docs
