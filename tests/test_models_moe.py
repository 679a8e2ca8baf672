"""Large MoE models of the measured serving table: parameter counts and KV size against published figures,
and the layer kinds (sliding window, Gated DeltaNet, sparse-attention indexer) that ``arch_from_config`` reads."""

from __future__ import annotations

import copy
import json

import pytest

import hwdb
from hwdb.db import DATA_DIR
from hwdb.hf_config import ConfigError, arch_from_config


@pytest.fixture(scope="module")
def db():
    return hwdb.load()


def _cfg(name: str) -> dict:
    return json.loads((DATA_DIR / "models" / name / "config.json").read_text())


# Every model_path of shared/data/e2e/serving_measurements.csv, and the entry it must resolve to.
TABLE_MODELS = {
    "deepseek-ai/DeepSeek-R1": "DeepSeek-R1",
    "nvidia/DeepSeek-R1-NVFP4": "DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3": "DeepSeek-V3",
    "nvidia/DeepSeek-V3.1-NVFP4": "DeepSeek-V3",
    "MiniMaxAI/MiniMax-M2.5": "MiniMax-M2.5",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "Qwen/Qwen3.5-397B-A17B": "Qwen3.5-397B-A17B",
    "Qwen/Qwen3-32B": "Qwen3-32B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen3-32B",
    "meta-llama/Llama-3.1-70B": "Llama-3.1-70B",
    "moonshotai/Kimi-K2.5": "Kimi-K2.5",
    "Qwen/Qwen3-235B-A22B-FP8": "Qwen3-235B-A22B",
    "Qwen/Qwen3-235B-A22B": "Qwen3-235B-A22B",
    "zhipuai/GLM-5": "GLM-5",
}


@pytest.mark.parametrize("path,name", sorted(TABLE_MODELS.items()))
def test_table_model_paths_resolve(db, path, name):
    assert db.model(path).name == name


# Published counts, with the convention each publisher uses for "active":
#   "all":      linear weights + embedding table + LM head (ModelArch.active_params)
#   "no_embed": without the input embedding table, with the LM head (unembedding)
#   "linear":   without embedding table and LM head (ModelArch.linear_params_per_token)
PUBLISHED = [  # name, total, active, convention
    # Qwen3 model card (Qwen/Qwen3-235B-A22B): 235B total, 22B activated.
    ("Qwen3-235B-A22B", 235e9, 22e9, "all"),
    # gpt-oss model card (OpenAI, arXiv:2508.10925, table 1): 116.83B total, 5.13B active per forward pass,
    # counting the unembedding but not the embedding (MLP 114.71B + attention 0.96B + embed/unembed 1.16B).
    ("gpt-oss-120b", 116.83e9, 5.13e9, "no_embed"),
    # MiniMax-M2.5 (MiniMax-M2 series): 229.9B total, 9.8B activated per token ("230B / 10B" on the card).
    ("MiniMax-M2.5", 229.9e9, 9.8e9, "linear"),
    # Kimi K2 report (arXiv:2507.20534), the K2.5 text backbone: 1.04T total, 32.6B activated.
    ("Kimi-K2.5", 1.04e12, 32.6e9, "all"),
    # GLM-5 report (arXiv:2602.15763, architecture table): 744B total, 40B activated.
    ("GLM-5", 744e9, 40e9, "linear"),
    # Qwen3.5 model card (Qwen/Qwen3.5-397B-A17B): 397B total, 17B activated (total includes the ~0.4B vision
    # encoder, not counted here).
    ("Qwen3.5-397B-A17B", 397e9, 17e9, "all"),
    # DeepSeek-R1 model card: 671B total, 37B activated (MTP module excluded), as DeepSeek-V3.
    ("DeepSeek-R1", 671e9, 37e9, "all"),
]


def _active(a, convention: str) -> int:
    return {
        "all": a.active_params,
        "no_embed": a.active_params - a.embedding_params,
        "linear": a.linear_params_per_token,
    }[convention]


@pytest.mark.parametrize("name,total,active,convention", PUBLISHED)
def test_parameter_counts_match_published(db, name, total, active, convention):
    a = db.model(name).arch
    assert a.total_params == pytest.approx(total, rel=0.03)
    assert _active(a, convention) == pytest.approx(active, rel=0.03)
    assert a.linear_params_per_token < a.active_params <= a.total_params


def test_gpt_oss_breakdown_matches_model_card(db):
    """OpenAI's card splits the 116.83B: MLP 114.71B, attention 0.96B, embedding + unembedding 1.16B."""
    a = db.model("gpt-oss-120b").arch
    mlp = a.total_params - a.attention_params - a.embedding_params - a.lm_head_params
    assert mlp == pytest.approx(114.71e9, rel=0.005)
    assert a.attention_params == pytest.approx(0.96e9, rel=0.01)
    assert a.embedding_params + a.lm_head_params == pytest.approx(1.16e9, rel=0.01)


# KV bytes per token of context in bf16 (2 bytes an element), from each config's attention layout.
KV_BF16 = {
    # 94 layers x K,V x 4 KV heads x head_dim 128
    "Qwen3-235B-A22B": 94 * 2 * 4 * 128 * 2,
    # only the 18 full-attention layers; the 18 sliding-window layers keep at most 128 tokens
    "gpt-oss-120b": 18 * 2 * 8 * 64 * 2,
    # 62 layers x K,V x 8 x 128: 248 KiB a token, as published for the MiniMax-M2 series
    "MiniMax-M2.5": 62 * 2 * 8 * 128 * 2,
    # MLA latent: 61 layers x (kv_lora_rank 512 + rope 64), as DeepSeek-V3
    "Kimi-K2.5": 61 * (512 + 64) * 2,
    "DeepSeek-R1": 61 * (512 + 64) * 2,
    # MLA latent + DSA indexer key: 78 layers x (512 + 64 + 128)
    "GLM-5": 78 * (512 + 64 + 128) * 2,
    # only the 15 full-attention layers x K,V x 2 KV heads x head_dim 256
    "Qwen3.5-397B-A17B": 15 * 2 * 2 * 256 * 2,
}


@pytest.mark.parametrize("name,kv", sorted(KV_BF16.items()))
def test_kv_bytes_per_token(db, name, kv):
    assert db.model(name).arch.kv_elems_per_token * 2 == kv


def test_minimax_kv_is_248_kib():
    assert KV_BF16["MiniMax-M2.5"] == 248 * 1024


def test_layer_kinds(db):
    g = db.model("gpt-oss-120b").arch
    assert (g.num_experts, g.experts_per_token, g.moe_intermediate_size, g.head_dim) == (128, 4, 2880, 64)
    assert (g.num_sliding_layers, g.sliding_window, g.full_attn_layers, g.num_linear_layers) == (18, 128, 18, 0)
    assert g.kv_window_elems_per_seq == 18 * 128 * 2 * 8 * 64
    assert g.num_layers * g.attn_dim == 18 * 64 * 64  # sliding layers add no full-context attention

    q = db.model("Qwen3.5-397B-A17B").arch
    assert (q.num_linear_layers, q.full_attn_layers, q.num_sliding_layers) == (45, 15, 0)
    assert (q.num_experts, q.experts_per_token, q.num_shared_experts, q.moe_intermediate_size) == (512, 10, 1, 1024)
    assert q.attn_output_gate and q.intermediate_size == 0 and q.moe_layers == 60
    assert q.num_layers * q.attn_dim == 15 * 32 * 256
    # delta-rule state 64 heads x 128 x 128 and conv tail (2*2048 + 8192) x 3, in each of 45 layers
    assert q.linear_state_elems_per_seq == 45 * (64 * 128 * 128 + (2 * 2048 + 8192) * 3)
    # one Gated-DeltaNet layer: in_proj qkvz + ba, conv1d, A_log + dt_bias, gated norm, out_proj
    assert q.linear_attn_params_per_layer == (
        4096 * (2 * 2048 + 2 * 8192 + 2 * 64) + (2 * 2048 + 8192) * 4 + 2 * 64 + 128 + 8192 * 4096
    )

    k = db.model("Kimi-K2.5").arch
    assert k.is_mla and (k.num_experts, k.num_shared_experts, k.first_dense_layers, k.num_heads) == (384, 1, 1, 64)

    glm = db.model("GLM-5").arch
    assert glm.is_mla and (glm.index_n_heads, glm.index_head_dim, glm.first_dense_layers) == (32, 128, 3)
    assert (glm.qk_nope_head_dim, glm.v_head_dim, glm.q_lora_rank) == (192, 256, 2048)

    m = db.model("MiniMax-M2.5").arch
    assert (m.num_experts, m.experts_per_token, m.num_shared_experts, m.full_attn_layers) == (256, 8, 0, 62)

    q235 = db.model("Qwen3-235B-A22B").arch
    assert (q235.num_experts, q235.experts_per_token, q235.moe_intermediate_size) == (128, 8, 1536)


def test_deepseek_r1_is_deepseek_v3(db):
    a, b = db.model("DeepSeek-R1").arch, db.model("DeepSeek-V3").arch
    assert a.total_params == b.total_params and a.kv_elems_per_token == b.kv_elems_per_token


def test_unsupported_layer_kinds_are_refused():
    cfg = _cfg("Qwen3.5-397B-A17B")
    bad = copy.deepcopy(cfg)
    bad["text_config"]["layer_types"][0] = "mamba"
    with pytest.raises(ConfigError, match="unsupported layer kinds"):
        arch_from_config(bad, "x")
    bad = copy.deepcopy(cfg)
    bad["text_config"]["layer_types"] = bad["text_config"]["layer_types"][:-1]
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        arch_from_config(bad, "x")
    bad = copy.deepcopy(cfg)
    del bad["text_config"]["linear_num_value_heads"]
    with pytest.raises(ConfigError, match="linear_num_value_heads"):
        arch_from_config(bad, "x")
    bad = copy.deepcopy(cfg)
    bad["text_config"]["shared_expert_intermediate_size"] = 1536
    with pytest.raises(ConfigError, match="shared_expert_intermediate_size"):
        arch_from_config(bad, "x")

    mm = _cfg("MiniMax-M2.5")
    mm["attn_type_list"][0] = 0  # a MiniMax-Text-01 style lightning-attention layer
    with pytest.raises(ConfigError, match="lightning"):
        arch_from_config(mm, "x")

    oss = _cfg("gpt-oss-120b")
    del oss["sliding_window"]
    with pytest.raises(ConfigError, match="sliding_window"):
        arch_from_config(oss, "x")


def test_dense_config_still_needs_intermediate_size():
    cfg = _cfg("Qwen3-32B")
    del cfg["intermediate_size"]
    with pytest.raises(ConfigError, match="intermediate_size"):
        arch_from_config(cfg, "x")
