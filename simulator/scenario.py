"""The scenario: one validated, frozen description of a simulation.

Built from YAML (:func:`load_scenario`) or Python (``Scenario(...)``), and the
single entry point to a run (:func:`simulate`).  Unknown keys and bad values
are :class:`ScenarioError` messages naming the field, the value and the fix.
:func:`deployment_for` resolves one pool against the hardware data; the whole
scenario is resolved for a run by :func:`simulator.resolved.resolve`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator

import hwdb
from hwdb.mla import KV_DTYPES
from simulator.bounds import MAX_SECONDS, MAX_TOKENS, Fraction, Range, Seed
from simulator.engine_rules import (
    engine_running_cap,
    expert_backend_note,
    scheduled_ahead,
    vllm_batch_defaults,
    weight_only_refusal,
)
from simulator.epd.epd_config import EmbeddingTransferConfig, EncoderConfig
from simulator.errors import format_validation_error
from simulator.inputs import read_yaml
from simulator.kv_rule import resolve_kv_dtype
from simulator.ops.opsconfig import OperationsConfig, check_against_pools
from simulator.pd.flows import FLOWS
from simulator.pd.pd_config import KVTransferConfig
from simulator.perf import Deployment, EngineKnobs
from simulator.routing import ROUTERS
from simulator.strict_model import Folders, StrictModel
from simulator.workload_config import WorkloadConfig


class ScenarioError(ValueError):
    """The scenario is malformed or describes an impossible deployment."""


class EngineConfig(StrictModel):
    """Engine arguments with vLLM's names; ``None`` means vLLM's own default for the GPU."""

    engine: str = "vllm-v1"
    # The engine release (e.g. "0.19.0"); None: the engine profile's own version.  Release-dependent
    # behaviour follows it (what kv_cache_dtype: auto means).
    version: str | None = Field(default=None, min_length=1, max_length=40, pattern=r"^[0-9][0-9A-Za-z.+-]*$")
    max_num_seqs: Annotated[int, Range(1, 1_000_000, "sequences", whole=True)] | None = None
    max_num_batched_tokens: Annotated[int, Range(1, MAX_TOKENS, "tokens", whole=True)] | None = None
    block_size: Literal[1, 8, 16, 32, 64, 128] = 16
    # vLLM's gpu_memory_utilization, SGLang's mem_fraction_static, TensorRT-LLM's free_gpu_memory_fraction;
    # None: the engine release's default (vLLM 0.9, 0.92 from 0.20; SGLang's own rule; TensorRT-LLM 0.9).
    gpu_memory_utilization: Fraction | None = None
    enable_chunked_prefill: bool | None = None  # None: the engine's default
    enable_prefix_caching: bool | None = None
    enforce_eager: bool = False
    max_cudagraph_capture_size: Annotated[int, Range(1, 1_000_000, "sequences", whole=True)] | None = None
    max_model_len: Annotated[int, Range(16, 10**8, "tokens", whole=True)] | None = None
    # vLLM's override of the profiled KV blocks
    num_gpu_blocks_override: Annotated[int, Range(1, 10**12, "blocks", whole=True)] | None = None
    # The routed experts' kernel when the engine was told to run one other than its default (vLLM's
    # --moe-backend marlin; VLLM_MXFP4_USE_MARLIN=1 for MXFP4 experts before that flag); None: the default.
    moe_backend: Literal["marlin"] | None = None
    # vLLM's --async-scheduling / --no-async-scheduling: the engine schedules a step ahead, so a prompt sent
    # while a step runs joins the step after next; None: the release's default (engine profile).
    async_scheduling: bool | None = None
    # SGLang's --scheduler-recv-interval: a busy scheduler reads new requests every N decode steps (docs/scenario.md)
    scheduler_recv_interval: Annotated[int, Range(1, 100_000, "steps", whole=True)] | None = None


class PoolConfig(StrictModel):
    """A pool of identical instances (``tp * pp`` GPUs each)."""

    name: str = "main"
    role: Literal["colocated", "prefill", "decode", "encoder"] = "colocated"  # a key of simulator.roles.ROLES
    model: str | None = None
    gpu: str
    tp: Annotated[int, Range(1, 72, "GPUs", whole=True)] = 1
    pp: Annotated[int, Range(1, 64, "stages", whole=True)] = 1
    # Attention data parallelism (vLLM --data-parallel-size, SGLang --enable-dp-attention --dp-size): an
    # instance is dp ranks of tp x pp GPUs, each its own scheduler and KV cache, whose MoE layers run
    # together over all the instance's GPUs; ep: expert parallelism over them (1: experts TP-sharded).
    dp: Annotated[int, Range(1, 256, "ranks", whole=True)] = 1
    ep: Annotated[int, Range(1, 1024, "ranks", whole=True)] = 1
    instances: Annotated[int, Range(1, 4096, "instances", whole=True)] = 1
    dtype: Literal["bf16", "fp16", "fp8", "fp4", "int4"] = "bf16"  # fp4: NVFP4/MXFP4; int4: W4A16
    kv_cache_dtype: Literal["auto", "bf16", "fp16", "fp8"] = "auto"
    engine: EngineConfig = EngineConfig()
    router: str = "least_outstanding"
    encoder: EncoderConfig = EncoderConfig()  # image encoding: encoder pools, or colocated/prefill pools

    @model_validator(mode="after")
    def _router_known(self) -> PoolConfig:
        if self.router not in ROUTERS:
            raise ValueError(f"router={self.router!r} is unknown; choose one of {sorted(ROUTERS)}")
        if (self.tp * self.dp) % self.ep:
            raise ValueError(
                f"ep={self.ep} must divide the instance's tp x dp = {self.tp * self.dp} GPUs (experts "
                f"are spread over them, ep ways by expert and the rest by tensor slices)"
            )
        return self


Target = Annotated[float, Range(0, 1e6, "s", lo_open=True, fix="give the latency target in seconds (200 ms = 0.2)")]


class SLO(StrictModel):
    """Latency targets (seconds) a request must meet to count toward attainment and goodput."""

    ttft_s: Target | None = None
    tpot_s: Target | None = None
    attainment: Fraction = 0.9
    # Goodput criterion: None counts requests meeting both targets (attainment); a percentile
    # (e.g. 99) instead requires that percentile of TTFT and of TPOT to meet them (EPD papers).
    percentile: Annotated[float, Range(0, 100, "percent", lo_open=True, fix="give a percentile such as 99")] | None = (
        None
    )


class SimulationConfig(StrictModel):
    max_time_s: (
        Annotated[float, Range(0, MAX_SECONDS, "s", lo_open=True, fix="give seconds of simulated time")] | None
    ) = None


class Scenario(StrictModel):
    """Everything one simulation needs; ``seed`` makes it reproducible byte for byte."""

    name: str = "scenario"
    description: str = ""
    seed: Seed = 0
    model: str
    hwdb: Folders = ()
    pools: tuple[PoolConfig, ...] = Field(min_length=1)
    workload: WorkloadConfig
    slo: SLO = SLO()
    kv_transfer: KVTransferConfig = KVTransferConfig()
    embedding_transfer: EmbeddingTransferConfig = EmbeddingTransferConfig()
    simulation: SimulationConfig = SimulationConfig()
    operations: OperationsConfig = OperationsConfig()

    @model_validator(mode="after")
    def _operations_fit_pools(self) -> Scenario:
        check_against_pools(self.operations, self.pools)
        flow = FLOWS[self.kv_transfer.flow]
        if self.operations.enabled and self.is_pd and not flow.operations:
            ok = ", ".join(n for n, f in FLOWS.items() if f.operations)
            raise ValueError(
                f"operations (autoscaling/faults) model only these PD proxy flows: {ok}; kv_transfer.flow="
                f"{flow.name!r}: set flow: vllm or drop the operations block"
            )
        return self

    @model_validator(mode="after")
    def _pool_layout(self) -> Scenario:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pool names must be unique, got {names}")
        roles = sorted(p.role for p in self.pools)
        if roles not in (
            ["colocated"],
            ["decode", "prefill"],
            ["colocated", "encoder"],
            ["decode", "encoder", "prefill"],
        ):
            raise ValueError(
                f"pools have roles {roles}; give one colocated pool, or one prefill and one decode "
                "pool (prefill-decode disaggregation), each optionally with one encoder pool "
                "(encoder-prefill-decode disaggregation)"
            )
        return self

    @property
    def is_pd(self) -> bool:
        return any(p.role == "prefill" for p in self.pools)

    def pool(self, role: str) -> PoolConfig:
        return next(p for p in self.pools if p.role == role)


def resolve_relative(data: dict, base: Path) -> dict:
    """``data`` with its relative ``path`` entries and ``hwdb`` folders taken relative to ``base`` (the
    folder of the file it was read from)."""
    data = _resolve_paths(data, base)
    folders = data.get("hwdb", [])
    if isinstance(folders, (str, list, tuple)):  # anything else is refused by the schema, as given
        folders = [folders] if isinstance(folders, str) else folders
        data["hwdb"] = [str(base / d) if isinstance(d, str) and not Path(d).is_absolute() else d for d in folders]
    return data


def _resolve_paths(node, base: Path):
    """Make relative ``path`` entries relative to the scenario file's folder."""
    if isinstance(node, dict):
        return {
            k: (
                str(base / v)
                if k == "path" and isinstance(v, str) and not Path(v).is_absolute()
                else _resolve_paths(v, base)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_resolve_paths(v, base) for v in node]
    return node


def parse_scenario(data: dict, origin: str = "scenario", base: Path | None = None) -> Scenario:
    if data is None:
        raise ScenarioError(
            f"{origin}: the scenario is empty; give at least model, pools and workload "
            f"(see examples/llama8b_h100_chat.yaml)"
        )
    if not isinstance(data, dict):
        raise ScenarioError(
            f"{origin}: expected a mapping of scenario fields (model, pools, workload, ...) "
            f"at the top level, got a {type(data).__name__}"
        )
    if base is not None:
        data = resolve_relative(data, base)
        model = data.get("model")
        if isinstance(model, str) and not Path(model).is_absolute() and (base / model).exists():
            data["model"] = str(base / model)  # a local config.json or model folder next to the scenario
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(
            format_validation_error(err, data, root=Scenario, origin=origin, what="scenario", docs="docs/scenario.md")
        ) from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file."""
    path = Path(path)
    data = read_yaml(path, ScenarioError, "scenario")
    return parse_scenario(data, str(path), path.parent)


def deployment_for(pool: PoolConfig, model: hwdb.ModelEntry, db: hwdb.HardwareDB) -> Deployment:
    """Resolve a pool's names and defaults into a :class:`Deployment` (raises ScenarioError)."""
    try:
        gpu = db.gpu(pool.gpu)
    except hwdb.HwdbError as exc:
        raise ScenarioError(f"pools[{pool.name}].gpu: {exc}") from None
    try:
        engine = db.engine(pool.engine.engine)
    except hwdb.HwdbError as exc:
        raise ScenarioError(f"pools[{pool.name}].engine.engine: {exc}") from None
    try:
        link = db.link(gpu.intra_node_link)
    except hwdb.HwdbError as exc:
        raise ScenarioError(f"pools[{pool.name}]: {exc}") from None
    if pool.tp > gpu.gpus_per_node:
        raise ScenarioError(
            f"pools[{pool.name}].tp={pool.tp} exceeds the {gpu.gpus_per_node} GPUs in a "
            f"{gpu.name} node; tensor parallelism stays within a node: lower tp and raise pp or dp"
        )
    arch = model.arch
    if pool.ep > 1 and not arch.is_moe:
        raise ScenarioError(
            f"pools[{pool.name}].ep={pool.ep} but {arch.name} has no experts; expert parallelism "
            f"needs a MoE model: set ep: 1"
        )
    if arch.is_moe and arch.num_experts % pool.ep:
        raise ScenarioError(
            f"pools[{pool.name}].ep={pool.ep} does not divide {arch.name}'s {arch.num_experts} "
            f"routed experts; choose a divisor"
        )
    if arch.num_kv_heads and not arch.is_mla and (arch.num_kv_heads % pool.tp and pool.tp % arch.num_kv_heads):
        raise ScenarioError(
            f"pools[{pool.name}].tp={pool.tp} neither divides nor is a multiple of {arch.name}'s "
            f"{arch.num_kv_heads} KV heads; choose tp among their divisors or multiples"
        )
    if pool.pp > arch.num_layers:
        raise ScenarioError(
            f"pools[{pool.name}].pp={pool.pp} exceeds {arch.name}'s {arch.num_layers} layers; "
            f"each pipeline stage needs at least one layer: lower pp"
        )
    if arch.num_heads % pool.tp:
        raise ScenarioError(
            f"pools[{pool.name}].tp={pool.tp} does not divide {arch.name}'s "
            f"{arch.num_heads} attention heads; choose a divisor"
        )
    if pool.dtype in ("fp8", "fp4") and pool.dtype not in gpu.peak_flops:
        why = weight_only_refusal(pool.name, pool.dtype, gpu, engine)
        if why:
            raise ScenarioError(why)
    seqs, tokens = vllm_batch_defaults(gpu)
    e = pool.engine
    if (recv := e.scheduler_recv_interval or 1) > 1 and (engine.engine != "sglang" or pool.dp > 1):
        why = (
            f"SGLang's flag, not {engine.name}'s" if engine.engine != "sglang" else "not modelled with data parallelism"
        )
        raise ScenarioError(f"pools[{pool.name}].engine.scheduler_recv_interval={recv}: {why}; remove it or set 1")
    prefix = engine.default_prefix_caching if e.enable_prefix_caching is None else e.enable_prefix_caching
    serial = prefix and arch.num_linear_layers > 0 and not engine.overlap_with_linear_prefix_cache
    ahead, why = scheduled_ahead(
        pool.name, e.async_scheduling, e.version or engine.version, pool.pp, engine, gpu, serial
    )
    if why:
        raise ScenarioError(why)
    chunked = engine.default_chunked_prefill if e.enable_chunked_prefill is None else e.enable_chunked_prefill
    max_len = e.max_model_len or arch.max_position_embeddings or 8192
    max_seqs = e.max_num_seqs or engine.default_max_num_seqs or seqs
    # Without chunked prefill vLLM's budget defaults to max(max_model_len, 2048).
    tier_tokens, tier_graphs = engine.memory_tier(gpu.visible_bytes, pool.tp)
    max_tokens = e.max_num_batched_tokens or tier_tokens or (tokens if chunked else max(max_len, 2048))
    if max_tokens < max_seqs and engine.engine == "vllm":
        raise ScenarioError(
            f"pools[{pool.name}].engine: max_num_batched_tokens={max_tokens} is below "
            f"max_num_seqs={max_seqs}; vLLM requires max_num_batched_tokens >= max_num_seqs"
        )
    if not chunked and max_tokens < max_len:
        raise ScenarioError(
            f"pools[{pool.name}].engine: without chunked prefill max_num_batched_tokens "
            f"({max_tokens}) must be >= max_model_len ({max_len}); raise it or lower max_model_len"
        )
    knobs = EngineKnobs(
        max_num_seqs=max_seqs,
        max_num_batched_tokens=max_tokens,
        block_size=e.block_size,
        gpu_memory_utilization=e.gpu_memory_utilization,
        enable_chunked_prefill=chunked,
        enforce_eager=e.enforce_eager,
        max_cudagraph_capture_size=e.max_cudagraph_capture_size or tier_graphs or min(2 * max_seqs, 512),
        max_model_len=max_len,
        num_gpu_blocks_override=e.num_gpu_blocks_override or 0,
        recv_interval=recv,
        async_scheduling=ahead,
        prefix_caching=prefix,
    )
    kv, kv_note = resolve_kv_dtype(pool.kv_cache_dtype, pool.dtype, engine, e.version, model.sidecar)
    # A 4-bit float checkpoint served weight-only (no fp4 tensor cores) is held as the sidecar's W4A16 entry
    # says, where it has one (gpt-oss: vLLM's Hopper MXFP4 layout and kernel).
    side = (
        "int4"
        if pool.dtype == "fp4" and "fp4" not in gpu.peak_flops and "int4" in model.sidecar.quant_bytes
        else pool.dtype
    )
    kept = model.sidecar.bf16_modules[side] if side in model.sidecar.bf16_modules else None
    qbytes = model.sidecar.quant_bytes[side] if side in model.sidecar.quant_bytes else None
    scale_out = None
    if pool.tp * pool.dp * pool.pp > gpu.gpus_per_node and pool.ep > 1:
        try:
            scale_out = db.link(gpu.scale_out_link or "")  # none named: "unknown link ''"
        except hwdb.HwdbError as exc:
            raise ScenarioError(
                f"pools[{pool.name}]: experts span {pool.tp * pool.dp * pool.pp} GPUs, more than a "
                f"{gpu.name} node: {exc}"
            ) from None
    dep = Deployment(
        arch=arch,
        gpu=gpu,
        intra_link=link,
        engine=engine,
        knobs=knobs,
        tp=pool.tp,
        pp=pool.pp,
        dp=pool.dp,
        ep=pool.ep,
        scale_out_link=scale_out,
        weight_dtype=pool.dtype,
        kv_dtype=kv,
        profile=db.profile_for(gpu.name, engine.engine, engine.version, model.name),
        bf16_modules=frozenset(kept.modules) if kept else frozenset(),
        quant_bytes=qbytes.value if qbytes else None,
        kv_note=kv_note,
        version=e.version,
    )
    dep = engine_running_cap(dep, e.max_num_seqs is not None)
    if arch.num_linear_layers:
        gdn, gdn_source = db.gdn_curve(gpu.name, engine.engine)
        dep = dataclasses.replace(dep, gdn_curve=gdn, gdn_source=gdn_source)
    if arch.is_mla:
        mla, mla_source = db.mla_curve(gpu.name, engine.engine)
        if mla is not None and KV_DTYPES.get(kv) not in mla.generation:  # its DSA indexer may still apply
            mla_source = f"{mla_source} has no {kv} KV-cache curve: the attention curves of the profile or GPU"
        dep = dataclasses.replace(dep, mla_curve=mla, mla_source=mla_source)
    if not arch.is_moe:
        return dep
    choice = model.sidecar.moe_kernel[side] if side in model.sidecar.moe_kernel else None
    if choice is not None:
        dep = dataclasses.replace(dep, moe_kernel=choice.format)
    curve, source = db.moe_curve(gpu.name, engine.engine, dep.moe_format, pool.ep, e.moe_backend)
    return dataclasses.replace(dep, moe_curve=curve, moe_source=source + expert_backend_note(dep) if source else source)
