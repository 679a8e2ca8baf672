"""Model architecture derived from a Hugging Face ``config.json``.

The config is kept verbatim; :func:`arch_from_config` reads the fields that the
performance models need and derives parameter counts and KV-cache size.
Supported families: dense decoder (Llama, Qwen2/3, Mistral), sparse MoE
(Mixtral, Qwen3-MoE, DeepSeek-V3 with shared experts and dense first layers)
and multi-head latent attention (DeepSeek-V2/V3).  Vision-language configs
(Qwen2.5-VL) are read through their ``text_config`` or top-level text fields.
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
    MLA latent), so KV bytes per token = ``kv_elems_per_token * dtype bytes``.
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

    # ---- derived --------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attn_params_per_layer(self) -> int:
        h = self.hidden_size
        if self.is_mla:
            qk_head = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * self.num_heads * qk_head
                 if self.q_lora_rank else h * self.num_heads * qk_head)
            kv_down = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_up = self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.num_heads * self.v_head_dim * h
            return q + kv_down + kv_up + o
        q = h * self.num_heads * self.head_dim
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = self.num_heads * self.head_dim * h
        return q + kv + o

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
        return (self.num_layers * self.attn_params_per_layer
                + self._mlp_params(self.num_experts) + embed)

    @property
    def linear_params_per_token(self) -> int:
        """Weights each token multiplies through (active experts only, no LM head)."""
        return self.num_layers * self.attn_params_per_layer + self._mlp_params(self.experts_per_token)

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
        if self.is_mla:
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim)
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim

    @property
    def attn_dim(self) -> int:
        """Per-token width of the QK^T and PV products summed over heads (one layer)."""
        if self.is_mla:
            return self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) // 2
        return self.num_heads * self.head_dim


def _get(cfg: dict, *keys, default=None, required=True):
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    if required and default is None:
        raise ConfigError(f"config.json lacks '{keys[0]}' (also looked for {list(keys[1:])})")
    return default


def arch_from_config(cfg: dict, name: str) -> ModelArch:
    """Build a :class:`ModelArch` from a parsed Hugging Face config dict."""
    if not isinstance(cfg, dict):
        raise ConfigError("config.json must hold a JSON object")
    text = cfg.get("text_config") or cfg
    if text is not cfg:
        text = {**{k: v for k, v in cfg.items() if k != "text_config"}, **text}
    hidden = int(_get(text, "hidden_size", "d_model", "n_embd"))
    heads = int(_get(text, "num_attention_heads", "n_head"))
    kv_heads = int(_get(text, "num_key_value_heads", default=heads))
    head_dim = int(_get(text, "head_dim", default=hidden // heads))
    n_experts = int(_get(text, "n_routed_experts", "num_local_experts", "num_experts", default=0, required=False) or 0)
    arch = ModelArch(
        name=name,
        num_layers=int(_get(text, "num_hidden_layers", "n_layer", "num_layers")),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(_get(text, "intermediate_size", "ffn_dim")),
        vocab_size=int(_get(text, "vocab_size")),
        tie_embeddings=bool(text.get("tie_word_embeddings", False)),
        num_experts=n_experts,
        experts_per_token=int(_get(text, "num_experts_per_tok", "num_experts_per_token", default=0, required=False) or 0),
        moe_intermediate_size=int(_get(text, "moe_intermediate_size", default=0, required=False)
                                  or (text.get("intermediate_size", 0) if n_experts else 0)),
        num_shared_experts=int(text.get("n_shared_experts") or 0),
        first_dense_layers=int(text.get("first_k_dense_replace") or 0),
        kv_lora_rank=int(text.get("kv_lora_rank") or 0),
        qk_rope_head_dim=int(text.get("qk_rope_head_dim") or 0),
        qk_nope_head_dim=int(text.get("qk_nope_head_dim") or 0),
        v_head_dim=int(text.get("v_head_dim") or 0),
        q_lora_rank=int(text.get("q_lora_rank") or 0),
        max_position_embeddings=int(text.get("max_position_embeddings") or 0),
    )
    for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
        if getattr(arch, field) <= 0:
            raise ConfigError(f"config field for {field} must be positive, got {getattr(arch, field)}")
    if heads % kv_heads:
        raise ConfigError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    if n_experts and arch.experts_per_token <= 0:
        raise ConfigError("an MoE config needs num_experts_per_tok > 0")
    return arch
