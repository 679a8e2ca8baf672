"""The README of a plan's artefact folder: what was planned, how to apply it, what to edit first."""

from __future__ import annotations


def readme(result, cand, model, rec, opts, *, proxy, tcp, rdma, amd, link, connector, encoder, layout=None) -> str:
    """The README text.  ``proxy``: the :class:`simulator.pd.connector_base.Proxy` in front of the pools (None:
    requests go to the one pool); ``connector``: the PD plan's :class:`simulator.pd.connector_base.KVConnector`
    (None without PD); ``tcp``: the KV fabric has no GPU-direct path; ``rdma``: PD pods request RDMA NICs."""
    # The connector's own proxy (PD without an encoder pool in front), not vLLM's EPD proxy.
    pd_proxy = proxy is not None and connector is not None and not encoder
    name = result.request.name
    lines = [
        f"# {name}: {cand.layout}",
        "",
        f"Planned by epdsim for {result.request.target_rate:g} req/s of {model.name}; cost "
        f"${cand.cost_usd_per_hour:,.2f}/h on {cand.gpus} GPUs.",
    ]
    if rec:
        lines.append(
            f"Simulated goodput {rec['goodput_rps']:.3g} req/s (headroom {rec['headroom_rate']:+.0%} over the target)."
        )
    lines += [
        "",
        "## Apply",
        "",
        "```bash",
        "kubectl create namespace epdsim   # or use your own",
        "kubectl -n epdsim create secret generic hf-token --from-literal=HF_TOKEN=...   # gated models only",
        "kubectl -n epdsim apply -f k8s/deployment.yaml   # vLLM; or k8s/sglang.yaml for SGLang (not both)",
        "kubectl -n epdsim rollout status deploy --timeout=60m",
        "```",
        "",
        "Requests go to "
        + (
            "the proxy Service (see `router.yaml`, `proxy.service`)."
            if proxy
            else "the pool's Service (`router.yaml`)."
        ),
        "",
        "## Edit before applying",
        "",
        f"- **Images**: vLLM `{opts.vllm_image}`"
        + (f", ROCm pools `{opts.vllm_rocm_image}` (pin the tag that matches the vLLM version)" if amd else "")
        + "; with a private registry set `ArtefactOptions(registry=...)` or rewrite `image:`.",
        "- **Storage**: the `*-model-cache` PersistentVolumeClaim (ReadWriteMany, "
        f"{opts.model_cache_size}) holds the Hugging Face cache for every pod; set `storageClassName` "
        "to an RWX class of your cluster (NFS, CephFS, Filestore, EFS...), or replace it with a hostPath.",
        "- **Node selectors / tolerations**: none are set; add `nodeSelector` (e.g. the GPU product label "
        "`nvidia.com/gpu.product`) so that each pool lands on the GPU it was planned for.",
        "- **Probes** are sized by the cold-start model with a 50% margin (`epdsim probes`); the modelled "
        "start is in the `epdsim/modelled-start-s` annotation. A slower registry or storage needs more.",
    ]
    if layout is not None:
        lines.append(
            f"- **Network**: planned on {layout.provider} {layout.instance} ({layout.nics_per_node} NICs for "
            f"{layout.gpus_per_node} GPUs, {layout.gpus_per_nic} GPU(s) per NIC); add a node selector for "
            "that instance type so that the pods land on it."
        )
    if rdma and link.kind == "efa":
        lines += [
            "- **EFA**: PD pods request `vpc.amazonaws.com/efa` (the AWS EFA device plugin) and `IPC_LOCK`. "
            "NIXL reaches EFA through its Libfabric backend, not UCX: select it as vLLM's NixlConnector guide "
            'says ("Selecting a NIXL transport backend"); SGLang\'s Mooncake backend needs its EFA build.'
        ]
    elif rdma:
        lines += [
            f"- **RDMA**: PD pods request `{opts.rdma_resource}: {opts.rdma_per_pod}` (the device-plugin "
            "resource of your RDMA NICs; change `ArtefactOptions(rdma_resource=...)`) and `IPC_LOCK`. "
            + (
                "They run with `hostNetwork: true`."
                if opts.host_network
                else "Without SR-IOV/Multus secondary networks set `ArtefactOptions(host_network=True)` so that "
                "pods see the node's RDMA NICs."
            ),
            f"- **NICs**: `UCX_NET_DEVICES={opts.ucx_net_devices}` (NIXL) / `--disaggregation-ib-device mlx5_0` "
            "(SGLang Mooncake): name the HCAs of your nodes (`ibv_devices`).",
        ]
    if tcp:
        lines += [
            f"- **TCP fabric** ({link.name}): no RDMA resources are requested; the connector runs in its TCP "
            "mode: " + connector.tcp_mode() + f"; set the interface (`{opts.socket_ifname}`). Expect the KV "
            "transfer time the plan shows."
        ]
    if proxy:
        lines += [
            f"- **Proxy**: runs vLLM's `{proxy.script}` downloaded at {proxy.ref} when the pod "
            "starts (TCP startup, readiness and liveness probes); for an air-gapped cluster bake it into an "
            "image. It is vLLM's example proxy (no retries or auth): put your own gateway in front for "
            "production."
        ]
        if connector is not None:
            lines += connector.epd_notes(opts) if encoder else connector.readme_notes(opts)
    lines += [
        "",
        "## Files",
        "",
        "- `vllm/<pool>.sh`: environment and the `vllm serve` line of one instance (the Deployments run the "
        "same line).",
        "- `sglang/<pool>.sh`"
        + (", `sglang/router.sh`" if pd_proxy else "")
        + ": SGLang equivalents (port 30000; PD prefill bootstrap port 8998"
        + (
            "; the encoder pool `--encoder-only`, the language model `--language-only --encoder-urls`"
            if encoder
            else ""
        )
        + "). The host names are the Services of `k8s/sglang.yaml`.",
        f"- `k8s/sglang.yaml`: the same pools on SGLang (`{opts.sglang_image}`"
        + (f", ROCm `{opts.sglang_rocm_image}`" if amd else "")
        + "), probes on `/health:30000`"
        + (", SGLang's PD router as the proxy Service" if pd_proxy else "")
        + ". Same Service names as the vLLM file: apply one of the two.",
        "- `k8s/deployment.yaml`: model-cache claim, per pool a Deployment and Service"
        + (connector.files_note() if pd_proxy else "")
        + (", the proxy Deployment and Service" if proxy else "")
        + ".",
        "- `router.yaml`: epdsim's description of the pools behind the router (not a router's own config).",
    ]
    return "\n".join(lines) + "\n"
