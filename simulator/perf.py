"""Step-time and memory models for one serving instance (SI units throughout).

A step processes ``tokens`` new tokens (one per decoding sequence plus the
prefill chunks scheduled in it).  Its GPU time is the roofline maximum of

* compute: linear-layer FLOPs (2 x active parameters of this rank per token)
  over peak x compute-efficiency(tokens), plus causal-attention FLOPs
  (4 x attention width per query-key pair) over peak x attention efficiency;
* memory: this rank's weights (for MoE only the experts the batch touches),
  the KV cache read by every sequence and the KV written, over HBM bandwidth x
  memory-efficiency(bytes);

plus two tensor-parallel all-reduces per layer (ring over the node's link),
pipeline hand-offs, and a per-step host overhead that is small when the step
fits a captured CUDA graph.  :class:`simulator.stepmodel.StepModel` precomputes coefficients so
that :meth:`StepModel.step_time` costs a few dozen float operations whatever
the batch size: the engine passes aggregates, never per-request lists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from hwdb.engine_schema import EngineMemory, EngineProfile
from hwdb.gdn import GdnCurve
from hwdb.mla import MlaCurve
from hwdb.models import ModelArch
from hwdb.moe import MoeCurve
from hwdb.profiles import Profile
from hwdb.schema import GPU, Link
from simulator.linear_groups import Group, linear_groups, stored_weight_bytes
from simulator.memory import (
    FitError,
    MemoryPlan,
    budget,
    kv_bytes_per_token,
    linear_state_pool,
    memory_fraction,
    sglang_max_running,
)

GiB = 2**30


@dataclass(frozen=True)
class EngineKnobs:
    """Engine settings of one instance, with vLLM's meanings and units."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int = 16
    gpu_memory_utilization: float | None = None  # None: the engine release's default (simulator/memory.py)
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    max_cudagraph_capture_size: int = 512
    max_model_len: int = 0
    num_gpu_blocks_override: int = 0
    prefix_caching: bool = True
    recv_interval: int = 1  # SGLang's scheduler_recv_interval (decode steps)
    async_scheduling: bool = False  # vLLM schedules a step ahead: a prompt sent during step K joins K + 2


@dataclass(frozen=True)
class Deployment:
    """What the perf models need about an instance: model, GPU, parallelism, dtypes."""

    arch: ModelArch
    gpu: GPU
    intra_link: Link
    engine: EngineProfile
    knobs: EngineKnobs
    tp: int = 1
    pp: int = 1
    dp: int = 1  # attention data-parallel ranks of tp x pp GPUs each (PoolConfig.dp)
    ep: int = 1  # expert-parallel ways over the instance's tp x pp x dp GPUs (1: TP-sharded experts)
    scale_out_link: Link | None = None  # between nodes, when the experts span more GPUs than a node holds
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    profile: Profile | None = None
    # Weight groups this checkpoint keeps in bf16 beside the LM head and router (simulator/linear_groups.py),
    # and its bytes per quantised weight when they differ from the format's default (None: the default).
    bf16_modules: frozenset[str] = frozenset()
    quant_bytes: float | None = None
    # The measured fused-MoE kernel of this GPU, engine and moe_format (hwdb/moe.py; None: the roofline
    # with the GEMM curves) and the hwdb entry it came from.
    moe_curve: MoeCurve | None = None
    moe_source: str = ""
    # The checkpoint's own fused-MoE kernel format for this weight format (model sidecar), "" for the default.
    moe_kernel: str = ""
    # The measured Gated-DeltaNet kernels of this GPU and engine (hwdb/gdn.py) for a model with linear-attention
    # layers (None: none measured, or no such layers) and the hwdb entry it came from.
    gdn_curve: GdnCurve | None = None
    gdn_source: str = ""
    # The measured MLA attention kernels of this GPU and engine (hwdb/mla.py) for an MLA model (None: not measured
    # apart, or not MLA: the attention curves of the profile or GPU) and the hwdb entry it came from.
    mla_curve: MlaCurve | None = None
    mla_source: str = ""
    # Why kv_dtype is what it is (simulator.kv_rule.resolve_kv_dtype).
    kv_note: str = ""
    version: str | None = None  # the engine release (EngineConfig.version); None: the profile's

    @property
    def release(self) -> str:
        return self.version or self.engine.version

    @property
    def moe_format(self) -> str:
        """The routed experts' kernel format (a key of hwdb.moe.FORMATS): bf16 kept experts, block-scaled
        fp8 (every fp8 MoE checkpoint in hwdb: DeepSeek, Qwen3-FP8, MiniMax, GLM-5), NVFP4 on GPUs with fp4
        tensor cores and weight-only MXFP4 without (vLLM's Marlin/Triton path on Hopper), W4A16 int4; a
        checkpoint that says otherwise (``moe_kernel``, from its sidecar) wins."""
        if self.moe_kernel:
            return self.moe_kernel
        w = "bf16" if "experts" in self.bf16_modules else self.weight_dtype
        if w == "fp4":
            return "nvfp4" if "fp4" in self.gpu.peak_flops else "w4a16_mxfp4"
        return {"fp8": "fp8_block", "int4": "int4_wo"}.get(w, "bfloat16")

    @property
    def gpus(self) -> int:
        """GPUs of one instance: its dp ranks of tp x pp each."""
        return self.tp * self.pp * self.dp

    @property
    def rank_gpus(self) -> int:
        """GPUs of one attention data-parallel rank (one scheduler, one KV cache)."""
        return self.tp * self.pp

    @property
    def moe_tp(self) -> int:
        """Tensor-parallel ways of each routed expert: the instance's GPUs over the expert-parallel ways."""
        return self.gpus // self.ep

    def weight_bytes_per_gpu(self) -> float:
        """Weights one GPU holds: the routed experts are spread over every GPU of the instance (vLLM and
        SGLang shard the MoE layers over dp x tp, by expert or by slice), everything else over one rank's
        tp x pp (each data-parallel rank keeps its own copy), the untied input embedding too."""
        groups = self.linear_groups()
        per = sum(g.params * g.weight_bytes / (self.gpus if g.name == "experts" else self.rank_gpus) for g in groups)
        embed = self.model_weight_bytes - sum(g.params * g.weight_bytes for g in groups)
        return per + embed / self.rank_gpus

    def linear_groups(self) -> list[Group]:
        """The model's weight groups with their stored bytes and compute dtype in this deployment."""
        return linear_groups(
            self.arch, self.weight_dtype, self.bf16_modules, set(self.gpu.peak_flops), self.quant_bytes
        )

    @property
    def model_weight_bytes(self) -> float:
        """Bytes of the whole model's weights (all ranks), as its checkpoint stores them."""
        return stored_weight_bytes(self.arch, self.linear_groups(), self.weight_dtype)


def plan_memory(dep: Deployment) -> MemoryPlan:
    """Split one GPU's memory as the instance's engine does (:mod:`simulator.memory`) and return the KV capacity.

    Raises :class:`FitError` when nothing is left for the KV cache or when the cache cannot hold one
    sequence of ``max_model_len`` tokens (the engines refuse to start in both cases).
    """
    a, k = dep.arch, dep.knobs
    gpu_bytes = dep.gpu.memory_bytes.value
    usable, activation, runtime, derives, rule, fraction = budget(dep)
    wbytes = dep.weight_bytes_per_gpu()
    kv = usable - wbytes - activation - runtime
    kvpt = kv_bytes_per_token(dep)
    need = _fit_hint(dep, wbytes, usable)
    if kv <= 0:
        raise FitError(
            f"{a.name} with {dep.weight_dtype} weights needs {dep.model_weight_bytes / 1e9:.0f} GB "
            f"of weights ({wbytes / 1e9:.1f} GB per GPU at TP={dep.tp}, PP={dep.pp}); "
            f"{dep.gpus}x {dep.gpu.name} with {gpu_bytes / 1e9:.0f} GB each leaves no memory for the KV cache "
            f"({rule}): {need}"
        )
    state, slots, state_cap = linear_state_pool(dep, kv)
    kv -= state
    blocks = int(kv // (kvpt * k.block_size))
    if k.num_gpu_blocks_override:
        # vLLM uses the override instead of the profiled number (e.g. a CPU backend's KV space); more
        # blocks than the memory left after weights and activations would fail to allocate.
        if k.num_gpu_blocks_override > blocks:
            raise FitError(
                f"engine.num_gpu_blocks_override={k.num_gpu_blocks_override} blocks of {k.block_size} tokens need "
                f"{k.num_gpu_blocks_override * k.block_size * kvpt / 1e9:,.1f} GB per GPU, but "
                f"{max(kv, 0) / 1e9:.1f} GB is left for the KV cache on {dep.gpu.name} (at most {blocks} blocks); "
                "lower it or drop it"
            )
        blocks = k.num_gpu_blocks_override
    running = sglang_max_running(blocks * k.block_size, k.max_model_len, state_cap) if derives else 0
    plan = MemoryPlan(
        gpu_bytes,
        usable,
        wbytes,
        activation,
        runtime,
        kv,
        kvpt,
        blocks,
        k.block_size,
        running,
        f"{rule} (fraction {fraction:.3f})",
        state,
        slots,
    )
    # vLLM refuses to start; SGLang and TensorRT-LLM shorten the longest request they accept instead.
    mem = cast(EngineMemory, dep.engine.memory)  # not None: budget() refuses an engine without one
    if k.max_model_len and plan.kv_tokens < k.max_model_len and mem.policy == "vllm":
        raise FitError(
            f"{a.name} on {dep.gpus}x {dep.gpu.name} (TP={dep.tp}): the KV cache holds {plan.kv_tokens} tokens, "
            f"fewer than max_model_len={k.max_model_len}; set engine.max_model_len <= {plan.kv_tokens}, "
            f"or {_kv_hint(dep, kv, kvpt)}"
        )
    return plan


def _kv_hint(dep: Deployment, kv: float, kvpt: float) -> str:
    """Fixes for a KV cache too small for max_model_len (weights fit)."""
    k = dep.knobs
    fixes = []
    fraction = memory_fraction(dep)
    if fraction < 0.95:
        fixes.append(f"raise engine.gpu_memory_utilization (now {fraction:.3g})")
    fixes.append(f"use TP x PP > {dep.gpus}")
    if dep.kv_dtype in ("bf16", "fp16"):
        fixes.append("set kv_cache_dtype: fp8")
    fixes.append("or a GPU with more memory")
    return (
        ", ".join(fixes[:-1]) + " " + fixes[-1] + " (the cache needs "
        f"{k.max_model_len * kvpt / 1e9:.1f} GB per GPU for one max_model_len sequence, "
        f"{max(kv, 0) / 1e9:.1f} GB is left after weights and activations)."
    )


def _fit_hint(dep: Deployment, wbytes: float, usable: float) -> str:
    per_gpu_full = dep.model_weight_bytes
    min_gpus = math.ceil(per_gpu_full / (0.8 * usable))
    tp_hint = 1 << max(0, (min_gpus - 1).bit_length())
    fixes = []
    fraction = memory_fraction(dep)
    if fraction < 0.95:
        fixes.append(f"raise engine.gpu_memory_utilization (now {fraction:.3g}) or")
    fixes.append(f"use TP x PP >= {tp_hint}")
    if dep.weight_dtype in ("bf16", "fp16") and "fp8" in dep.gpu.peak_flops:
        fixes.append("or fp8 weights")
    fixes.append("or a GPU with more memory")
    return " ".join(fixes) + "."
