"""How much of a GPU each engine leaves for the KV cache, and how many requests it then runs at once.

One policy per engine (``POLICIES``, chosen by the engine profile's ``memory.policy``), each with the
release-by-release terms of its profile (:class:`hwdb.engine_schema.EngineMemory`):

* ``vllm``: ``visible x gpu_memory_utilization - weights - activation peak - non-torch memory - graphs``.
  The activation peak is what vLLM's profiling run allocates: a forward of ``max_num_batched_tokens``
  tokens and a sampler over ``max_num_seqs`` rows of float32 logits (several copies of them before the
  release that moved top-k/top-p into one kernel); the CUDA-graph pool comes out of the budget only from
  the release that estimates it.  vLLM takes the smallest budget over its workers, the last pipeline
  stage's, which holds the sampler.
* ``sglang``: ``mem_fraction_static x free memory before the weights load - weights``; the fraction,
  when not given, is SGLang's own rule for the release (what it reserves for activations and CUDA graphs
  grows with the chunk size, the largest graph batch and the GPUs per rank), and
  ``max_running_requests`` follows from the token count.  A model with a vision tower gets SGLang's smaller
  fraction for multimodal models, and a linear-attention model's recurrent state takes its own pool out of
  the KV budget, whose slots also cap the running requests (:func:`linear_state_pool`).  vLLM's hybrid
  allocator (the state in blocks of the KV pool itself) is not modelled: there the state is not charged.
* ``trtllm``: ``free_gpu_memory_fraction x (visible - weights - the estimation pass's peak)``.

All sizes are bytes per GPU; ``visible`` is the device total CUDA reports (``GPU.visible_bytes``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from hwdb.engine_schema import EngineMemory, MemoryRelease
from hwdb.schema import DTYPE_BYTES
from simulator.kv_rule import release_key
from simulator.registry import Registry

if TYPE_CHECKING:
    from simulator.perf import Deployment

GiB = 2**30
MiB = 2**20


class FitError(ValueError):
    """A deployment does not fit its GPUs' memory; the message says what to change."""


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory budget of an instance (bytes) and the KV capacity it leaves.

    ``max_running``: the engine's own cap on running requests derived from its memory (SGLang's
    default ``max_running_requests``), 0 where the engine has none; ``rule``: how it was sized."""

    gpu_bytes: float
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    runtime_bytes: float
    kv_bytes: float
    kv_bytes_per_token: float
    kv_blocks: int
    block_size: int
    max_running: int = 0
    rule: str = ""
    # The linear-attention state pool (bytes per GPU, sequences it holds); 0 where there is none.
    state_bytes: float = 0.0
    state_slots: int = 0

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size


def kv_bytes_per_token(dep: Deployment) -> float:
    """KV bytes per token held by one GPU of the instance (MLA's latent is replicated across TP)."""
    a = dep.arch
    per_layer_elems = a.kv_elems_per_token / a.num_layers
    if not a.is_mla:
        # KV heads are split across TP ranks; with fewer heads than ranks each rank keeps one copy.
        per_layer_elems *= max(1, a.num_kv_heads // dep.tp) / a.num_kv_heads
    layers = math.ceil(a.num_layers / dep.pp)
    return per_layer_elems * layers * DTYPE_BYTES[dep.kv_dtype]


def terms(memory: EngineMemory, release: str) -> MemoryRelease:
    """The terms in force at ``release``: every entry since which it runs, later ones winning."""
    key = release_key(release)
    out: dict = {}
    for r in memory.releases:
        if release_key(r.since) <= key:
            out.update({k: v for k, v in r.model_dump().items() if v is not None})
    return MemoryRelease.model_validate(out)


def _v(fig, default: float = 0.0) -> float:
    return default if fig is None else fig.value


def activation_bytes(dep: Deployment, t: MemoryRelease, tokens: int, seqs: int) -> float:
    """The profiling pass's peak: a floor, the forward's hidden states for ``tokens`` tokens, the float32
    logits of ``seqs`` rows over the whole vocabulary (gathered on every TP rank) and, for MoE models,
    the routing buffers."""
    a = dep.arch
    return (
        _v(t.activation_base_bytes)
        + _v(t.activation_per_token_hidden) * tokens * a.hidden_size * 2.0
        + _v(t.sampler_copies) * seqs * a.vocab_size * 4.0
        + (_v(t.moe_bytes) if a.is_moe else 0.0)
    )


def non_torch_bytes(dep: Deployment, t: MemoryRelease) -> float:
    return _v(t.non_torch_tp_bytes) if dep.tp > 1 else _v(t.non_torch_bytes)


class VllmMemory:
    """vLLM's ``determine_available_memory``: the profiled budget under ``gpu_memory_utilization``."""

    name = "vllm"

    def plan(self, dep: Deployment, t: MemoryRelease, fraction: float) -> tuple[float, float, float, int, str]:
        k = dep.knobs
        usable = dep.gpu.visible_bytes * fraction
        act = activation_bytes(dep, t, k.max_num_batched_tokens, min(k.max_num_seqs, k.max_num_batched_tokens))
        runtime = non_torch_bytes(dep, t) + (0.0 if k.enforce_eager else _v(t.graph_bytes))
        # The hybrid allocator keeps a linear-attention model's state in blocks of the KV pool: not modelled, said.
        gap = (
            "; linear-attention state not charged (vLLM's hybrid allocator is not modelled)"
            if dep.arch.num_linear_layers
            else ""
        )
        return (
            usable,
            act,
            runtime,
            0,
            f"vLLM: {fraction:g} of {dep.gpu.visible_bytes / GiB:.2f} GiB - weights - "
            f"profiled activations - non-torch memory{gap}",
        )


def sglang_fraction(dep: Deployment, release: str) -> float:
    """SGLang's default ``mem_fraction_static`` (server_args.py) for this GPU, layout and release.

    0.5.3 on: what it keeps back is 512 MiB + 1.5 MiB per token of the prefill chunk (at least 2,048)
    + 2 MiB per sequence of the largest CUDA-graph batch + 1 GiB per 8 GPUs of a rank, plus 3 MiB (4.5
    above 300 sequences) per graph sequence and DP rank under attention DP, and at least 10 GiB on GPUs
    over 60 GiB.  0.4.8 to 0.5.2: a fixed reserve by GPU size.  Before: a table by TP size."""
    k, key = dep.knobs, release_key(release)
    gpu_mib = dep.gpu.visible_bytes / MiB
    ranks = dep.tp * dep.pp
    if key >= (0, 5, 3):
        bs = k.max_cudagraph_capture_size
        reserve = 512 + 1.5 * max(k.max_num_batched_tokens, 2048) + 2 * bs + 1024 * ranks / 8
        if dep.dp > 1:
            reserve += (4.5 if bs > 300 else 3.0) * bs * dep.dp
        if gpu_mib > 60 * 1024:
            reserve = max(reserve, 10 * 1024)
        return (gpu_mib - reserve) / gpu_mib * vision_factor(dep)
    if key >= (0, 4, 8):
        gib = gpu_mib / 1024
        reserve = (
            2.8 + ranks / 10 if gib < 35 else 9.5 + ranks / 2 if gib <= 90 else 12 + ranks / 2 if gib <= 160 else 32
        ) + (4 if dep.dp > 1 else 0)
        return (gib - reserve) / gib * vision_factor(dep)
    return (
        0.88 if ranks < 2 else 0.87 if ranks < 4 else 0.85 if ranks < 8 else 0.81 if ranks < 16 else 0.79
    ) * vision_factor(dep)


def vision_factor(dep: Deployment) -> float:
    """SGLang's ``adjust_mem_fraction_for_vlm`` (server_args.py, read in 0.5.9 and 0.5.10; assumed before): a model
    with a vision tower keeps 0.95 x (1 - 0.1 x (its size over a 24-layer, 1024-wide ViT - 1), within 0.8-1.05)
    of the static fraction, the rest left for image processing; 1 without one."""
    a = dep.arch
    if not a.vision_layers:
        return 1.0
    ratio = a.vision_layers * a.vision_hidden**2 / (24 * 1024**2)
    return 0.95 * min(1.05, max(0.8, 1.0 - 0.1 * (ratio - 1.0)))


class SglangMemory:
    """SGLang's ``profile_max_num_token``: the static fraction of the memory free before the weights load,
    less the weights; its activations and CUDA graphs live in the rest."""

    name = "sglang"

    def plan(self, dep: Deployment, t: MemoryRelease, fraction: float) -> tuple[float, float, float, int, str]:
        before = dep.gpu.visible_bytes - non_torch_bytes(dep, t)
        return (
            before * fraction,
            0.0,
            0.0,
            1,
            f"SGLang: mem_fraction_static {fraction:.3f} of the {before / GiB:.2f} GiB free before loading - weights",
        )


class TrtllmMemory:
    """TensorRT-LLM's KV-cache estimate: ``free_gpu_memory_fraction`` of what the estimation pass leaves."""

    name = "trtllm"

    def plan(self, dep: Deployment, t: MemoryRelease, fraction: float) -> tuple[float, float, float, int, str]:
        k = dep.knobs
        act = activation_bytes(dep, t, k.max_num_batched_tokens, k.max_num_seqs)
        runtime = non_torch_bytes(dep, t) + (0.0 if k.enforce_eager else _v(t.graph_bytes))
        free = dep.gpu.visible_bytes - dep.weight_bytes_per_gpu() - act - runtime
        # Expressed as the vLLM-like split: usable = what the weights and the fraction of the rest leave.
        usable = dep.weight_bytes_per_gpu() + act + runtime + fraction * max(free, 0.0)
        return (
            usable,
            act,
            runtime,
            0,
            f"TensorRT-LLM: free_gpu_memory_fraction {fraction:g} of the "
            f"{max(free, 0.0) / GiB:.2f} GiB the estimation pass leaves",
        )


class MemoryPolicy(Protocol):
    """One engine's rule: ``plan`` gives (usable, activation, runtime bytes per GPU, whether it derives
    max_running (1/0), the rule in words) for a deployment, its release's terms and the memory fraction."""

    name: str

    def plan(self, dep: Deployment, t: MemoryRelease, fraction: float) -> tuple[float, float, float, int, str]: ...


# Keyed by an engine profile's memory.policy (a Literal hwdb's schema checks on loading).
POLICIES: Registry[MemoryPolicy] = Registry(
    "memory policy", (VllmMemory(), SglangMemory(), TrtllmMemory()), plural="memory policies"
)


def budget(dep: Deployment) -> tuple[float, float, float, int, str, float]:
    """(usable, activation, runtime, derives max_running, rule, fraction) for ``dep``'s engine and release."""
    mem = dep.engine.memory
    if mem is None:
        raise FitError(f"engine profile {dep.engine.name} has no memory block; add one (hwdb/data/engines)")
    t = terms(mem, dep.release)
    fraction = dep.knobs.gpu_memory_utilization
    if fraction is None:
        fraction = sglang_fraction(dep, dep.release) if mem.policy == "sglang" else _v(t.default_fraction, 0.9)
    return (*POLICIES[mem.policy].plan(dep, t, fraction), fraction)


def sglang_max_running(tokens: int, context_len: int, state_cap: int = 0) -> int:
    """SGLang's default ``max_running_requests`` per rank: half the KV tokens, at most the request pool
    (512 requests per full context the pool holds, 2,048 to 4,096, and at most ``state_cap``, what the
    linear-attention state pool allows, where there is one)."""
    pool = min(max(int(tokens / max(context_len, 1) * 512), 2048), 4096)
    if state_cap:
        pool = min(pool, state_cap)
    return max(1, min(tokens // 2, pool))


def linear_state_bytes_per_seq(dep: Deployment) -> float:
    """One sequence's linear-attention state on one GPU: its pipeline stage's share of the layers, the delta-rule
    state in the checkpoint's ``mamba_ssm_dtype`` (float32 by default in SGLang) and the convolution tail in bf16."""
    a = dep.arch
    layers = math.ceil(a.num_linear_layers / dep.pp)
    return a.linear_state_bytes(dep.tp, layers, DTYPE_BYTES[a.linear_ssm_dtype or "fp32"], DTYPE_BYTES["bf16"])


def linear_state_pool(dep: Deployment, kv_bytes: float) -> tuple[float, int, int]:
    """(bytes per GPU, slots, running-request cap) of the linear-attention state pool the engine carves out of
    ``kv_bytes``, what its weights and reserves leave: SGLang's ``handle_max_mamba_cache`` gives the state
    ``r / (1 + r)`` of it (``linear_state_ratio``) in whole slots of one sequence's state, and runs at most
    slots // ``linear_state_running_ratio`` requests with the radix cache on (all slots with it off).
    (0, 0, 0) for a model without linear-attention layers or an engine release without such a pool."""
    mem = dep.engine.memory
    if not dep.arch.num_linear_layers or mem is None:
        return 0.0, 0, 0
    t = terms(mem, dep.release)
    if t.linear_state_ratio is None:
        return 0.0, 0, 0
    per_seq = linear_state_bytes_per_seq(dep)
    r = t.linear_state_ratio.value
    slots = int(max(kv_bytes, 0.0) * r / (1.0 + r) // per_seq)
    per_request = _v(t.linear_state_running_ratio, 1.0) if dep.knobs.prefix_caching else 1.0
    cap = int(slots // per_request)
    if cap < 1:
        raise FitError(
            f"{dep.arch.name} on {dep.gpu.name} (TP={dep.tp}, PP={dep.pp}): {dep.engine.name} sets "
            f"{r / (1.0 + r):.0%} of the {max(kv_bytes, 0.0) / GiB:.2f} GiB left after the weights aside for "
            f"linear-attention state, {slots} slot(s) of {per_seq / 2**20:.1f} MiB, too few to run one request "
            f"({per_request:g} slots each with the prefix cache on); use more GPUs per instance (TP), a GPU with more "
            f"memory, or disable the prefix cache"
        )
    return slots * per_seq, slots, cap


def memory_fraction(dep: Deployment) -> float:
    """The fraction the engine runs with: the pool's setting, else the release's default (SGLang's own rule),
    what a generated serve line passes so that the real engine sizes its cache as simulated."""
    return budget(dep)[5]
