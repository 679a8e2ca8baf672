"""Validated schemas for hardware database files.

Every figure that describes hardware is a :class:`Figure`: a value in SI units
(the unit is named by the field's suffix: ``_bytes``, ``_Bps`` for bytes per
second, ``_flops`` for FLOP/s, ``_s`` for seconds, ``_W``, ``_usd_per_hour``)
plus the ``source`` it was read from.  ``empirical: true`` marks a guess or a
correction that is not on a datasheet.  Unknown keys are errors, so a typo in a
user's file is reported instead of silently ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from simulator.bounds import Bytes, Fraction, LinkRate, NicRate, Price, Range, between, on_value, range_of
from simulator.strict_model import StrictModel


class Figure(StrictModel):
    """One sourced number in SI units; the field that holds it bounds its value (:func:`sourced`)."""

    value: float = Field(ge=0)
    source: str = Field(min_length=3)
    empirical: bool = False
    note: str | None = None


# What to give instead of a figure out of its range, unless the field says better.  A figure field is
# declared ``Annotated[Figure, Range(lo, hi, unit, fix=DATASHEET)]``, or bounded like a quantity of
# simulator.bounds with ``Annotated[Figure, range_of(quantity)]``.
DATASHEET = "give the datasheet figure in SI units"


def sourced(lo: float, hi: float, unit: str, fix: str = DATASHEET, lo_open: bool = False) -> Any:
    """``Annotated[Figure, Range(lo, hi, unit, lo_open=lo_open, fix=fix)]`` built at runtime (a type checker
    reads only that written form)."""
    return on_value(Figure, between(lo, hi, unit, lo_open=lo_open, fix=fix))


def sourced_as(quantity: Any) -> Any:
    """``Annotated[Figure, range_of(quantity)]`` (a :mod:`simulator.bounds` type) built at runtime."""
    return on_value(Figure, quantity)


Efficiency = Annotated[Figure, range_of(Fraction)]
# Host and latency figures: wide enough for a calibrated CPU engine (the fit's bounds, calibration/fit/params.py,
# allow a step overhead up to 10 s and a per-sequence cost up to 1 s).
Latency = Annotated[Figure, Range(0, 60, "s", fix="give seconds")]
HostCost = Annotated[Figure, Range(0, 10, "s", fix="give seconds of host time")]
PerItemCost = Annotated[Figure, Range(0, 1, "s", fix="give seconds per item")]


DTYPES = ("fp32", "bf16", "fp16", "fp8", "int8", "fp4")
DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0, "fp4": 0.5, "int4": 0.5}
# Bytes per stored weight including block scales: NVFP4 keeps one fp8 (e4m3) scale per 16 weights
# (NVIDIA, "Introducing NVFP4", 2025); W4A16 int4 (GPTQ/AWQ/compressed-tensors) one bf16 scale per
# group of 128.  fp8 per-channel or 128x128 block scales are below 0.1 % and left out.
WEIGHT_BYTES = {**DTYPE_BYTES, "fp4": 0.5 + 1 / 16, "int4": 0.5 + 2 / 128}
# The tensor-core dtype a weight format computes in: weight-only int4 dequantises to bf16.
COMPUTE_DTYPE = {"int4": "bf16"}


class EfficiencyCurve(StrictModel):
    """Achieved fraction of a peak as a saturating function of work size.

    ``eff(x) = max_eff * x / (x + half)``: ``x`` is tokens in a step for the
    compute curve and bytes moved for the memory curve; ``half`` is the size at
    which half of ``max_eff`` is reached.  Invariant: 0 < eff(x) <= max_eff <= 1.
    """

    max_eff: Fraction
    half: Annotated[float, Range(0, 1e15, "tokens or bytes", fix="give the work size at half of max_eff")]
    source: str = Field(min_length=3)
    empirical: bool = False

    def at(self, x: float) -> float:
        return self.max_eff * x / (x + self.half) if x > 0 else self.max_eff * 1e-9


class GemmShapeCurve(StrictModel):
    """Achieved fraction of a tensor-core peak for one GEMM of M rows and an N x K weight.

    ``eff(M, S) = max_eff * M / (M + half_m) * S / (S + half_nk)`` with ``S = N * K``: small weights
    (a tensor-parallel rank's slice, one MoE expert) use the tensor cores worse at any M, as a
    kernel's fixed pipeline prologue and epilogue and its wave tail weigh more.  ``fixed_s`` is the
    per-kernel cost the fit found beside it (the engine's per-layer overhead carries it in a step).
    Fitted on measured kernel tables (calibration/kernels/gemm_shape_fit.py).
    """

    max_eff: Fraction
    half_m: Annotated[float, Range(0, 1e6, "rows")]
    half_nk: Annotated[float, Range(0, 1e12, "weight elements")]
    fixed_s: Annotated[float, Range(0, 1e-3, "s", fix="give seconds per kernel")] = 0.0
    source: str = Field(min_length=3)
    empirical: bool = True

    def for_shapes(self, shapes: list[tuple[float, float]]) -> float:
        """Peak fraction at large M of a set of GEMMs run in series: ``shapes`` = [(N*K, FLOP share)].

        Time adds per GEMM, so the shares combine harmonically: 1/eff = sum share_i / eff_i.
        """
        total = sum(w for _, w in shapes)
        if total <= 0:
            return self.max_eff
        inv = sum(w / total * (nk + self.half_nk) / nk for nk, w in shapes if nk > 0)
        return self.max_eff / inv if inv > 0 else self.max_eff


Ranks = Annotated[int, Range(2, 72, "ranks", whole=True, fix="an all-reduce needs at least 2 ranks")]
CollectiveLatency = Annotated[float, Range(0, 10, "s", lo_open=True, fix="give one all-reduce's latency in seconds")]


class AllReduceCurve(StrictModel):
    """Measured latency of one tensor-parallel all-reduce against its message size, per TP size.

    ``sizes_bytes`` is increasing; ``graph_s[tp]`` and ``eager_s[tp]`` hold one latency (seconds) per
    size, inside a captured CUDA graph and launched eagerly.  Between sizes the latency is linear in
    bytes (each segment is one doubling, where a collective's algorithm and protocol are fixed); past
    the largest size it grows at the last segment's slope (the bandwidth regime).  The measured
    curve keeps what an alpha-beta line loses: the switches between one-shot, two-shot and NCCL
    algorithms (on B200 at TP8 a 256 KiB message costs 3x a 128 KiB one).
    """

    sizes_bytes: list[Annotated[float, Range(0, 1e12, "bytes", lo_open=True)]] = Field(min_length=2, max_length=64)
    graph_s: dict[Ranks, list[CollectiveLatency]]
    eager_s: dict[Ranks, list[CollectiveLatency]] = {}
    source: str = Field(min_length=3)
    empirical: bool = True

    @field_validator("sizes_bytes")
    @classmethod
    def _increasing(cls, v: list[float]) -> list[float]:
        if any(b <= a for a, b in zip(v, v[1:], strict=False)) or v[0] <= 0:
            raise ValueError("sizes_bytes must be positive and strictly increasing")
        return v

    @field_validator("graph_s", "eager_s")
    @classmethod
    def _latencies(cls, v: dict[int, list[float]], info) -> dict[int, list[float]]:
        n = len(info.data.get("sizes_bytes") or [])
        for tp, lat in v.items():
            if len(lat) != n:
                raise ValueError(f"tp={tp}: {len(lat)} latencies for {n} sizes; give one per size")
        return v

    def table(self, tp: int, graph: bool = True) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """(sizes, latencies) for ``tp`` ranks, or None when this TP size was not measured."""
        lat = (self.graph_s if graph or tp not in self.eager_s else self.eager_s).get(tp)
        return (tuple(self.sizes_bytes), tuple(lat)) if lat else None


# A GPU's figures: generous bounds around real hardware, so that a typo (a zero, 1e-308, a value in GB
# instead of bytes) is an error and not an answer.
GpuBandwidth = Annotated[Figure, Range(1e6, 1e15, "bytes/s", fix=DATASHEET)]
GpuMemory = Annotated[Figure, Range(1e8, 1e14, "bytes", fix=DATASHEET)]


class GPU(StrictModel):
    """A GPU type; figures are per GPU (a GB200 superchip counts as its GPUs)."""

    name: str
    aliases: tuple[str, ...] = ()
    vendor: Literal["nvidia", "amd", "intel", "other"]
    memory_bytes: GpuMemory
    # What CUDA reports as the device's total (torch.cuda.mem_get_info), below the datasheet by what the driver
    # keeps; the engines size their KV cache from it (None: 99 % of memory_bytes, as on the GPUs measured).
    visible_memory_bytes: GpuMemory | None = None
    memory_bandwidth_Bps: Annotated[Figure, Range(1e9, 1e16, "bytes/s", fix=DATASHEET)]
    peak_flops: dict[
        str, Annotated[Figure, Range(1e9, 1e19, "FLOP/s", fix="give dense FLOP/s, or leave the dtype out")]
    ]
    intra_node_link: str
    intra_node_bandwidth_Bps: GpuBandwidth
    scale_out_link: str | None = None
    scale_out_bandwidth_Bps: GpuBandwidth | None = None
    gpus_per_node: Annotated[int, Range(1, 72, "GPUs", whole=True)]
    power_W: Annotated[Figure, Range(0, 1e5, "W", fix=DATASHEET)]
    price_usd_per_hour: Annotated[Figure, range_of(Price)]
    compute_efficiency: EfficiencyCurve
    memory_efficiency: EfficiencyCurve
    notes: str | None = None

    @property
    def visible_bytes(self) -> float:
        """The device total an engine sees (bytes)."""
        v = self.visible_memory_bytes
        return v.value if v is not None else 0.99 * self.memory_bytes.value

    @model_validator(mode="after")
    def _visible_below_total(self) -> GPU:
        v, m = self.visible_memory_bytes, self.memory_bytes.value
        if v is not None and not 0.9 * m <= v.value <= m:
            raise ValueError(
                f"visible_memory_bytes={v.value:.4g} is not within 90-100 % of memory_bytes={m:.4g} "
                f"(CUDA sees ~1 % less than the datasheet); update it with memory_bytes, or remove it"
            )
        return self

    @field_validator("peak_flops")
    @classmethod
    def _known_dtypes(cls, v: dict[str, Figure]) -> dict[str, Figure]:
        bad = [k for k in v if k not in DTYPES]
        if bad:
            raise ValueError(f"unknown dtype(s) {bad}; allowed: {list(DTYPES)}")
        if "bf16" not in v and "fp16" not in v:
            raise ValueError("peak_flops needs at least bf16 or fp16")
        return v

    def flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype``; falls back to bf16/fp16 when absent."""
        for key in (dtype, "bf16", "fp16"):
            if key in self.peak_flops:
                return self.peak_flops[key].value
        raise KeyError(dtype)


class Link(StrictModel):
    """A link or fabric hop; bandwidth is per direction, per GPU where it is shared."""

    name: str
    aliases: tuple[str, ...] = ()
    kind: Literal["nvlink", "pcie", "infiniband", "roce", "efa", "tcp", "vpc", "xgmi"]
    bandwidth_Bps: Annotated[Figure, range_of(LinkRate)]
    latency_s: Latency
    efficiency: Annotated[Figure, Range(0, 1, "", lo_open=True, fix="it is the fraction of bandwidth achieved")]
    gpu_direct: bool
    cpu_cost_s_per_byte: Annotated[Figure, Range(0, 1e-3, "s per byte", fix="give host seconds per byte moved")]
    notes: str | None = None

    @property
    def effective_Bps(self) -> float:
        return self.bandwidth_Bps.value * self.efficiency.value


class NetworkLayout(StrictModel):
    """How a cloud instance type (or a cluster's node) reaches the network: which link its GPU NICs speak,
    how many there are and their line rate.  Used as a KV/embedding fabric name: it supplies the link,
    GPUs per NIC and the NIC rate (``kv_transfer.fabric: gcp-a3-high``).

    ``nics_per_node`` NICs of ``nic_Bps`` each serve ``gpus_per_node`` GPUs; either count divides the
    other.  Fewer NICs than GPUs: ``gpus_per_node / nics_per_node`` GPUs share one NIC; more NICs than
    GPUs (AWS p5: 32 EFA cards for 8 GPUs): each GPU has its own ``nics_per_node / gpus_per_node`` NICs,
    taken together as one per-GPU NIC of their summed rate.
    """

    name: str
    aliases: tuple[str, ...] = ()
    provider: str
    instance: str
    gpus: tuple[str, ...] = Field(min_length=1)  # GPU names of hwdb gpus/ this node type carries
    gpus_per_node: Annotated[int, Range(1, 72, "GPUs", whole=True)]
    fabric: str  # the link (links/) its GPU NICs speak
    nics_per_node: Annotated[int, Range(1, 64, "NICs", whole=True)]
    nic_Bps: Annotated[Figure, range_of(NicRate)]  # line rate of one NIC, bytes/s per direction
    notes: str | None = None

    @model_validator(mode="after")
    def _counts_divide(self) -> NetworkLayout:
        g, n = self.gpus_per_node, self.nics_per_node
        if max(g, n) % min(g, n):
            raise ValueError(
                f"gpus_per_node={g} and nics_per_node={n}: one must divide the other (e.g. 8 GPUs "
                "behind 4 NICs, or 32 NICs for 8 GPUs)"
            )
        return self

    @property
    def gpus_per_nic(self) -> int:
        """GPUs behind one (per-GPU aggregated) NIC."""
        return max(1, self.gpus_per_node // self.nics_per_node)

    @property
    def per_nic_Bps(self) -> float:
        """Line rate of that (aggregated) NIC, bytes/s."""
        return self.nic_Bps.value * max(1, self.nics_per_node // self.gpus_per_node)


class KeptModules(StrictModel):
    """Weight groups a quantised checkpoint keeps unquantised, and the checkpoint config that says so."""

    modules: tuple[Literal["attention", "dense_mlp", "shared_experts"], ...]
    source: str = Field(min_length=3)


class MoeKernelChoice(StrictModel):
    """The fused-MoE kernel format a checkpoint's routed experts run on, and what says so."""

    format: Literal["bfloat16", "fp8", "fp8_block", "nvfp4", "int4_wo", "w4a16_mxfp4", "w4a8_mxfp4_mxfp8"]
    source: str = Field(min_length=3)


class KvDirective(StrictModel):
    """The KV-cache format a quantised checkpoint asks for (ModelOpt ``kv_cache_quant_algo``,
    compressed-tensors ``kv_cache_scheme``), and the file that says so."""

    dtype: Literal["fp8"]
    source: str = Field(min_length=3)


class ModelSidecar(StrictModel):
    """What a Hugging Face ``config.json`` lacks, kept beside it as ``epdsim.yaml``."""

    name: str
    aliases: tuple[str, ...] = ()
    hf_id: str | None = None
    source: str = Field(min_length=3)
    default_dtype: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"
    # Per weight format, the weight groups the model's checkpoint in that format keeps in bf16 (the LM
    # head and the MoE router always are): simulator/linear_groups.py.
    bf16_modules: dict[Literal["fp8", "fp4", "int4"], KeptModules] = {}
    # Bytes per quantised weight (with its scales) where this model's checkpoint differs from the
    # format's default in WEIGHT_BYTES (e.g. MXFP4: one 1-byte scale per 32 weights, 0.53125 B).
    quant_bytes: dict[
        Literal["fp8", "fp4", "int4"], Annotated[Figure, Range(0, 4, "bytes per weight", lo_open=True, fix=DATASHEET)]
    ] = {}
    # Per weight format, the fused-MoE kernel format (a key of hwdb.moe.FORMATS) the checkpoint runs on
    # where it differs from the format's default (simulator.perf.Deployment.moe_format).
    moe_kernel: dict[Literal["fp8", "fp4", "int4"], MoeKernelChoice] = {}
    # Per weight format, the KV-cache format this model's checkpoint in that format declares (none: the
    # engine's 'auto' keeps the activation dtype, bf16).
    kv_cache_directive: dict[Literal["fp8", "fp4", "int4"], KvDirective] = {}
    vision: dict | None = None
    notes: str | None = None


class Connector(StrictModel):
    """A KV-cache transfer connector (vLLM ``--kv-transfer-config`` kv_connector).

    Transfer time on a path = ``setup_s`` + bytes / (path bandwidth x
    ``efficiency``) when ``host_staged`` is false; a host-staged connector
    also pays bytes x (link ``cpu_cost_s_per_byte``) for serialisation plus a
    GPU->host and a host->GPU copy over PCIe.  ``layerwise`` connectors can
    send each layer's KV as soon as it is computed.
    """

    name: str
    aliases: tuple[str, ...] = ()
    vllm_name: str | None = None
    # The deployment strategy that writes this connector's plan output (its --kv-transfer-config, env, proxy):
    # a class registered in simulator.pd.connectors.CONNECTORS; None: the one registered under ``name``.
    strategy: str | None = None
    setup_s: Latency
    efficiency: Efficiency
    host_staged: bool
    gpu_direct_required: bool
    layerwise: bool
    default_buffer_bytes: Annotated[Figure, range_of(Bytes)] | None = None
    # A connector with a TCP mode runs host-staged over a fabric without GPU-direct; its value is the
    # connector efficiency in that mode (None: the connector needs GPU-direct and is refused there).
    tcp_mode_efficiency: Efficiency | None = None
    notes: str | None = None
