"""Model architecture: the language model's shape, as the performance models need it, and the counts derived
from it (parameters, KV-cache elements per token, recurrent state per sequence).

A :class:`ModelArch` is read from a Hugging Face ``config.json`` by :func:`hwdb.hf_config.arch_from_config`,
which lists the supported families.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelArch:
    """Language-model architecture; all counts are whole-model (TP=1).

    Invariants: ``active_params <= total_params``; ``kv_elems_per_token`` is
    the number of cached elements per token over all layers (K and V, or the
    MLA latent and any sparse-attention indexer key), so KV bytes per token =
    ``kv_elems_per_token * dtype bytes``.  Only layers whose cache grows with
    the whole context count there: sliding-window layers hold at most
    ``sliding_window`` tokens (``kv_window_elems_per_seq``) and linear-attention
    layers a fixed recurrent state (``linear_state_elems_per_seq``), both per
    sequence.  ``num_layers`` counts every decoder layer, of any kind.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    max_position_embeddings: int = 0
    # Layers of other kinds, out of num_layers (from config "layer_types").
    sliding_window: int = 0
    num_sliding_layers: int = 0  # softmax attention over the last sliding_window tokens
    num_linear_layers: int = 0  # Gated-DeltaNet linear attention, no per-token KV
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    attn_output_gate: bool = False  # q_proj also emits a per-head output gate (Qwen3-Next/3.5)
    linear_ssm_dtype: str = ""  # the delta-rule state's dtype the checkpoint asks for (mamba_ssm_dtype)
    # The vision tower's depth and width as SGLang reads them (vision_config num_hidden_layers and hidden_size,
    # 24 and 1024 where absent); 0: no vision_config.
    vision_layers: int = 0
    vision_hidden: int = 0
    # DeepSeek-sparse-attention lightning indexer (DeepSeek-V3.2, GLM-5): its key is cached per token.
    index_n_heads: int = 0
    index_head_dim: int = 0
    # q and k RMS-normalised over the whole projection, not per head (MiniMax-M2, qk_norm_type per_layer): under
    # tensor parallelism each layer all-reduces every token's two variances (vLLM's MiniMaxText01RMSNormTP).
    qk_norm_whole: bool = False

    # ---- derived --------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def full_attn_layers(self) -> int:
        """Layers with softmax attention over the whole context (their KV grows with it)."""
        return self.num_layers - self.num_sliding_layers - self.num_linear_layers

    @property
    def attn_params_per_layer(self) -> int:
        """Weights of one softmax-attention layer (full or sliding window), indexer included."""
        h = self.hidden_size
        index = 0
        if self.index_n_heads:
            q_in = self.q_lora_rank or h
            index = (
                q_in * self.index_n_heads * self.index_head_dim
                + h * self.index_head_dim
                + h * self.index_n_heads
                + 2 * self.index_head_dim
            )
        if self.is_mla:
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (
                h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk_head
                if self.q_lora_rank
                else h * self.num_heads * qk_head
            )
            kv_down = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_up = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.num_heads * self.v_head_dim * h
            return q + kv_down + kv_up + o + index
        q = h * self.num_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * h
        return q + kv + o + index

    @property
    def linear_attn_params_per_layer(self) -> int:
        """Weights of one Gated-DeltaNet layer: q/k/v/z and b/a projections, causal conv, decay, output."""
        if not self.num_linear_layers:
            return 0
        h = self.hidden_size
        key = self.linear_num_key_heads * self.linear_key_head_dim
        value = self.linear_num_value_heads * self.linear_value_head_dim
        in_proj = h * (2 * key + 2 * value + 2 * self.linear_num_value_heads)
        conv = (2 * key + value) * self.linear_conv_kernel_dim
        per_head = 2 * self.linear_num_value_heads  # A_log, dt_bias
        return in_proj + conv + per_head + self.linear_value_head_dim + value * h

    @property
    def attention_params(self) -> int:
        """Token-mixing weights over all layers (softmax and linear attention)."""
        return (
            self.num_layers - self.num_linear_layers
        ) * self.attn_params_per_layer + self.num_linear_layers * self.linear_attn_params_per_layer

    @property
    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def expert_params(self) -> int:
        """Parameters of one routed expert (gated MLP)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def _mlp_params(self, experts: int) -> int:
        dense = (self.num_layers - self.moe_layers) * self.dense_mlp_params
        if not self.is_moe:
            return dense
        shared = self.num_shared_experts * self.expert_params
        router = self.hidden_size * self.num_experts
        return dense + self.moe_layers * (experts * self.expert_params + shared + router)

    @property
    def total_params(self) -> int:
        embed = self.embedding_params + (0 if self.tie_embeddings else self.lm_head_params)
        return self.attention_params + self._mlp_params(self.num_experts) + embed

    @property
    def linear_params_per_token(self) -> int:
        """Weights each token multiplies through (active experts only, no LM head)."""
        return self.attention_params + self._mlp_params(self.experts_per_token)

    @property
    def active_params(self) -> int:
        """Parameters one token activates, counted as model cards count them.

        Active linear weights plus the embedding table and (if untied) the LM
        head, so that, e.g., Qwen3-30B-A3B gives its published 3.3B and
        Mixtral-8x7B its 12.9B.  FLOP models use ``linear_params_per_token``.
        """
        embed = self.embedding_params + (0 if self.tie_embeddings else self.lm_head_params)
        return self.linear_params_per_token + embed

    @property
    def kv_elems_per_token(self) -> int:
        """Cached elements per token of context, over the layers whose cache grows with the context."""
        if self.is_mla:
            return self.full_attn_layers * (self.kv_lora_rank + self.qk_rope_head_dim + self.index_head_dim)
        return self.full_attn_layers * 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_window_elems_per_seq(self) -> int:
        """Most cached elements one sequence holds in its sliding-window layers (a full window)."""
        return self.num_sliding_layers * self.sliding_window * 2 * self.num_kv_heads * self.head_dim

    def linear_state_bytes(self, tp: int, layers: int, ssm_bytes: float, conv_bytes: float) -> float:
        """Bytes of recurrent state one sequence holds on one GPU of ``tp`` over ``layers`` linear-attention layers:
        the delta-rule state (value heads x key dim x value dim, split over TP) at ``ssm_bytes`` per element and the
        convolution's last kernel-1 inputs (value dims + 2 x key dims, key heads padded up to a multiple of TP) at
        ``conv_bytes``, as SGLang's ``mamba2_cache_params`` and vLLM's ``gated_delta_net_state_shape`` shape them."""
        if not self.num_linear_layers:
            return 0.0
        hk = -(-self.linear_num_key_heads // tp) * tp
        conv = (self.linear_num_value_heads * self.linear_value_head_dim + 2 * hk * self.linear_key_head_dim) / tp
        ssm = self.linear_num_value_heads / tp * self.linear_key_head_dim * self.linear_value_head_dim
        return layers * (conv * (self.linear_conv_kernel_dim - 1) * conv_bytes + ssm * ssm_bytes)

    @property
    def linear_state_elems_per_seq(self) -> int:
        """Recurrent state one sequence holds in its linear-attention layers (delta-rule state + conv tail)."""
        if not self.num_linear_layers:
            return 0
        key = self.linear_num_key_heads * self.linear_key_head_dim
        value = self.linear_num_value_heads * self.linear_value_head_dim
        state = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        return self.num_linear_layers * (state + (2 * key + value) * (self.linear_conv_kernel_dim - 1))

    @property
    def attn_dim(self) -> int:
        """Per-token width of the QK^T and PV products summed over heads, per layer on average.

        Only full-context softmax layers count, so ``num_layers * attn_dim`` is the width summed over
        the model: sliding-window layers (at most ``sliding_window`` keys) and linear-attention layers
        (no pairwise products) add nothing.  For models with only full-attention layers this is the
        width of one layer.
        """
        if self.is_mla:
            width = self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) // 2
        else:
            width = self.num_heads * self.head_dim
        return width * self.full_attn_layers // self.num_layers
