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
fits a captured CUDA graph.  :class:`StepModel` precomputes coefficients so
that :meth:`StepModel.step_time` costs a few dozen float operations whatever
the batch size: the engine passes aggregates, never per-request lists.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

from hwdb.models import ModelArch
from hwdb.profiles import Profile
from hwdb.schema import DTYPE_BYTES, GPU, EfficiencyCurve, EngineProfile, Link
from simulator.linear_groups import Group, linear_groups, stored_weight_bytes

GiB = 2 ** 30


class FitError(ValueError):
    """A deployment does not fit its GPUs' memory; the message says what to change."""


@dataclass(frozen=True)
class EngineKnobs:
    """Engine settings of one instance, with vLLM's meanings and units."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False
    max_cudagraph_capture_size: int = 512
    max_model_len: int = 0
    num_gpu_blocks_override: int = 0


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory budget of an instance (bytes) and the KV capacity it leaves."""

    gpu_bytes: float
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    runtime_bytes: float
    kv_bytes: float
    kv_bytes_per_token: float
    kv_blocks: int
    block_size: int

    @property
    def kv_tokens(self) -> int:
        return self.kv_blocks * self.block_size


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
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    profile: Profile | None = None
    # Weight groups this checkpoint keeps in bf16 beside the LM head and router (simulator/linear_groups.py),
    # and its bytes per quantised weight when they differ from the format's default (None: the default).
    bf16_modules: frozenset[str] = frozenset()
    quant_bytes: float | None = None

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    def linear_groups(self) -> list[Group]:
        """The model's weight groups with their stored bytes and compute dtype in this deployment."""
        return linear_groups(self.arch, self.weight_dtype, self.bf16_modules, set(self.gpu.peak_flops),
                             self.quant_bytes)

    @property
    def model_weight_bytes(self) -> float:
        """Bytes of the whole model's weights (all ranks), as its checkpoint stores them."""
        return stored_weight_bytes(self.arch, self.linear_groups(), self.weight_dtype)


def kv_bytes_per_token(dep: Deployment) -> float:
    """KV bytes per token held by one GPU of the instance (MLA's latent is replicated across TP)."""
    a = dep.arch
    per_layer_elems = a.kv_elems_per_token / a.num_layers
    if not a.is_mla:
        # KV heads are split across TP ranks; with fewer heads than ranks each rank keeps one copy.
        per_layer_elems *= max(1, a.num_kv_heads // dep.tp) / a.num_kv_heads
    layers = math.ceil(a.num_layers / dep.pp)
    return per_layer_elems * layers * DTYPE_BYTES[dep.kv_dtype]


def plan_memory(dep: Deployment) -> MemoryPlan:
    """Split one GPU's memory as vLLM does and return the KV capacity.

    Raises :class:`FitError` when nothing is left for the KV cache or when the
    cache cannot hold one sequence of ``max_model_len`` tokens (vLLM refuses
    to start in both cases).
    """
    a, k = dep.arch, dep.knobs
    gpu_bytes = dep.gpu.memory_bytes.value
    usable = gpu_bytes * k.gpu_memory_utilization
    wbytes = dep.model_weight_bytes / dep.gpus
    act_elems = k.max_num_batched_tokens * (4 * a.hidden_size + 2 * (a.moe_intermediate_size or a.intermediate_size) / dep.tp)
    logits = k.max_num_seqs * a.vocab_size / dep.tp * 4.0
    activation = act_elems * 2.0 + logits
    # CUDA context, NCCL buffers and the CUDA-graph pool: not counted by torch.
    runtime = 0.75 * GiB + (0.35 * GiB if dep.tp > 1 else 0.0) + (0.0 if k.enforce_eager else 0.5 * GiB)
    kv = usable - wbytes - activation - runtime
    kvpt = kv_bytes_per_token(dep)
    need = _fit_hint(dep, wbytes, usable)
    if kv <= 0:
        raise FitError(
            f"{a.name} with {dep.weight_dtype} weights needs {dep.model_weight_bytes / 1e9:.0f} GB "
            f"of weights ({wbytes / 1e9:.1f} GB per GPU at TP={dep.tp}, PP={dep.pp}); "
            f"{dep.gpus}x {dep.gpu.name} with {gpu_bytes / 1e9:.0f} GB each and gpu_memory_utilization="
            f"{k.gpu_memory_utilization} leaves no memory for the KV cache: {need}")
    blocks = int(kv // (kvpt * k.block_size))
    if k.num_gpu_blocks_override:
        # vLLM uses the override instead of the profiled number (e.g. a CPU backend's KV space); more
        # blocks than the memory left after weights and activations would fail to allocate.
        if k.num_gpu_blocks_override > blocks:
            raise FitError(
                f"engine.num_gpu_blocks_override={k.num_gpu_blocks_override} blocks of {k.block_size} tokens need "
                f"{k.num_gpu_blocks_override * k.block_size * kvpt / 1e9:,.1f} GB per GPU, but {max(kv, 0) / 1e9:.1f} GB "
                f"is left for the KV cache on {dep.gpu.name} (at most {blocks} blocks); lower it or drop it")
        blocks = k.num_gpu_blocks_override
    plan = MemoryPlan(gpu_bytes, usable, wbytes, activation, runtime, kv, kvpt, blocks, k.block_size)
    if k.max_model_len and plan.kv_tokens < k.max_model_len:
        raise FitError(
            f"{a.name} on {dep.gpus}x {dep.gpu.name} (TP={dep.tp}): the KV cache holds {plan.kv_tokens} tokens, "
            f"fewer than max_model_len={k.max_model_len}; set engine.max_model_len <= {plan.kv_tokens}, "
            f"or {_kv_hint(dep, kv, kvpt)}")
    return plan


def _kv_hint(dep: Deployment, kv: float, kvpt: float) -> str:
    """Fixes for a KV cache too small for max_model_len (weights fit)."""
    k = dep.knobs
    fixes = []
    if k.gpu_memory_utilization < 0.9:
        fixes.append(f"raise engine.gpu_memory_utilization (now {k.gpu_memory_utilization})")
    fixes.append(f"use TP x PP > {dep.gpus}")
    if dep.kv_dtype in ("bf16", "fp16"):
        fixes.append("set kv_cache_dtype: fp8")
    fixes.append("or a GPU with more memory")
    return ", ".join(fixes[:-1]) + " " + fixes[-1] + " (the cache needs " \
        f"{k.max_model_len * kvpt / 1e9:.1f} GB per GPU for one max_model_len sequence, " \
        f"{max(kv, 0) / 1e9:.1f} GB is left after weights and activations)."


def _fit_hint(dep: Deployment, wbytes: float, usable: float) -> str:
    per_gpu_full = wbytes * dep.gpus
    min_gpus = math.ceil(per_gpu_full / (0.8 * usable))
    tp_hint = 1 << max(0, (min_gpus - 1).bit_length())
    fixes = []
    if dep.knobs.gpu_memory_utilization < 0.9:
        fixes.append(f"raise engine.gpu_memory_utilization (now {dep.knobs.gpu_memory_utilization}) or")
    fixes.append(f"use TP x PP >= {tp_hint}")
    if dep.weight_dtype in ("bf16", "fp16") and "fp8" in dep.gpu.peak_flops:
        fixes.append("or fp8 weights")
    fixes.append("or a GPU with more memory")
    return " ".join(fixes) + "."


@dataclass(frozen=True)
class StepModel:
    """Precomputed coefficients of one instance's step time.

    ``step_time(tokens, seqs_logits, attn_pairs, decode_ctx, prefill_ctx, running, waiting)``:

    * ``tokens``: new tokens this step (decodes + prefill chunk tokens);
    * ``seqs_logits``: sequences that sample a token (LM head rows);
    * ``attn_pairs``: causal query-key pairs of prefill chunks
      (a chunk of c tokens after p cached ones has c*p + c*(c+1)/2);
    * ``decode_ctx``: total context attended by decoding sequences (tokens);
    * ``prefill_ctx``: cached tokens re-read by prefill chunks.

    Returns seconds.  Kernels of different kinds run one after another, so their times add: the
    linear layers (GEMMs: the roofline max of compute and weight streaming), attention (prefill
    FLOPs, decoding sequences' KV stream), the element-wise kernels between them (norms, rotary,
    activation: memory-bound), the all-reduces, and the per-layer kernel floors.  Cost is O(1):
    independent of the batch size.
    """

    # Linear layers: every group but the LM head costs comp_a x tokens + comp_b seconds when compute
    # bound (the sum over groups of FLOPs / (peak x max_eff) x (tokens + half), each group at its own
    # dtype's peak and GEMM-shape efficiency); the LM head lm_coef x rows x (tokens + lm_half) / tokens.
    comp_a: float
    comp_b: float
    lm_coef: float
    lm_half: float
    # Prefill attention: seconds per causal query-key pair at full efficiency, and its ramp in tokens.
    attn_s_per_pair: float
    attn_half: float
    dense_weight_bytes: float
    expert_bytes: float
    n_experts: int
    experts_per_token: int
    kv_bytes_per_token: float
    act_bytes_per_token: float
    peak_bw: float
    meff: EfficiencyCurve
    mem_floor_bytes: float
    ar_msg_bytes_per_token: float
    ar_per_step: int
    ar_bw: float
    ar_latency: float
    tp: int
    pp: int
    pp_handoff_s: float
    graph_launch: float
    eager_launch: float
    max_graph_tokens: int
    graphs_mixed: bool
    overlapped: bool
    cpu_step: float
    cpu_run: float
    cpu_wait: float
    cpu_tok: float
    cpu_sample: float
    layer_s: float = 0.0
    kv_max_eff: float = 1.0
    kv_floor_bytes: float = 0.0
    # Element-wise kernels (norms, rotary, activation, MoE permutation): seconds per token.
    elem_s_per_token: float = 0.0
    # The measured all-reduce (a profile's AllReduceCurve for this TP size): message sizes (bytes) and
    # latencies (s) in CUDA graphs and eagerly; empty: the link's alpha-beta line above.
    ar_sizes: tuple[float, ...] = ()
    ar_graph: tuple[float, ...] = ()
    ar_eager: tuple[float, ...] = ()
    # (group, dtype, seconds per token, half) of each linear group: what comp_a and comp_b sum, for reports.
    compute_groups: tuple[tuple[str, str, float, float], ...] = ()

    def streamed_weight_bytes(self, tokens: int) -> float:
        """Weight bytes one rank reads in a step of ``tokens`` tokens: the dense groups and LM head, and
        the routed experts the step touches (each token picks top-k of n, independently)."""
        wbytes = self.dense_weight_bytes
        if self.n_experts:
            touched = self.n_experts * (1.0 - (1.0 - self.experts_per_token / self.n_experts) ** tokens)
            wbytes += self.expert_bytes * touched
        return wbytes

    def allreduce_time(self, message_bytes: float, graph: bool = True) -> float:
        """One tensor-parallel all-reduce of ``message_bytes``: the measured curve where the profile has
        one (in a CUDA graph or eager), else a ring over the intra-node link."""
        if self.tp <= 1:
            return 0.0
        if self.ar_sizes:
            return interp_linear(self.ar_sizes, self.ar_graph if graph else self.ar_eager, message_bytes)
        return 2.0 * (self.tp - 1) / self.tp * message_bytes / self.ar_bw + self.ar_latency

    def linear_time(self, tokens: int, seqs_logits: int = 0, prefill_ctx: float = 0.0) -> tuple[float, float]:
        """(compute, memory) time of the step's linear layers: the two sides of their roofline."""
        t_comp = self.comp_a * tokens + self.comp_b
        if seqs_logits:
            # The LM head's rows ride the step's ramp (its GEMM runs beside the step's others, never alone).
            t_comp += self.lm_coef * seqs_logits * (tokens + self.lm_half) / tokens
        wbytes = self.streamed_weight_bytes(tokens)
        # Pipeline stages: each of the pp micro-batches in flight re-reads its stage's weights, so one
        # token pays every stage's weight stream in series (pp x this rank's share), while compute
        # splits across micro-batches; pipelining raises throughput, never single-sequence speed.
        nbytes = (wbytes * self.pp + self.kv_bytes_per_token * (prefill_ctx + tokens)
                  + self.act_bytes_per_token * tokens)
        # The memory curve was fitted per kernel: each linear kernel pays its own floor (half).
        return t_comp, (nbytes + self.mem_floor_bytes) / (self.peak_bw * self.meff.max_eff)

    def attention_time(self, tokens: int, attn_pairs: float, decode_ctx: float) -> float:
        """Prefill attention FLOPs (bf16, ramp in the step's tokens) plus the decode KV stream at the
        decode-attention curve, one kernel per layer: sum over layers of (bytes + half) / (BW x max_eff)."""
        t = attn_pairs * self.attn_s_per_pair * (tokens + self.attn_half) / tokens if attn_pairs > 0.0 else 0.0
        if decode_ctx > 0.0:
            t += (self.kv_bytes_per_token * decode_ctx + self.kv_floor_bytes) / (self.peak_bw * self.kv_max_eff)
        return t

    def step_time(self, tokens: int, seqs_logits: int, attn_pairs: float,
                  decode_ctx: float, prefill_ctx: float = 0.0, running: int = 0, waiting: int = 0) -> float:
        if tokens <= 0:
            return 0.0
        t_comp, t_mem = self.linear_time(tokens, seqs_logits, prefill_ctx)
        t = ((t_comp if t_comp > t_mem else t_mem) + self.attention_time(tokens, attn_pairs, decode_ctx)
             + self.elem_s_per_token * tokens + self.layer_s)
        graph = tokens <= self.max_graph_tokens and (self.graphs_mixed or attn_pairs == 0.0)
        if self.tp > 1:
            t += self.ar_per_step * self.allreduce_time(self.ar_msg_bytes_per_token * tokens, graph)
        if self.pp > 1:
            t += (self.pp - 1) * self.pp_handoff_s
        t += self.graph_launch if graph else self.eager_launch
        cpu = (self.cpu_step + self.cpu_run * running + self.cpu_wait * waiting + self.cpu_tok * tokens
               + self.cpu_sample * seqs_logits)
        if self.overlapped:
            return t if t > cpu else cpu     # the next step is prepared while the GPU runs this one
        return t + cpu

    def prefill_time(self, prompt: int, chunk: int = 0) -> float:
        """Time to prefill ``prompt`` tokens alone, in chunks of ``chunk`` tokens (0 = one step)."""
        chunk = chunk or prompt
        t, done = 0.0, 0
        while done < prompt:
            c = min(chunk, prompt - done)
            last = 1 if done + c == prompt else 0
            t += self.step_time(c, last, c * done + c * (c + 1) / 2, 0.0, done, 1, 0)
            done += c
        return t

    def decode_time(self, batch: int, context: int) -> float:
        """Time of a decode-only step for ``batch`` sequences of ``context`` tokens each."""
        return self.step_time(batch, batch, 0.0, float(batch * context), 0.0, batch, 0)


def interp_linear(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """``ys`` at ``x``, linear between the points of increasing ``xs``; the first value below them,
    the last segment's line above them (O(log n))."""
    i = bisect_left(xs, x)
    if i == 0:
        return ys[0]
    if i == len(xs):
        i -= 1
    x0, y0 = xs[i - 1], ys[i - 1]
    return y0 + (x - x0) * (ys[i] - y0) / (xs[i] - x0)


def regime(model: StepModel, tokens: int, seqs_logits: int, attn_pairs: float,
           decode_ctx: float, prefill_ctx: float = 0.0) -> str:
    """'compute' or 'memory': which roofline side bounds this step's linear layers and attention
    (prefill attention counted with compute, the decode KV stream with memory)."""
    t_comp, t_mem = model.linear_time(tokens, seqs_logits, prefill_ctx)
    t_comp += model.attention_time(tokens, attn_pairs, 0.0)
    t_mem += model.attention_time(tokens, 0.0, decode_ctx)
    return "compute" if t_comp > t_mem else "memory"
