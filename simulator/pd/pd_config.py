"""The scenario's ``kv_transfer`` block: how a PD deployment moves KV from prefill to decode instances.

A validated, frozen pydantic model; :func:`simulator.pd.pd.build_transfer_plan` turns it and the
hardware database into a transfer plan.  Units: bytes, bytes/s, seconds.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from simulator.inputs import StrictModel
from simulator.pd.flows import FLOWS


class KVTransferConfig(StrictModel):
    """How a PD deployment moves KV from prefill to decode instances."""

    connector: str = "nixl"
    flow: str = "vllm"           # a proxy flow of simulator.pd.flows.FLOWS
    fabric: str | None = None
    same_node: bool = False
    layerwise: bool | None = None
    bandwidth_Bps: float | None = Field(None, ge=1e3)  # what-if: per-instance bandwidth instead of the fabric's
    bandwidth_factor: float = Field(1.0, gt=0, le=1)  # degraded fabric: fraction of bandwidth left
    jitter_mean_s: float = Field(0.0, ge=0, le=3600)         # extra latency per transfer, exponential with this mean
    kv_buffer_size: float | None = Field(None, gt=0)  # bytes; receive buffer per decode instance (P2pNccl)
    # ``fabric``: a link (hwdb links/) or a node type's network layout (networks/: link, GPUs per NIC, NIC rate).
    # Network topology (simulator/pd/pd.py): GPUs behind one NIC (None: the layout's, else 1 on RDMA fabrics, a node on TCP/VPC),
    # one NIC's line rate (None: the fabric link's), nodes under one leaf switch and its uplink's
    # oversubscription, racks under one spine (a pod) and the pod uplink's; where the pools sit.
    gpus_per_nic: int | None = Field(None, ge=1, le=72)
    nic_Bps: float | None = Field(None, gt=0)
    nodes_per_rack: int | None = Field(None, ge=1)
    oversubscription: float = Field(1.0, ge=1)
    racks_per_pod: int | None = Field(None, ge=1)
    pod_oversubscription: float = Field(1.0, ge=1)
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
