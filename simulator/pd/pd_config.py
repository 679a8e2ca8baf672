"""The scenario's ``kv_transfer`` block: how a PD deployment moves KV from prefill to decode instances.

A validated, frozen pydantic model; :func:`simulator.pd.pd.build_transfer_plan` turns it and the
hardware database into a transfer plan.  Units: bytes, bytes/s, seconds.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import field_validator, model_validator

from simulator.bounds import BandwidthLeft, InstanceRate, NicRate, Range
from simulator.pd.flows import FLOWS
from simulator.strict_model import StrictModel

# An uplink's oversubscription (downlink over uplink capacity): 1 is non-blocking, real fabrics stay
# below about 20:1, and a 64-port switch with a single uplink of its port speed reaches 63:1 at most;
# a larger ratio describes no switch (at 1e308 one transfer would last 1e74 s).
Oversubscription = Annotated[float, Range(1, 64, fix="give the ratio of downlink to uplink capacity, e.g. 4 for 4:1")]


class KVTransferConfig(StrictModel):
    """How a PD deployment moves KV from prefill to decode instances."""

    connector: str = "nixl"
    flow: str = "vllm"  # a proxy flow of simulator.pd.flows.FLOWS
    fabric: str | None = None
    same_node: bool = False
    layerwise: bool | None = None
    bandwidth_Bps: InstanceRate | None = None  # what-if: per-instance bandwidth instead of the fabric's
    bandwidth_factor: BandwidthLeft = 1.0  # degraded fabric: fraction of bandwidth left
    # extra latency per transfer, exponential mean
    jitter_mean_s: Annotated[float, Range(0, 3600, "s", fix="give seconds")] = 0.0
    # bytes; receive buffer per decode instance (P2pNccl)
    kv_buffer_size: Annotated[float, Range(1, 1e15, "bytes", fix="give bytes (1 GB = 1e9)")] | None = None
    # ``fabric``: a link (hwdb links/) or a node type's network layout (networks/: link, GPUs per NIC, NIC rate).
    # Network topology (simulator/pd/pd.py): GPUs behind one NIC (None: the layout's, else 1 on RDMA fabrics, a
    # node on TCP/VPC), one NIC's line rate (None: the fabric link's), nodes under one leaf switch and its uplink's
    # oversubscription, racks under one spine (a pod) and the pod uplink's; where the pools sit.
    gpus_per_nic: Annotated[int, Range(1, 72, "GPUs", whole=True)] | None = None
    nic_Bps: NicRate | None = None
    nodes_per_rack: Annotated[int, Range(1, 4096, "nodes", whole=True)] | None = None
    oversubscription: Oversubscription = 1.0
    racks_per_pod: Annotated[int, Range(1, 4096, "racks", whole=True)] | None = None
    pod_oversubscription: Oversubscription = 1.0
    placement: Literal["cross_rack", "same_rack", "cross_pod"] = "cross_rack"

    @field_validator("flow")
    @classmethod
    def _known_flow(cls, v: str) -> str:
        if v not in FLOWS:
            raise ValueError(f"flow {v!r} is not a PD proxy flow; use one of: {', '.join(FLOWS)}")
        return v

    @model_validator(mode="after")
    def _tiers(self) -> KVTransferConfig:
        if self.racks_per_pod is not None and self.nodes_per_rack is None:
            raise ValueError(f"racks_per_pod={self.racks_per_pod} needs nodes_per_rack (the pod is made of racks)")
        if self.placement == "cross_pod" and self.racks_per_pod is None:
            raise ValueError("placement=cross_pod needs racks_per_pod and nodes_per_rack (the pod's size)")
        return self
