"""Model architecture derived from a Hugging Face ``config.json``.

The config is kept verbatim; :func:`arch_from_config` reads the fields that the
performance models need and derives parameter counts and KV-cache size.
Supported families: dense decoder (Llama, Qwen2/3, Mistral), sparse MoE
(Mixtral, Qwen3-MoE, gpt-oss, MiniMax-M2, DeepSeek-V3 / Kimi-K2 with shared
experts and dense first layers), multi-head latent attention (DeepSeek-V2/V3,
GLM-5 with the DeepSeek-sparse-attention indexer), alternating sliding-window
layers (gpt-oss, from ``layer_types``) and hybrid Gated-DeltaNet linear
attention (Qwen3.5 / Qwen3-Next, from ``layer_types``).  Vision-language and
other multimodal wrappers (Qwen2.5-VL, Kimi-K2.5, Qwen3.5) are read through
their ``text_config`` or top-level text fields; their encoders are not counted.
Multi-token-prediction modules are not counted.
"""

from __future__ import annotations

from dataclasses import dataclass


class ConfigError(ValueError):
    """A model config lacks a field or holds an impossible value."""


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


def _get(cfg: dict, *keys, default=None, required=True):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if required and default is None:
        raise ConfigError(f"config.json lacks '{keys[0]}' (also looked for {list(keys[1:])})")
    return default


_LAYER_KINDS = ("full_attention", "sliding_attention", "linear_attention")
# config mamba_ssm_dtype values -> epdsim dtype names (an unknown one: the engine's default)
SSM_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def _layer_kinds(text: dict, n_layers: int) -> list[str]:
    """Each layer's attention kind from ``layer_types``; all full attention when the config has none.

    MiniMax's ``attn_type_list`` (1 = softmax, 0 = lightning linear attention) is accepted when it
    holds only softmax layers, as in MiniMax-M2; lightning attention is not modelled.
    """
    kinds = text.get("layer_types")
    if kinds is None:
        legacy = text.get("attn_type_list")
        if legacy is not None and any(int(t) != 1 for t in legacy):
            raise ConfigError(
                "attn_type_list has lightning-attention layers (0), which are not supported "
                "(MiniMax-Text-01 / M1); only all-softmax configs (MiniMax-M2) are"
            )
        return ["full_attention"] * n_layers
    if len(kinds) != n_layers:
        raise ConfigError(f"layer_types lists {len(kinds)} layers but num_hidden_layers is {n_layers}")
    unknown = sorted(set(kinds) - set(_LAYER_KINDS))
    if unknown:
        raise ConfigError(f"layer_types holds unsupported layer kinds {unknown}; known: {list(_LAYER_KINDS)}")
    return list(kinds)


# Every integer field the reader uses: a whole number in [0, 2**40] wherever a config gives it.
INT_FIELDS = (
    "hidden_size",
    "d_model",
    "n_embd",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "head_dim",
    "n_routed_experts",
    "num_local_experts",
    "num_experts",
    "num_hidden_layers",
    "n_layer",
    "num_layers",
    "moe_intermediate_size",
    "intermediate_size",
    "ffn_dim",
    "first_k_dense_replace",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "shared_intermediate_size",
    "sliding_window",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "vocab_size",
    "num_experts_per_tok",
    "num_experts_per_token",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "q_lora_rank",
    "max_position_embeddings",
    "index_n_heads",
    "index_head_dim",
)


def _check_fields(text: dict) -> None:
    """Each field of :data:`INT_FIELDS` present is a whole number in range; lists are lists."""
    for key in INT_FIELDS:
        v = text.get(key)
        if v is None:
            continue
        whole = (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())
        if not whole or not 0 <= v <= 2**40:
            raise ConfigError(
                f"field {key}={v!r} must be a whole number from 0 to 2**40 "
                f"(a count or a size in elements); fix it in config.json"
            )
    for key in ("layer_types", "attn_type_list"):
        v = text.get(key)
        if v is not None and not (isinstance(v, list) and all(isinstance(x, (str, int)) for x in v)):
            raise ConfigError(f"field {key} must be a list (one entry per layer), got {type(v).__name__}")


def arch_from_config(cfg: dict, name: str) -> ModelArch:
    """Build a :class:`ModelArch` from a parsed Hugging Face config dict."""
    if not isinstance(cfg, dict):
        raise ConfigError(f"config.json must hold a JSON object, got a {type(cfg).__name__}")
    sub = cfg.get("text_config")
    if sub is not None and not isinstance(sub, dict):
        raise ConfigError(
            f"field text_config must be a JSON object (the language model's config), got a {type(sub).__name__}"
        )
    text = sub or cfg
    if text is not cfg:
        text = {**{k: v for k, v in cfg.items() if k != "text_config"}, **text}
    _check_fields(text)
    hidden = int(_get(text, "hidden_size", "d_model", "n_embd"))
    heads = int(_get(text, "num_attention_heads", "n_head"))
    if heads <= 0:
        raise ConfigError(f"num_attention_heads={heads} must be positive")
    kv_heads = int(_get(text, "num_key_value_heads", default=heads))
    head_dim = int(_get(text, "head_dim", default=hidden // heads))
    n_experts = int(_get(text, "n_routed_experts", "num_local_experts", "num_experts", default=0, required=False) or 0)
    n_layers = int(_get(text, "num_hidden_layers", "n_layer", "num_layers"))
    moe_inter = int(
        _get(text, "moe_intermediate_size", default=0, required=False)
        or (text.get("intermediate_size", 0) if n_experts else 0)
    )
    first_dense = int(text.get("first_k_dense_replace") or 0)
    # A layer MLP is only dense where an MoE model says so; an all-MoE config may omit intermediate_size.
    needs_dense_mlp = not n_experts or first_dense > 0
    n_shared = int(text.get("n_shared_experts") or 0)
    shared_inter = int(
        _get(text, "shared_expert_intermediate_size", "shared_intermediate_size", default=0, required=False) or 0
    )
    if shared_inter and not n_shared:
        # Qwen2-MoE / Qwen3.5 style: one gated shared MLP of its own width, counted in routed-expert units.
        if not moe_inter or shared_inter % moe_inter:
            raise ConfigError(
                f"shared_expert_intermediate_size={shared_inter} is not a multiple of "
                f"moe_intermediate_size={moe_inter}; such a shared expert is not supported"
            )
        n_shared = shared_inter // moe_inter
    kinds = _layer_kinds(text, n_layers)
    vision = cfg.get("vision_config")
    if vision is not None and not isinstance(vision, dict):
        raise ConfigError(
            f"field vision_config must be a JSON object (the vision tower's config), got a {type(vision).__name__}"
        )
    n_linear = kinds.count("linear_attention")
    n_sliding = kinds.count("sliding_attention")
    window = int(text.get("sliding_window") or 0) if n_sliding else 0
    if n_sliding and window <= 0:
        raise ConfigError("layer_types has sliding_attention layers but sliding_window is not set")
    linear = {}
    if n_linear:
        keys = (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        )
        missing = [k for k in keys if not text.get(k)]
        if missing:
            raise ConfigError(f"layer_types has linear_attention layers but the config lacks {missing}")
        linear = {k: int(text[k]) for k in keys}
    arch = ModelArch(
        name=name,
        num_layers=n_layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(
            _get(text, "intermediate_size", "ffn_dim", default=None if needs_dense_mlp else 0, required=needs_dense_mlp)
        ),
        vocab_size=int(_get(text, "vocab_size")),
        tie_embeddings=bool(text.get("tie_word_embeddings", False)),
        num_experts=n_experts,
        experts_per_token=int(
            _get(text, "num_experts_per_tok", "num_experts_per_token", default=0, required=False) or 0
        ),
        moe_intermediate_size=moe_inter,
        num_shared_experts=n_shared,
        first_dense_layers=first_dense,
        kv_lora_rank=int(text.get("kv_lora_rank") or 0),
        qk_rope_head_dim=int(text.get("qk_rope_head_dim") or 0),
        qk_nope_head_dim=int(text.get("qk_nope_head_dim") or 0),
        v_head_dim=int(text.get("v_head_dim") or 0),
        q_lora_rank=int(text.get("q_lora_rank") or 0),
        max_position_embeddings=int(text.get("max_position_embeddings") or 0),
        sliding_window=window,
        num_sliding_layers=n_sliding,
        num_linear_layers=n_linear,
        **linear,
        attn_output_gate=bool(text.get("attn_output_gate", False)),
        linear_ssm_dtype=SSM_DTYPES.get(str(text.get("mamba_ssm_dtype") or ""), "") if n_linear else "",
        vision_layers=int(vision.get("num_hidden_layers") or 24) if vision is not None else 0,
        vision_hidden=int(vision.get("hidden_size") or 1024) if vision is not None else 0,
        index_n_heads=int(text.get("index_n_heads") or 0),
        index_head_dim=int(text.get("index_head_dim") or 0),
    )
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
        if getattr(arch, field) <= 0:
            raise ConfigError(f"config field for {field} must be positive, got {getattr(arch, field)}")
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    if n_experts and arch.experts_per_token <= 0:
        raise ConfigError("an MoE config needs num_experts_per_tok > 0")
    if arch.experts_per_token > n_experts:
        raise ConfigError(
            f"num_experts_per_tok={arch.experts_per_token} exceeds the {n_experts} routed experts; "
            f"a token cannot be routed to more experts than exist"
        )
    if needs_dense_mlp and arch.intermediate_size <= 0:
        raise ConfigError(f"intermediate_size={arch.intermediate_size} must be positive for dense MLP layers")
    if n_experts and moe_inter <= 0:
        raise ConfigError("an MoE config needs a positive moe_intermediate_size (or intermediate_size)")
    if arch.first_dense_layers > n_layers:
        raise ConfigError(f"first_k_dense_replace={arch.first_dense_layers} exceeds num_hidden_layers={n_layers}")
    return arch
