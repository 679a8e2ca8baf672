"""The README of a plan's artefact folder: what was planned, how to apply it, what to edit first."""
from __future__ import annotations

from simulator.plan.manifests import EPD_PROXY, MOONCAKE_BOOTSTRAP_PORT, MOONCAKE_PROXY, P2P_PROXY, TOY_PROXY, proxy_ref


def readme(result, cand, model, rec, opts, *, proxy_kind, tcp, rdma, amd, link, connector, encoder,
           layout=None) -> str:
    name = result.request.name
    lines = [f"# {name}: {cand.layout}", "",
             f"Planned by epdsim for {result.request.target_rate:g} req/s of {model.name}; cost "
             f"${cand.cost_usd_per_hour:,.2f}/h on {cand.gpus} GPUs."]
    if rec:
        lines.append(f"Simulated goodput {rec['goodput_rps']:.3g} req/s (headroom {rec['headroom_rate']:+.0%} "
                     "over the target).")
    lines += ["", "## Apply", "", "```bash", "kubectl create namespace epdsim   # or use your own",
              "kubectl -n epdsim create secret generic hf-token --from-literal=HF_TOKEN=...   # gated models only",
              "kubectl -n epdsim apply -f k8s/deployment.yaml   # vLLM; or k8s/sglang.yaml for SGLang (not both)",
              "kubectl -n epdsim rollout status deploy --timeout=60m", "```", "",
              "Requests go to " + ("the proxy Service (see `router.yaml`, `proxy.service`)." if proxy_kind
                                   else "the pool's Service (`router.yaml`)."),
              "", "## Edit before applying", "",
              f"- **Images**: vLLM `{opts.vllm_image}`" + (f", ROCm pools `{opts.vllm_rocm_image}` (pin the tag that "
                                                           "matches the vLLM version)" if amd else "")
              + "; with a private registry set `ArtefactOptions(registry=...)` or rewrite `image:`.",
              "- **Storage**: the `*-model-cache` PersistentVolumeClaim (ReadWriteMany, "
              f"{opts.model_cache_size}) holds the Hugging Face cache for every pod; set `storageClassName` "
              "to an RWX class of your cluster (NFS, CephFS, Filestore, EFS...), or replace it with a hostPath.",
              "- **Node selectors / tolerations**: none are set; add `nodeSelector` (e.g. the GPU product label "
              "`nvidia.com/gpu.product`) so that each pool lands on the GPU it was planned for.",
              "- **Probes** are sized by the cold-start model with a 50% margin (`epdsim probes`); the modelled "
              "start is in the `epdsim/modelled-start-s` annotation. A slower registry or storage needs more."]
    if layout is not None:
        lines.append(f"- **Network**: planned on {layout.provider} {layout.instance} ({layout.nics_per_node} NICs for "
                     f"{layout.gpus_per_node} GPUs, {layout.gpus_per_nic} GPU(s) per NIC); add a node selector for "
                     "that instance type so that the pods land on it.")
    if rdma and link.kind == "efa":
        lines += ["- **EFA**: PD pods request `vpc.amazonaws.com/efa` (the AWS EFA device plugin) and `IPC_LOCK`. "
                  "NIXL reaches EFA through its Libfabric backend, not UCX: select it as vLLM's NixlConnector guide "
                  "says (\"Selecting a NIXL transport backend\"); SGLang's Mooncake backend needs its EFA build."]
    elif rdma:
        lines += [f"- **RDMA**: PD pods request `{opts.rdma_resource}: {opts.rdma_per_pod}` (the device-plugin "
                  "resource of your RDMA NICs; change `ArtefactOptions(rdma_resource=...)`) and `IPC_LOCK`. "
                  + ("They run with `hostNetwork: true`." if opts.host_network else
                     "Without SR-IOV/Multus secondary networks set `ArtefactOptions(host_network=True)` so that "
                     "pods see the node's RDMA NICs."),
                  f"- **NICs**: `UCX_NET_DEVICES={opts.ucx_net_devices}` (NIXL) / `--disaggregation-ib-device mlx5_0` "
                  "(SGLang Mooncake): name the HCAs of your nodes (`ibv_devices`)."]
    if tcp:
        lines += [f"- **TCP fabric** ({link.name}): no RDMA resources are requested; the connector runs in its TCP "
                  "mode: " + {"nixl": "NIXL over UCX `UCX_TLS=tcp,cuda_copy`",
                              "tcp": "NixlConnector over UCX `UCX_TLS=tcp,cuda_copy` (host-staged)",
                              "p2pnccl": "NCCL's socket transport (`NCCL_IB_DISABLE=1`, `NCCL_SOCKET_IFNAME`)",
                              "mooncake": "Mooncake's TCP transport (`\"mooncake_protocol\":\"tcp\"` in "
                                          "`kv_connector_extra_config`, `MC_FORCE_TCP=1`)"}.get(connector, connector)
                  + f"; set the interface (`{opts.socket_ifname}`). Expect the KV transfer time the plan shows."]
    if proxy_kind:
        script = {"p2pnccl": P2P_PROXY, "epd": EPD_PROXY, "mooncake": MOONCAKE_PROXY}.get(proxy_kind, TOY_PROXY)
        lines += [f"- **Proxy**: runs vLLM's `{script}` downloaded at {proxy_ref(proxy_kind, opts)} when the pod "
                  "starts (TCP startup, readiness and liveness probes); for an air-gapped cluster bake it into an "
                  "image. It is vLLM's example proxy (no retries or auth): put your own gateway in front for "
                  "production."]
        if proxy_kind == "p2pnccl":
            lines.append("- **P2pNcclConnector**: instances register with the proxy (`proxy_ip`/`proxy_port` 30001 "
                         "in `--kv-transfer-config`); `http_port` must equal `--port`; `kv_buffer_size` on decode is "
                         "the buffer the plan modelled: overflow goes to host memory and slows the transfer. "
                         f"vLLM 0.32 no longer ships P2pNcclConnector: the pods run `{opts.p2pnccl_vllm_image}` "
                         "(a release of its P2P NCCL guide); or plan with connector nixl.")
        if proxy_kind == "mooncake":
            lines.append(
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
                "image if `python3 -c 'import mooncake.engine'` fails in it.")
        if proxy_kind == "epd" and connector == "mooncake":
            lines.append("- **E+P+D with MooncakeConnector**: vLLM's EPD proxy hands the prefill's "
                         "`kv_transfer_params` to decode as for NIXL and sends no `transfer_id`, which "
                         "MooncakeConnector needs: plan E+P+D with connector nixl, or front it with a proxy "
                         "that sends them.")
    lines += ["", "## Files", "",
              "- `vllm/<pool>.sh`: environment and the `vllm serve` line of one instance (the Deployments run the "
              "same line).",
              "- `sglang/<pool>.sh`" + (", `sglang/router.sh`" if proxy_kind in ("toy", "p2pnccl", "mooncake") else "")
              + ": SGLang equivalents (port 30000; PD prefill bootstrap port 8998"
              + ("; the encoder pool `--encoder-only`, the language model `--language-only --encoder-urls`"
                 if encoder else "") + "). The host names are the Services of `k8s/sglang.yaml`.",
              f"- `k8s/sglang.yaml`: the same pools on SGLang (`{opts.sglang_image}`"
              + (f", ROCm `{opts.sglang_rocm_image}`" if amd else "") + "), probes on `/health:30000`"
              + (", SGLang's PD router as the proxy Service" if proxy_kind in ("toy", "p2pnccl", "mooncake") else "")
              + ". Same Service names as the vLLM file: apply one of the two.",
              "- `k8s/deployment.yaml`: model-cache claim, per pool a Deployment and Service"
              + (" (the Mooncake prefill pool: a StatefulSet and headless Service)" if proxy_kind == "mooncake" else "")
              + (", the proxy Deployment and Service" if proxy_kind else "") + ".",
              "- `router.yaml`: epdsim's description of the pools behind the router (not a router's own config)."]
    return "\n".join(lines) + "\n"
