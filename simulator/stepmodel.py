"""The step-time model of one serving instance (or one attention data-parallel rank): :class:`StepModel`.

A step processes ``tokens`` new tokens (one per decoding sequence plus the prefill chunks scheduled in
it).  Kernels of different kinds run one after another, so their times add:

* the dense linear layers (attention projections, dense and shared-expert MLPs, router, LM head): the
  roofline max of their FLOPs over each weight group's peak x GEMM efficiency and of this rank's
  weights, activations and new KV over HBM bandwidth x the memory curve;
* the routed experts: the same roofline over the experts the step's tokens touch; under attention data
  parallelism the experts serve every rank's tokens, so this part depends on the whole group's step;
* attention: prefill FLOPs at the bf16 peak, the decoding sequences' KV stream at its own curve;
* element-wise kernels (norms, rotary, activation, MoE partial outputs);
* tensor-parallel all-reduces (the profile's measured curve, else a ring over the link), the MoE
  layers' token exchange across ranks, pipeline hand-offs, per-layer kernel floors and launches;

and the host's work per step overlaps the GPU's when the engine schedules ahead.  Coefficients are
precomputed (:mod:`simulator.step_build`) so that a step costs a few dozen float operations whatever the
batch size: the engine passes aggregates, never per-request lists.  The terms are computed by
:mod:`simulator.step_closures`, the step cost's only implementation, which the methods below and the
engine's step loop call.  SI units throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from hwdb.schema import EfficiencyCurve
from simulator.step_closures import StepCost, step_cost


@dataclass(frozen=True)
class StepModel:
    """Precomputed coefficients of one instance's (one rank's) step time.

    ``step_time(tokens, seqs_logits, attn_pairs, decode_ctx, prefill_ctx, running, waiting)``:

    * ``tokens``: new tokens this step (decodes + prefill chunk tokens);
    * ``seqs_logits``: sequences that sample a token (LM head rows);
    * ``attn_pairs``: causal query-key pairs of prefill chunks
      (a chunk of c tokens after p cached ones has c*p + c*(c+1)/2);
    * ``decode_ctx``: total context attended by decoding sequences (tokens);
    * ``prefill_ctx``: cached tokens re-read by prefill chunks.

    Returns seconds.  A data-parallel rank stepping with its group uses :meth:`local_time` and the
    group adds :meth:`moe_time` of all ranks' tokens (:mod:`simulator.engine.dp_group`).
    """

    # Dense linear layers: compute-bound time comp_a x tokens + comp_b (the sum over weight groups of
    # FLOPs / (peak x max_eff) x (tokens + half)); the LM head lm_coef x rows x (tokens + lm_half) / tokens.
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
    # Element-wise kernels (norms, rotary, activation, MoE partial outputs): seconds per token.
    elem_s_per_token: float = 0.0
    # The measured all-reduce (a profile's AllReduceCurve for this TP size): message sizes (bytes) and
    # latencies (s) in CUDA graphs and eagerly; empty: the link's alpha-beta line.
    ar_sizes: tuple[float, ...] = ()
    ar_graph: tuple[float, ...] = ()
    ar_eager: tuple[float, ...] = ()
    # (group, dtype, seconds per token, half) of each linear group, the routed experts' included: for reports.
    compute_groups: tuple[tuple[str, str, float, float], ...] = ()
    # Routed experts: compute-bound time exp_a x routed tokens + exp_b; their weights stream at the memory
    # curve.  Routed tokens are the whole data-parallel group's: moe_token_scale x a rank's own when a rank
    # is priced alone (ranks balanced).  Each MoE layer exchanges a rank's tokens across the instance
    # (moe_comm_s_per_token x tokens + moe_comm_lat_s; simulator/step_build.moe_exchange).
    exp_a: float = 0.0
    exp_b: float = 0.0
    moe_token_scale: int = 1
    # Attention DP: True, every rank's MoE layers see the busiest rank's token count from each rank (vLLM
    # pads them, num_tokens_across_dp); False, the ranks' own tokens summed (an all-to-all dispatch sends only
    # what each rank has: SGLang's DeepEP, TensorRT-LLM's allgatherv; simulator/engine/dp_group.py).
    moe_pads_dp: bool = True
    moe_comm_s_per_token: float = 0.0
    moe_comm_lat_s: float = 0.0
    moe_layers: int = 0
    # More fixed time in a step that carries a prompt chunk (attn_pairs > 0) than in a decode-only step.
    prefill_step_s: float = 0.0
    # The measured fused-MoE kernel (hwdb/moe.py) where the GPU and engine have one: the experts' weights
    # stream at exp_mem_eff (0: the memory curve's peak fraction), and every MoE layer adds its fixed cost,
    # its per-routed-token permutation and top-k sum, and a set-up cost per touched expert (whole step).
    exp_mem_eff: float = 0.0
    exp_fixed_s: float = 0.0
    exp_s_per_token: float = 0.0
    exp_s_per_expert: float = 0.0
    # All-reduces of a few bytes per token besides the hidden-state ones (a whole-projection q/k norm's
    # variances at TP > 1): their count per step and their message bytes per token.
    ar_small_per_step: int = 0
    ar_small_bytes_per_token: float = 0.0
    # Linear-attention layers' own kernels (hwdb/gdn.py), summed over those layers for this GPU's heads: a step
    # with prompt tokens adds lin_ctx_fixed_s + lin_ctx_seq_s x the longest chunk + lin_ctx_prompt_s x chunks
    # + lin_ctx_tok_s x prompt tokens; a step with decodes adds lin_gen_fixed_s + lin_gen_seq_s x decodes.
    lin_ctx_fixed_s: float = 0.0
    lin_ctx_seq_s: float = 0.0
    lin_ctx_prompt_s: float = 0.0
    lin_ctx_tok_s: float = 0.0
    lin_gen_fixed_s: float = 0.0
    lin_gen_seq_s: float = 0.0
    # MLA attention measured apart (hwdb/mla.py; 0: the curves above).  Prefill: mla_fixed_s + mla_prompt_s x
    # chunks + max(mla_seq_s x longest chunk, pairs x mla_pair_s / ramps in chunk length and tokens); decode:
    # kv_floor_bytes holds the fixed cost, and the KV stream is the larger of its bytes and its FLOPs
    # (kv_comp_s_per_ctx x cached tokens), plus kv_seq_s per decoding sequence.
    mla_fixed_s: float = 0.0
    mla_prompt_s: float = 0.0
    mla_seq_s: float = 0.0
    mla_pair_s: float = 0.0
    mla_half_len: float = 0.0
    mla_half_tok: float = 0.0
    kv_comp_s_per_ctx: float = 0.0
    kv_seq_s: float = 0.0
    # DeepSeek-sparse-attention lightning indexer (hwdb/mla.py MlaIndexer): a step with decodes adds
    # dsa_fixed_s + dsa_seq_s x decoding sequences + dsa_ctx_s x their cached tokens.
    dsa_fixed_s: float = 0.0
    dsa_seq_s: float = 0.0
    dsa_ctx_s: float = 0.0
    # True when the MLA, indexer or linear-attention kernels above are in use (one test in the step's hot path).
    kernels_apart: bool = False

    @cached_property
    def cost(self) -> StepCost:
        """This model's step cost (:func:`simulator.step_closures.step_cost`), which the methods below call."""
        return step_cost(self)

    def __getstate__(self) -> dict:
        # The cost closures are rebuilt where the model is unpickled (closures do not pickle).
        return {k: v for k, v in self.__dict__.items() if k != "cost"}

    def streamed_weight_bytes(self, tokens: int) -> float:
        """Weight bytes one GPU reads in a step of ``tokens`` tokens of its own: the dense groups and LM
        head, and the routed experts the group's tokens touch (top-k of n each, independently)."""
        return self.dense_weight_bytes + self.expert_stream_bytes(tokens * self.moe_token_scale)

    def expert_stream_bytes(self, routed: float) -> float:
        """Routed-expert weight bytes one GPU reads when ``routed`` tokens pass the MoE layers."""
        return self.expert_bytes * self.touched_experts(routed) if self.n_experts else 0.0

    def touched_experts(self, routed: float) -> float:
        """Expected experts (of all) that at least one of ``routed`` tokens picks, each token its top-k
        independently and uniformly."""
        return self.cost.touched(routed)

    def allreduce_time(self, message_bytes: float, graph: bool = True) -> float:
        """One tensor-parallel all-reduce of ``message_bytes``: the measured curve where the profile has
        one (in a CUDA graph or eager), else a ring over the intra-node link."""
        return self.cost.allreduce(message_bytes, graph)

    def linear_time(self, tokens: int, seqs_logits: int = 0, prefill_ctx: float = 0.0) -> tuple[float, float]:
        """(compute, memory) time of the step's dense linear layers: the two sides of their roofline.

        The LM head's rows ride the step's ramp (its GEMM runs beside the step's others, never alone).
        Pipeline stages: each of the pp micro-batches in flight re-reads its stage's weights, so one token
        pays every stage's weight stream in series (pp x this rank's share), while compute splits across
        micro-batches; pipelining raises throughput, never single-sequence speed.  The memory curve was
        fitted per kernel: each linear kernel pays its own floor (half)."""
        return self.cost.linear(tokens, seqs_logits, prefill_ctx)

    def expert_roofline(self, routed: float) -> tuple[float, float]:
        """(compute, memory) time of the routed experts when ``routed`` tokens pass the MoE layers: the
        two sides of their roofline (both 0 for a dense model)."""
        return self.cost.experts(routed)

    def moe_time(self, routed: float, own: float | None = None) -> float:
        """The routed experts and the MoE token exchange when ``routed`` tokens pass the MoE layers;
        ``own``: a rank's share of them, which sets its exchange (default: ``routed / moe_token_scale``)."""
        return self.cost.moe(routed, own)

    def attention_time(self, tokens: int, attn_pairs: float, decode_ctx: float, decodes: int = 0) -> float:
        """The step's attention: :meth:`mla_attention_time` where the MLA kernel was measured apart, else
        :meth:`curve_attention_time`; ``decodes``: the decoding sequences."""
        return self.cost.attention(tokens, attn_pairs, decode_ctx, decodes)

    def mla_attention_time(self, tokens: int, attn_pairs: float, decode_ctx: float, decodes: int) -> float:
        """The measured MLA kernel (:meth:`mla_prefill`; decode: the larger of the latent's bytes and every
        head's FLOPs, plus the fixed and per-sequence costs)."""
        return self.cost.mla_attention(tokens, attn_pairs, decode_ctx, decodes)

    def curve_attention_time(self, tokens: int, attn_pairs: float, decode_ctx: float) -> float:
        """Prefill attention FLOPs (bf16, ramp in the step's tokens) plus the decode KV stream at the
        decode-attention curve, one kernel per layer: sum over layers of (bytes + half) / (BW x max_eff)."""
        return self.cost.curve_attention(tokens, attn_pairs, decode_ctx)

    def mla_prefill(self, ptok: int, attn_pairs: float) -> float:
        """The measured MLA kernel's prefill time for ``ptok`` prompt tokens with ``attn_pairs`` causal pairs: the
        longest chunk estimated as :meth:`linear_attention_time` does, the chunks as the tokens over it."""
        return self.cost.mla_prefill(ptok, attn_pairs)

    def linear_attention_time(self, tokens: int, seqs_logits: int, attn_pairs: float) -> float:
        """The linear-attention layers' kernels in a step (0 without them).  The step model sees aggregates:
        sequences that sample are taken as the decodes and the other tokens as prompt chunks, whose longest
        chunk is estimated from their causal pairs (``2 pairs / prompt tokens``: a single fresh chunk's own
        length, the mean-square length of several; at most the prompt tokens)."""
        return self.cost.linear_attention(tokens, seqs_logits, attn_pairs)

    def local_time(
        self,
        tokens: int,
        seqs_logits: int,
        attn_pairs: float,
        decode_ctx: float,
        prefill_ctx: float = 0.0,
        running: int = 0,
        waiting: int = 0,
    ) -> tuple[float, float]:
        """(GPU, host) seconds of a step without its routed experts: what a rank does on its own."""
        return self.cost.local(tokens, seqs_logits, attn_pairs, decode_ctx, prefill_ctx, running, waiting)

    def combine(self, gpu: float, cpu: float) -> float:
        """A step's duration from its GPU and host time: the next step is prepared while the GPU runs
        this one when the engine overlaps them."""
        if self.overlapped:
            return gpu if gpu > cpu else cpu
        return gpu + cpu

    def step_time(
        self,
        tokens: int,
        seqs_logits: int,
        attn_pairs: float,
        decode_ctx: float,
        prefill_ctx: float = 0.0,
        running: int = 0,
        waiting: int = 0,
    ) -> float:
        return self.cost.step(tokens, seqs_logits, attn_pairs, decode_ctx, prefill_ctx, running, waiting)

    def prefill_time(self, prompt: int, chunk: int = 0) -> float:
        """Time to prefill ``prompt`` tokens alone, in chunks of ``chunk`` tokens (0 = one step)."""
        step = self.cost.step
        chunk = chunk or prompt
        t, done = 0.0, 0
        while done < prompt:
            c = min(chunk, prompt - done)
            last = 1 if done + c == prompt else 0
            t += step(c, last, c * done + c * (c + 1) / 2, 0.0, done, 1, 0)
            done += c
        return t

    def decode_time(self, batch: int, context: int) -> float:
        """Time of a decode-only step for ``batch`` sequences of ``context`` tokens each."""
        return self.cost.decode(batch, float(batch * context), batch)


def regime(
    model: StepModel, tokens: int, seqs_logits: int, attn_pairs: float, decode_ctx: float, prefill_ctx: float = 0.0
) -> str:
    """'compute' or 'memory': which roofline side bounds this step's linear layers (routed experts
    included) and attention (prefill attention counted with compute, the decode KV stream with memory).

    The sides are :meth:`StepModel.step_time`'s own terms (``linear_time``, ``expert_roofline``,
    ``attention_time``), summed per side instead of maxed per kernel kind."""
    t_comp, t_mem = model.linear_time(tokens, seqs_logits, prefill_ctx)
    e_comp, e_mem = model.expert_roofline(tokens * model.moe_token_scale)
    t_comp += model.attention_time(tokens, attn_pairs, 0.0) + e_comp
    t_mem += model.attention_time(tokens, 0.0, decode_ctx) + e_mem
    return "compute" if t_comp > t_mem else "memory"
