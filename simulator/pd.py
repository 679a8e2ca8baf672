"""Prefill-decode disaggregation: the KV-transfer model and the PD proxy flow.

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
:class:`~simulator.fabric.LinkState` each, whose capacity is the per-GPU link
bandwidth x the instance's GPU count (one RDMA NIC or NVLink port per GPU;
a TCP or cloud-VPC NIC is one per node, shared) x link efficiency x connector
efficiency.  With unequal TP the narrower side is
the bottleneck, which is how a TP mismatch shows.  Concurrent transfers share
each side fairly (:mod:`simulator.fabric`).  A host-staged connector (TCP) also
pays a GPU->host and a host->GPU copy over PCIe and the link's per-byte CPU
cost on both ends, in series before the bytes flow.  A layer-wise connector
sends each layer's KV as it is computed: only what the link could not carry
during the prefill remains (at least one layer's worth).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import hwdb
from hwdb.schema import DTYPE_BYTES
from simulator.fabric import Fabric, LinkState
from simulator.perf import Deployment


@dataclass(frozen=True)
class TransferPlan:
    """How KV moves between a prefill and a decode pool (SI units)."""

    connector: str
    link_name: str
    kv_bytes_per_token: float      # whole model, all layers
    prefill_side_Bps: float        # egress capacity of one prefill instance
    decode_side_Bps: float         # ingress capacity of one decode instance
    latency_s: float               # per side
    setup_s: float                 # connector setup, once per transfer
    staged_s_per_byte: float       # host staging: PCIe copies + CPU cost, per byte, serial
    layerwise: bool
    num_layers: int
    flow: str = "vllm"             # "vllm": decode chosen after prefill; "sglang": at arrival
    buffer_bytes: float = 0.0      # receive staging buffer per decode instance (0 = none)
    bandwidth_factor: float = 1.0  # degradation of both sides (1 = healthy)
    jitter_mean_s: float = 0.0     # mean of the exponential extra latency per transfer

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
    except hwdb.HwdbError as exc:
        raise TransferConfigError(f"kv_transfer.connector: {exc}") from None
    if p.kv_dtype != d.kv_dtype:
        raise TransferConfigError(f"prefill KV cache is {p.kv_dtype} but decode KV cache is {d.kv_dtype}; "
                                  "KV moves as it is stored: give both pools the same kv_cache_dtype")
    if conn.name == "nixl" and d.tp % p.tp:
        raise TransferConfigError(
            f"prefill TP={p.tp} and decode TP={d.tp} cannot map KV shards with NixlConnector, which needs the "
            "decode TP to be a multiple of the prefill TP; use prefill tp <= decode tp")
    if max(p.tp, d.tp) % min(p.tp, d.tp):
        raise TransferConfigError(
            f"prefill TP={p.tp} and decode TP={d.tp} cannot map KV shards: one TP degree must divide the other "
            "(e.g. 2 and 4); change one of them")
    if p.pp != 1 or d.pp != 1:
        raise TransferConfigError("KV transfer is modelled for pp=1 on both pools; set pp: 1")
    if cfg.same_node:
        if p.gpu.name != d.gpu.name:
            raise TransferConfigError(
                f"kv_transfer.same_node: prefill ({p.gpu.name}) and decode ({d.gpu.name}) GPUs cannot share a node; "
                "set same_node: false and name a fabric")
        if p.gpus + d.gpus > p.gpu.gpus_per_node:
            raise TransferConfigError(
                f"kv_transfer.same_node: one prefill ({p.gpus} GPUs) and one decode instance ({d.gpus} GPUs) do not fit "
                f"in a {p.gpu.gpus_per_node}-GPU {p.gpu.name} node; set same_node: false")
        link = p.intra_link
        per_gpu_p = per_gpu_d = link.effective_Bps
    else:
        name = cfg.fabric or p.gpu.scale_out_link
        if name is None:
            raise TransferConfigError(f"kv_transfer.fabric: {p.gpu.name} has no default scale-out link; name one "
                                      f"(e.g. roce-200, ib-ndr, tcp-25gbe)")
        try:
            link = db.link(name)
        except hwdb.HwdbError as exc:
            raise TransferConfigError(f"kv_transfer.fabric: {exc}") from None
        if link.kind in ("nvlink", "xgmi", "pcie"):
            raise TransferConfigError(
                f"kv_transfer.fabric={link.name} is an intra-node link and cannot connect instances on different "
                "nodes; use an InfiniBand/RoCE/TCP fabric, or same_node: true")
        per_gpu_p = per_gpu_d = link.effective_Bps
    # RDMA NICs come one per GPU (DGX-style rails); a TCP/VPC NIC is one per node, shared.
    shared_nic = link.kind in ("tcp", "vpc")
    side_p = per_gpu_p * (1 if shared_nic else p.gpus)
    side_d = per_gpu_d * (1 if shared_nic else d.gpus)
    if cfg.bandwidth_Bps is not None:
        side_p = side_d = cfg.bandwidth_Bps
    if conn.gpu_direct_required and not link.gpu_direct:
        raise TransferConfigError(
            f"kv_transfer: connector {conn.name} needs GPU-direct RDMA but {link.name} has none; use connector "
            "tcp (host-staged) or an RDMA fabric (ib-*, roce-*)")
    staged = 0.0
    if conn.host_staged:
        pcie = db.link("pcie-gen5-x16")
        ranks = min(p.tp, d.tp)
        # Each rank copies its shard GPU->host, serialises, and the receiver does the reverse.
        staged = (2.0 / pcie.effective_Bps + 2.0 * link.cpu_cost_s_per_byte.value) / ranks
    a = p.arch
    layerwise = conn.layerwise if cfg.layerwise is None else cfg.layerwise
    eff = conn.efficiency.value
    return TransferPlan(
        connector=conn.name, link_name=link.name,
        kv_bytes_per_token=a.kv_elems_per_token * DTYPE_BYTES[p.kv_dtype],
        prefill_side_Bps=side_p * eff, decode_side_Bps=side_d * eff,
        latency_s=link.latency_s.value, setup_s=conn.setup_s.value, staged_s_per_byte=staged,
        layerwise=layerwise, num_layers=a.num_layers,
        bandwidth_factor=cfg.bandwidth_factor, jitter_mean_s=cfg.jitter_mean_s, flow=cfg.flow,
        buffer_bytes=(cfg.kv_buffer_size if cfg.kv_buffer_size is not None
                      else conn.default_buffer_bytes.value if conn.default_buffer_bytes else 0.0))


class PDCoordinator:
    """The PD proxy: hands prompts from prefill to decode instances and moves their KV."""

    def __init__(self, env, plan: TransferPlan, prefill: list, decode: list, decode_router, rec,
                 rng=None) -> None:
        self.env = env
        self.plan = plan
        self.fabric = Fabric(env, rng)
        jitter = None
        if plan.jitter_mean_s > 0:
            mean = plan.jitter_mean_s / 2   # drawn on each of the two sides of the path
            jitter = lambda g, mean=mean: float(g.exponential(mean))  # noqa: E731
        self.decode_router = decode_router
        self.rec = rec
        self.src: dict[int, object] = {}
        f = plan.bandwidth_factor
        self.egress = [LinkState(f"{plan.link_name}:prefill{i}:out", plan.prefill_side_Bps, plan.latency_s, f, jitter)
                       for i in range(len(prefill))]
        self.ingress = [LinkState(f"{plan.link_name}:decode{i}:in", plan.decode_side_Bps, plan.latency_s, f, jitter)
                        for i in range(len(decode))]
        self.decode = decode
        self.flow = plan.flow
        self.reserved: dict[int, object] = {}
        self.bytes_moved = 0.0
        # Staging buffer of each decode instance (P2pNcclConnector's kv_buffer_size): bytes in
        # flight into it, and transfers waiting for room, FCFS.
        self.in_buffer = [0.0] * len(decode)
        self.buffer_wait: list[deque] = [deque() for _ in decode]
        for inst in prefill:
            inst.hand_off = self.hand_off
        for inst in decode:
            inst.start_transfer = self.start_transfer

    def on_arrival(self, rid: int) -> None:
        """SGLang flow: the decode instance is chosen when the request arrives and reserves
        blocks for the prompt while the prefill runs (its bootstrap handshake)."""
        d = self.decode_router.choose(rid)
        self.rec.instance[rid] = d
        self.decode[d].submit_remote(rid)

    def hand_off(self, p_inst, rid: int, now: float) -> None:
        """Prefill done.  vLLM flow: pick a decode instance, which allocates blocks when it can.
        SGLang flow: push the KV as soon as the decode side has its blocks."""
        self.src[rid] = p_inst
        if self.flow == "sglang":
            d_inst = self.reserved.pop(rid, None)
            if d_inst is not None:
                self._transfer(d_inst, rid, now)
            return
        d = self.decode_router.choose(rid)
        self.rec.instance[rid] = d
        self.decode[d].submit_remote(rid)

    def start_transfer(self, d_inst, rid: int, now: float) -> None:
        """The decode instance has blocks for the prompt: move the KV (once the prefill is done)."""
        if rid not in self.src:        # SGLang flow, prefill still running: wait for hand_off
            self.reserved[rid] = d_inst
            return
        self._transfer(d_inst, rid, now)

    def _transfer(self, d_inst, rid: int, now: float) -> None:
        plan, rec = self.plan, self.rec
        p_inst = self.src.pop(rid)
        nbytes = plan.bytes_for(rec.input_tokens[rid])
        if plan.layerwise:
            overlap = (rec.t_prefilled[rid] - rec.t_sched[rid]) * min(plan.prefill_side_Bps, plan.decode_side_Bps)
            nbytes = max(nbytes / plan.num_layers, nbytes - overlap)
        if plan.buffer_bytes:
            d = d_inst.index
            waiting = self.buffer_wait[d]
            # A transfer larger than the whole buffer goes through alone.
            if waiting or (self.in_buffer[d] and self.in_buffer[d] + nbytes > plan.buffer_bytes):
                waiting.append((p_inst, d_inst, rid, nbytes))
                return
            self.in_buffer[d] += nbytes
        self._send(p_inst, d_inst, rid, nbytes)

    def _send(self, p_inst, d_inst, rid: int, nbytes: float) -> None:
        plan, rec = self.plan, self.rec
        rec.t_kv_start[rid] = self.env.now
        extra = plan.setup_s + nbytes * plan.staged_s_per_byte
        path = (self.egress[p_inst.index], self.ingress[d_inst.index])
        ev = self.fabric.transfer(path, nbytes, extra)
        self.bytes_moved += nbytes

        def done(_e, rid=rid, p_inst=p_inst, d_inst=d_inst, nbytes=nbytes):
            rec.t_kv_done[rid] = self.env.now
            p_inst.release(rid)
            d_inst.kv_arrived(rid)
            if plan.buffer_bytes:
                self._drain_buffer(d_inst.index, nbytes)
        ev.callbacks.append(done)

    def _drain_buffer(self, d: int, freed: float) -> None:
        """The decode instance copied a transfer out of its buffer: start those that now fit."""
        self.in_buffer[d] -= freed
        waiting = self.buffer_wait[d]
        while waiting:
            p_inst, d_inst, rid, nbytes = waiting[0]
            if self.in_buffer[d] and self.in_buffer[d] + nbytes > self.plan.buffer_bytes:
                break
            waiting.popleft()
            self.in_buffer[d] += nbytes
            self._send(p_inst, d_inst, rid, nbytes)


def crossover_bandwidth(step_model, kv_bytes_per_token: float, prompt_tokens: int, chunk: int) -> dict:
    """The bandwidth below which moving a prompt's KV takes longer than computing it.

    ``prefill_s`` is the prompt's prefill time alone on the prefill instance
    (chunked by ``chunk`` tokens); the crossover is ``bytes / prefill_s`` in
    bytes/s for the whole instance.  Below it, PD's transfer alone exceeds the
    prefill it saves the decode side, and TTFT at least doubles.
    """
    prefill_s = step_model.prefill_time(prompt_tokens, chunk)
    nbytes = prompt_tokens * kv_bytes_per_token
    return {"prompt_tokens": prompt_tokens, "kv_bytes": nbytes, "prefill_s": prefill_s,
            "crossover_Bps": nbytes / prefill_s}


def fabric_verdicts(db, dep: Deployment, crossover: dict, connector: str = "nixl") -> list[dict]:
    """Per scale-out fabric in hwdb: transfer time of the prompt between two such instances vs its prefill.

    GPU-direct fabrics use ``connector``; the others the host-staged TCP connector.
    """
    from simulator.scenario import KVTransferConfig
    rows = []
    for link in db.links.values():
        if link.kind in ("nvlink", "xgmi", "pcie"):
            continue
        cfg = KVTransferConfig(connector=connector if link.gpu_direct else "tcp", fabric=link.name)
        plan = build_transfer_plan(cfg, db, dep, dep)
        t = plan.idle_time(crossover["prompt_tokens"])
        rows.append({"fabric": link.name, "connector": plan.connector, "instance_Bps": plan.prefill_side_Bps,
                     "transfer_s": t, "prefill_s": crossover["prefill_s"],
                     "verdict": "PD worse: transfer > prefill" if t > crossover["prefill_s"] else "ok"})
    return sorted(rows, key=lambda r: r["transfer_s"], reverse=True)
