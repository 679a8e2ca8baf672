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
from dataclasses import dataclass

from hwdb.models import ModelArch
from hwdb.profiles import Profile
from simulator.gemm_shapes import shape_curves
from hwdb.schema import COMPUTE_DTYPE, DTYPE_BYTES, GPU, WEIGHT_BYTES, EfficiencyCurve, EngineProfile, Link

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

    @property
    def gpus(self) -> int:
        return self.tp * self.pp


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
    wbytes = a.total_params * WEIGHT_BYTES[dep.weight_dtype] / dep.gpus
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
            f"{a.name} with {dep.weight_dtype} weights needs {a.total_params * WEIGHT_BYTES[dep.weight_dtype] / 1e9:.0f} GB "
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

    ``step_time(tokens, seqs_logits, attn_pairs, kv_read_tokens)``:

    * ``tokens``: new tokens this step (decodes + prefill chunk tokens);
    * ``seqs_logits``: sequences that sample a token (LM head rows);
    * ``attn_pairs``: causal query-key pairs of prefill chunks
      (a chunk of c tokens after p cached ones has c*p + c*(c+1)/2);
    * ``decode_ctx``: total context attended by decoding sequences (tokens);
    * ``prefill_ctx``: cached tokens re-read by prefill chunks.

    Returns seconds.  Cost is O(1): independent of the batch size.
    """

    lin_flops_per_token: float
    lm_head_flops_per_seq: float
    expert_flops_per_token: float
    attn_flops_per_pair: float
    dense_weight_bytes: float
    expert_bytes: float
    n_experts: int
    experts_per_token: int
    kv_bytes_per_token: float
    act_bytes_per_token: float
    peak_flops: float
    peak_bw: float
    ceff: EfficiencyCurve
    meff: EfficiencyCurve
    mem_floor_bytes: float
    aeff: EfficiencyCurve
    ar_bytes_per_token: float
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
    # Routed-expert GEMMs: their own peak fraction (per-expert weight shapes) and M ramp in step tokens.
    expert_max_eff: float = 1.0
    expert_half: float = 0.0

    def step_time(self, tokens: int, seqs_logits: int, attn_pairs: float,
                  decode_ctx: float, prefill_ctx: float = 0.0, running: int = 0, waiting: int = 0) -> float:
        if tokens <= 0:
            return 0.0
        ce = self.ceff
        lin = self.lin_flops_per_token * tokens + self.lm_head_flops_per_seq * seqs_logits
        t_comp = lin / (self.peak_flops * ce.max_eff * tokens / (tokens + ce.half))
        if self.expert_flops_per_token:
            t_comp += self.expert_flops_per_token * (tokens + self.expert_half) / (self.peak_flops * self.expert_max_eff)
        if attn_pairs > 0.0:
            ae = self.aeff
            t_comp += attn_pairs * self.attn_flops_per_pair / (self.peak_flops * ae.max_eff * tokens / (tokens + ae.half))
        wbytes = self.dense_weight_bytes
        if self.n_experts:
            touched = self.n_experts * (1.0 - (1.0 - self.experts_per_token / self.n_experts) ** tokens)
            wbytes += self.expert_bytes * touched
        # Pipeline stages: each of the pp micro-batches in flight re-reads its stage's weights, so one
        # token pays every stage's weight stream in series (pp x this rank's share), while compute
        # splits across micro-batches; pipelining raises throughput, never single-sequence speed.
        nbytes = (wbytes * self.pp + self.kv_bytes_per_token * (prefill_ctx + tokens)
                  + self.act_bytes_per_token * tokens)
        me = self.meff
        # The memory curve was fitted per kernel: each linear kernel pays its own floor (half).
        t_mem = (nbytes + self.mem_floor_bytes) / (self.peak_bw * me.max_eff)
        if decode_ctx > 0.0:
            # Decode attention streams the KV cache at the decode-attention curve, one kernel per layer:
            # sum over layers of (bytes + half) / (BW * max_eff).
            t_mem += (self.kv_bytes_per_token * decode_ctx + self.kv_floor_bytes) / (self.peak_bw * self.kv_max_eff)
        t = (t_comp if t_comp > t_mem else t_mem) + self.layer_s
        if self.tp > 1:
            t += self.ar_per_step * (self.ar_bytes_per_token * tokens / self.ar_bw + self.ar_latency)
        if self.pp > 1:
            t += (self.pp - 1) * self.pp_handoff_s
        if tokens <= self.max_graph_tokens and (self.graphs_mixed or attn_pairs == 0.0):
            t += self.graph_launch
        else:
            t += self.eager_launch
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


def build_step_model(dep: Deployment) -> StepModel:
    """Coefficients for :class:`StepModel` from a deployment (profile overrides GPU defaults)."""
    a, g, prof = dep.arch, dep.gpu, dep.profile
    gpus = dep.gpus
    wb = WEIGHT_BYTES[dep.weight_dtype]
    ceff = (prof.compute_efficiency if prof and prof.compute_efficiency else g.compute_efficiency)
    meff = (prof.memory_efficiency if prof and prof.memory_efficiency else g.memory_efficiency)
    aeff = (prof.attention_prefill_efficiency if prof and prof.attention_prefill_efficiency else ceff)
    # Decode attention's KV stream: its own fitted curve where a profile has one, else the GEMM memory curve.
    deff = (prof.attention_decode_efficiency if prof and prof.attention_decode_efficiency else meff)
    expert_total = a.moe_layers * a.num_experts * a.expert_params if a.is_moe else 0
    # The input embedding is a gather of a few rows per step, not a stream of the table.
    streamed_embed = 0 if a.tie_embeddings else a.embedding_params
    dense_params = a.total_params - expert_total - streamed_embed
    compute_dtype = COMPUTE_DTYPE.get(dep.weight_dtype, dep.weight_dtype)
    compute_dtype = compute_dtype if compute_dtype in g.peak_flops else "bf16"
    if compute_dtype in ("fp8", "fp4") and prof and prof.compute_efficiency_fp8:
        # The fp8 GEMM fit's large ramp (half ~120-170 tokens) is the kernel's fixed cost (activation
        # quantisation) charged per FLOP, which would make a batch-1 decode compute-bound and shrink
        # with TP; that cost is per kernel, carried by the engine's per-layer overhead, so fp8 keeps
        # its peak efficiency with the bf16 ramp.  fp4 GEMMs have no table: fp8's efficiency.
        ceff = type(ceff)(max_eff=prof.compute_efficiency_fp8.max_eff, half=min(ceff.half, prof.compute_efficiency_fp8.half),
                          source=prof.compute_efficiency_fp8.source, empirical=True)
    shape = prof.gemm_shape_efficiency.get(compute_dtype) if prof else None
    expert_flops, expert_max, expert_half = 0.0, 1.0, 0.0
    if shape is not None:
        # Measured kernels by weight shape: each deployment's own per-rank slices set its efficiency.
        ceff, expert_max, expert_half = shape_curves(shape, a, dep.tp)
        if a.is_moe:
            expert_flops = 2.0 * a.moe_layers * a.experts_per_token * a.expert_params / gpus
    eng = dep.engine
    eager = eng.eager_launch_s_per_layer.value * math.ceil(a.num_layers / dep.pp)
    graph = eng.graph_launch_s.value
    cpu = eng.cpu
    cpu_costs = [cpu.step_s.value, cpu.per_running_seq_s.value, cpu.per_waiting_seq_s.value,
                 cpu.per_token_s.value, cpu.per_sampled_seq_s.value]
    scale = eng.layer_overhead_scale.get(g.name)
    layer_s = ((eng.layer_overhead_s.value * a.num_layers if eng.layer_overhead_s else 0.0)
               + (eng.moe_layer_overhead_s.value * a.moe_layers if eng.moe_layer_overhead_s else 0.0)) \
        * (scale.value if scale is not None else 1.0)
    if prof is not None and prof.step_overhead_s is not None:
        # A calibrated per-step overhead (a harness fit on the real server) replaces the engine's launch,
        # CPU and per-layer defaults: it measured all of them at once.
        graph = eager = prof.step_overhead_s
        cpu_costs = [0.0] * 5
        layer_s = 0.0
    return StepModel(
        lin_flops_per_token=2.0 * a.linear_params_per_token / gpus - expert_flops,
        expert_flops_per_token=expert_flops, expert_max_eff=expert_max, expert_half=expert_half,
        lm_head_flops_per_seq=2.0 * a.lm_head_params / dep.tp,
        attn_flops_per_pair=4.0 * a.num_layers * a.attn_dim / gpus,
        dense_weight_bytes=dense_params * wb / gpus,
        expert_bytes=(a.moe_layers * a.expert_params * wb / gpus) if a.is_moe else 0.0,
        n_experts=a.num_experts,
        experts_per_token=a.experts_per_token,
        kv_bytes_per_token=kv_bytes_per_token(dep),
        act_bytes_per_token=4.0 * a.hidden_size * 2.0 * a.num_layers / dep.pp,
        peak_flops=g.flops(compute_dtype),
        peak_bw=g.memory_bandwidth_Bps.value,
        ceff=ceff, meff=meff, aeff=aeff,
        # A token crosses every stage, so it pays every layer's kernel floors and all-reduces in series.
        mem_floor_bytes=4 * a.num_layers * meff.half,
        ar_bytes_per_token=2.0 * (dep.tp - 1) / dep.tp * a.hidden_size * 2.0,
        ar_per_step=2 * a.num_layers,
        ar_bw=dep.intra_link.effective_Bps,
        ar_latency=dep.intra_link.latency_s.value,
        tp=dep.tp, pp=dep.pp,
        pp_handoff_s=dep.intra_link.latency_s.value,
        graph_launch=graph,
        eager_launch=eager,
        max_graph_tokens=0 if dep.knobs.enforce_eager else dep.knobs.max_cudagraph_capture_size,
        graphs_mixed=eng.graphs_for_mixed_batches,
        overlapped=eng.scheduling_overlapped,
        cpu_step=cpu_costs[0], cpu_run=cpu_costs[1], cpu_wait=cpu_costs[2], cpu_tok=cpu_costs[3],
        cpu_sample=cpu_costs[4],
        # Every layer runs in series for a token, whatever the pipeline split.
        layer_s=layer_s,
        kv_max_eff=deff.max_eff,
        kv_floor_bytes=a.num_layers * deff.half,
    )


def regime(model: StepModel, tokens: int, seqs_logits: int, attn_pairs: float,
           decode_ctx: float, prefill_ctx: float = 0.0) -> str:
    """'compute' or 'memory': which roofline side bounds this step."""
    m = model
    lin = m.lin_flops_per_token * tokens + m.lm_head_flops_per_seq * seqs_logits
    t_comp = lin / (m.peak_flops * m.ceff.at(tokens)) + attn_pairs * m.attn_flops_per_pair / (m.peak_flops * m.aeff.at(tokens))
    if m.expert_flops_per_token:
        t_comp += m.expert_flops_per_token * (tokens + m.expert_half) / (m.peak_flops * m.expert_max_eff)
    wbytes = m.dense_weight_bytes + (m.expert_bytes * m.n_experts * (1 - (1 - m.experts_per_token / m.n_experts) ** tokens)
                                     if m.n_experts else 0.0)
    nbytes = wbytes * m.pp + m.kv_bytes_per_token * (prefill_ctx + tokens) + m.act_bytes_per_token * tokens
    t_mem = (nbytes + m.mem_floor_bytes) / (m.peak_bw * m.meff.max_eff)
    if decode_ctx > 0.0:
        t_mem += (m.kv_bytes_per_token * decode_ctx + m.kv_floor_bytes) / (m.peak_bw * m.kv_max_eff)
    return "compute" if t_comp > t_mem else "memory"
