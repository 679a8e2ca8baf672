"""Reading a Hugging Face ``config.json`` into a :class:`hwdb.models.ModelArch`.

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

from hwdb.models import ModelArch


class ConfigError(ValueError):
    """A model config lacks a field or holds an impossible value."""


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
        qk_norm_whole=bool(text.get("use_qk_norm")) and text.get("qk_norm_type") == "per_layer",
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
