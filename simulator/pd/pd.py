"""Prefill-decode disaggregation: the KV-transfer model and the PD proxy flow (the proxy itself:
:mod:`simulator.pd.pd_proxy`).

Flow (vLLM's disaggregated serving proxy): the router sends the prompt to a
prefill instance with ``max_tokens=1``; when its prefill completes the proxy
picks a decode instance, which allocates blocks for the whole prompt (or
waits: backpressure), pulls the KV over the fabric, then decodes.  The
prefill instance holds the prompt's blocks until the pull has finished.
SGLang's variant picks the decode instance on arrival; it reserves the blocks
while the prompt is prefilled, and the KV moves as soon as both are ready.

Transfer model: bytes = prompt tokens x the model's KV bytes per token (all
layers, K and V, whole model; each TP rank moves its shard in parallel).  The
path is the prefill instance's egress and the decode instance's ingress: one
:class:`~simulator.pd.fabric.LinkState` each, whose capacity is the per-GPU link
bandwidth x the instance's GPU count (one RDMA NIC or NVLink port per GPU;
a TCP or cloud-VPC NIC is one per node, shared) x link efficiency x connector
efficiency.  With unequal TP the narrower side is
the bottleneck, which is how a TP mismatch shows.  Topology as data
(``kv_transfer.gpus_per_nic``, ``nodes_per_rack``, ``oversubscription``): instances are packed onto
nodes in order; ``kv_transfer.fabric`` may name a node type's network layout (hwdb ``networks/``, e.g.
``gcp-a3-high``: 8 H100 behind 4 NICs), which supplies the link, GPUs per NIC and the NIC rate; several
small instances behind one NIC share one LinkState; switch tiers: with an oversubscribed leaf switch a
transfer between racks also crosses each side's rack uplink, and between pods (racks under one spine)
each side's pod uplink too (``placement``: cross_rack by default, same_rack, cross_pod).  Concurrent
transfers share every element of the path max-min fairly (:mod:`simulator.pd.fabric`).  P2pNccl's
``kv_buffer_size``: bytes that do not fit in the decode instance's free GPU buffer go to its host tensor
pool (vLLM ``docs/design/p2p_nccl_connector.md``) and pay a device->host and a host->device copy over PCIe
before decode can use them.  A host-staged connector (TCP) also pays a GPU->host and a host->GPU copy
over PCIe and the link's per-byte CPU cost on both ends, in series before the bytes flow.  A layer-wise connector
sends each layer's KV as it is computed: only what the link could not carry
during the prefill remains (at least one layer's worth).
"""

from __future__ import annotations

from dataclasses import dataclass

import hwdb
from hwdb.schema import DTYPE_BYTES
from simulator.pd.connectors import HOST_STAGED_CONNECTOR, RDMA_CONNECTOR, connector_strategy
from simulator.pd.pd_config import KVTransferConfig
from simulator.perf import Deployment
from simulator.summary_types import Crossover


@dataclass(frozen=True)
class TransferPlan:
    """How KV moves between a prefill and a decode pool (SI units)."""

    connector: str
    link_name: str
    kv_bytes_per_token: float  # whole model, all layers
    prefill_side_Bps: float  # egress capacity of one prefill instance
    decode_side_Bps: float  # ingress capacity of one decode instance
    latency_s: float  # per side
    setup_s: float  # connector setup, once per transfer
    staged_s_per_byte: float  # host staging: PCIe copies + CPU cost, per byte, serial
    layerwise: bool
    num_layers: int
    flow: str = "vllm"  # "vllm": decode chosen after prefill; "sglang": at arrival
    buffer_bytes: float = 0.0  # receive staging buffer per decode instance (0 = none)
    bandwidth_factor: float = 1.0  # degradation of both sides (1 = healthy)
    jitter_mean_s: float = 0.0  # mean of the exponential extra latency per transfer
    prefill_share: int = 1  # prefill instances behind one NIC group (shared node NICs)
    decode_share: int = 1
    gpus_per_node: int = 8
    prefill_gpus: int = 1
    decode_gpus: int = 1
    nodes_per_rack: int | None = None
    oversubscription: float = 1.0
    racks_per_pod: int | None = None
    pod_oversubscription: float = 1.0
    placement: str = "cross_rack"  # same_rack: no uplink crossed; cross_pod: the rack's and the pod's
    nic_Bps: float = 0.0  # one NIC's usable rate (bytes/s, efficiencies applied)
    pool_copy_s_per_byte: float = 0.0  # buffer overflow to host memory: D2H + H2D over PCIe, per byte

    def uplinks(self, role: str) -> list[tuple[str, float, int]]:
        """The switch uplinks a transfer of ``role``'s pool crosses, as (tier, usable bytes/s of one, nodes
        under one): the rack's leaf uplink unless the pools share racks, and the pod's spine uplink when
        they sit in different pods.  An uplink that is not oversubscribed never binds and is left out."""
        if self.nodes_per_rack is None or self.placement == "same_rack":
            return []
        gpus = self.prefill_gpus if role == "prefill" else self.decode_gpus
        side = self.prefill_side_Bps if role == "prefill" else self.decode_side_Bps
        share = self.prefill_share if role == "prefill" else self.decode_share
        rack = self.nodes_per_rack * self.gpus_per_node / gpus * side / share / self.oversubscription
        out = [("rack", rack, self.nodes_per_rack)] if self.oversubscription > 1 else []
        if self.placement == "cross_pod" and self.pod_oversubscription > 1:
            assert self.racks_per_pod is not None, "cross_pod placement needs racks_per_pod (KVTransferConfig)"
            out.append(
                ("pod", self.racks_per_pod * rack / self.pod_oversubscription, self.racks_per_pod * self.nodes_per_rack)
            )
        return out

    def per_instance_Bps(self, role: str) -> float:
        """An instance's fair share of its path when every instance of the pool transfers at once."""
        side = self.prefill_side_Bps if role == "prefill" else self.decode_side_Bps
        share = self.prefill_share if role == "prefill" else self.decode_share
        gpus = self.prefill_gpus if role == "prefill" else self.decode_gpus
        return min([side / share] + [cap / (nodes * self.gpus_per_node / gpus) for _, cap, nodes in self.uplinks(role)])

    def bytes_for(self, prompt_tokens: int) -> float:
        return prompt_tokens * self.kv_bytes_per_token

    def idle_time(self, prompt_tokens: int) -> float:
        """Transfer time of one prompt on an idle path (no layer-wise overlap)."""
        nbytes = self.bytes_for(prompt_tokens)
        bw = min(self.prefill_side_Bps, self.decode_side_Bps)
        return 2 * self.latency_s + self.setup_s + nbytes * self.staged_s_per_byte + nbytes / bw


class TransferConfigError(ValueError):
    """The KV-transfer settings cannot connect the prefill and decode pools."""


def build_transfer_plan(cfg, db: hwdb.HardwareDB, p: Deployment, d: Deployment) -> TransferPlan:
    """Resolve a scenario's ``kv_transfer`` block for two deployments (raises TransferConfigError)."""
    try:
        conn = db.connector(cfg.connector)
        strategy = connector_strategy(conn)
    except (hwdb.HwdbError, ValueError) as exc:  # ValueError: its strategy is not registered
        raise TransferConfigError(f"kv_transfer.connector: {exc}") from None
    if p.gpu.vendor != d.gpu.vendor:
        raise TransferConfigError(
            f"prefill on {p.gpu.vendor.upper()} {p.gpu.name} and decode on {d.gpu.vendor.upper()} {d.gpu.name}: no "
            "modelled connector moves KV between vendors (NIXL/RIXL, Mooncake and NCCL/RCCL builds are per vendor, "
            "and the attention backends' KV layouts differ); use one vendor for both pools"
        )
    if p.kv_dtype != d.kv_dtype:
        raise TransferConfigError(
            f"prefill KV cache is {p.kv_dtype} but decode KV cache is {d.kv_dtype}; "
            "KV moves as it is stored: give both pools the same kv_cache_dtype"
        )
    tp_error = strategy.tp_mapping_error(p.engine.engine, p.tp, d.tp)
    if tp_error:
        raise TransferConfigError(tp_error)
    if max(p.tp, d.tp) % min(p.tp, d.tp):
        raise TransferConfigError(
            f"prefill TP={p.tp} and decode TP={d.tp} cannot map KV shards: one TP degree must divide the other "
            "(e.g. 2 and 4); change one of them"
        )
    if p.pp != 1 or d.pp != 1:
        raise TransferConfigError("KV transfer is modelled for pp=1 on both pools; set pp: 1")
    if cfg.same_node:
        if p.gpu.name != d.gpu.name:
            raise TransferConfigError(
                f"kv_transfer.same_node: prefill ({p.gpu.name}) and decode ({d.gpu.name}) GPUs cannot share a node; "
                "set same_node: false and name a fabric"
            )
        if p.gpus + d.gpus > p.gpu.gpus_per_node:
            raise TransferConfigError(
                f"kv_transfer.same_node: one prefill ({p.gpus} GPUs) and one decode instance ({d.gpus} GPUs) "
                f"do not fit in a {p.gpu.gpus_per_node}-GPU {p.gpu.name} node; set same_node: false"
            )
        link, lay = p.intra_link, None
        per_gpu = link.effective_Bps
    else:
        name = cfg.fabric or p.gpu.scale_out_link
        if name is None:
            raise TransferConfigError(
                f"kv_transfer.fabric: {p.gpu.name} has no default scale-out link; name one "
                f"(e.g. roce-200, ib-ndr, tcp-25gbe)"
            )
        try:
            link, lay = db.fabric(name)
        except hwdb.HwdbError as exc:
            raise TransferConfigError(f"kv_transfer.fabric: {exc}") from None
        if lay is not None:
            _check_layout_gpus(lay, db, p, d)
        if link.kind in ("nvlink", "xgmi", "pcie"):
            raise TransferConfigError(
                f"kv_transfer.fabric={link.name} is an intra-node link and cannot connect instances on different "
                "nodes; use an InfiniBand/RoCE/TCP fabric, or same_node: true"
            )
        per_gpu = link.effective_Bps
    # RDMA NICs come one per GPU (DGX-style rails) unless the topology says otherwise; a TCP/VPC NIC is
    # one per node, shared by the instances on it.
    # A network layout (hwdb networks/) gives both from its cloud's documentation; explicit fields win.
    shared_nic = link.kind in ("tcp", "vpc")
    g = cfg.gpus_per_nic or (lay.gpus_per_nic if lay else p.gpu.gpus_per_node if shared_nic else 1)
    if cfg.same_node:
        g = 1
    nic_line = cfg.nic_Bps if cfg.nic_Bps is not None else lay.per_nic_Bps if lay else None
    nic = nic_line * link.efficiency.value if nic_line is not None else per_gpu

    def side(dep):
        nics = max(1, dep.gpus // g)  # NICs an instance spans
        share = max(1, g // dep.gpus)  # instances behind one NIC
        return nic * nics, share

    (side_p, share_p), (side_d, share_d) = side(p), side(d)
    if cfg.bandwidth_Bps is not None:
        side_p = side_d = cfg.bandwidth_Bps
        share_p = share_d = 1
    host_staged = conn.host_staged
    eff = conn.efficiency.value
    if conn.gpu_direct_required and not link.gpu_direct:
        if conn.tcp_mode_efficiency is None:
            raise TransferConfigError(
                f"kv_transfer: connector {conn.name} needs GPU-direct RDMA but {link.name} has none; use connector "
                "tcp (host-staged), one with a TCP mode (p2pnccl, mooncake, nixl) or an RDMA fabric (ib-*, roce-*)"
            )
        host_staged, eff = True, conn.tcp_mode_efficiency.value  # its TCP mode: staged through host memory
    pcie = db.link("pcie-gen5-x16")
    staged = 0.0
    if host_staged:
        ranks = min(p.tp, d.tp)
        # Each rank copies its shard GPU->host, serialises, and the receiver does the reverse.
        staged = (2.0 / pcie.effective_Bps + 2.0 * link.cpu_cost_s_per_byte.value) / ranks
    a = p.arch
    layerwise = conn.layerwise if cfg.layerwise is None else cfg.layerwise
    return TransferPlan(
        connector=conn.name,
        link_name=lay.name if lay else link.name,
        kv_bytes_per_token=a.kv_elems_per_token * DTYPE_BYTES[p.kv_dtype],
        prefill_side_Bps=side_p * eff,
        decode_side_Bps=side_d * eff,
        latency_s=link.latency_s.value,
        setup_s=conn.setup_s.value,
        staged_s_per_byte=staged,
        layerwise=layerwise,
        num_layers=a.num_layers,
        bandwidth_factor=cfg.bandwidth_factor,
        jitter_mean_s=cfg.jitter_mean_s,
        flow=cfg.flow,
        prefill_share=share_p,
        decode_share=share_d,
        gpus_per_node=p.gpu.gpus_per_node,
        prefill_gpus=p.gpus,
        decode_gpus=d.gpus,
        nodes_per_rack=cfg.nodes_per_rack,
        oversubscription=cfg.oversubscription,
        racks_per_pod=cfg.racks_per_pod,
        pod_oversubscription=cfg.pod_oversubscription,
        placement=cfg.placement,
        nic_Bps=nic * eff,
        pool_copy_s_per_byte=2.0 / pcie.effective_Bps / d.tp,
        buffer_bytes=(
            cfg.kv_buffer_size
            if cfg.kv_buffer_size is not None
            else conn.default_buffer_bytes.value
            if conn.default_buffer_bytes
            else 0.0
        ),
    )


def _check_layout_gpus(lay, db: hwdb.HardwareDB, p: Deployment, d: Deployment) -> None:
    """A node type's network layout describes the nodes of its own GPUs only."""
    for dep, role in ((p, "prefill"), (d, "decode")):
        if dep.gpu.name not in lay.gpus:
            same = sorted(n for n, x in db.networks.items() if dep.gpu.name in x.gpus)
            raise TransferConfigError(
                f"kv_transfer.fabric={lay.name} is the network of {lay.provider} {lay.instance} "
                f"({lay.gpus_per_node}x {'/'.join(lay.gpus)}) but the {role} pool runs on {dep.gpu.name}; use "
                + (f"a layout of that GPU ({', '.join(same)})" if same else "a link (ib-ndr, roce-400, tcp-25gbe, ...)")
                + " or the same GPU for both pools"
            )


def crossover_bandwidth(step_model, kv_bytes_per_token: float, prompt_tokens: int, chunk: int) -> Crossover:
    """The bandwidth below which moving a prompt's KV takes longer than computing it.

    ``prefill_s`` is the prompt's prefill time alone on the prefill instance
    (chunked by ``chunk`` tokens); the crossover is ``bytes / prefill_s`` in
    bytes/s for the whole instance.  Below it, PD's transfer alone exceeds the
    prefill it saves the decode side, and TTFT at least doubles.
    """
    prefill_s = step_model.prefill_time(prompt_tokens, chunk)
    nbytes = prompt_tokens * kv_bytes_per_token
    return {
        "prompt_tokens": prompt_tokens,
        "kv_bytes": nbytes,
        "prefill_s": prefill_s,
        "crossover_Bps": nbytes / prefill_s,
    }


def fabric_verdicts(db, dep: Deployment, crossover: Crossover, connector: str = RDMA_CONNECTOR) -> list[dict]:
    """Per scale-out fabric in hwdb: transfer time of the prompt between two such instances vs its prefill.

    GPU-direct fabrics use ``connector``; the others the host-staged TCP connector.
    """
    rows = []
    for link in db.links.values():
        if link.kind in ("nvlink", "xgmi", "pcie"):
            continue
        cfg = KVTransferConfig(connector=connector if link.gpu_direct else HOST_STAGED_CONNECTOR, fabric=link.name)
        plan = build_transfer_plan(cfg, db, dep, dep)
        t = plan.idle_time(crossover["prompt_tokens"])
        rows.append(
            {
                "fabric": link.name,
                "connector": plan.connector,
                "instance_Bps": plan.prefill_side_Bps,
                "transfer_s": t,
                "prefill_s": crossover["prefill_s"],
                "verdict": "PD worse: transfer > prefill" if t > crossover["prefill_s"] else "ok",
            }
        )
    return sorted(rows, key=lambda r: r["transfer_s"], reverse=True)
