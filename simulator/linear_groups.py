"""A model's linear weights in the groups that quantised checkpoints store differently.

A "fp8" or "fp4" checkpoint rarely stores every weight in that format.  The LM head and the
MoE router stay in bf16 in every checkpoint format epdsim models (modelopt's ``exclude_modules``,
compressed-tensors' ``ignore``, gpt-oss's ``modules_to_not_convert`` all list ``lm_head``; the
routers are ``mlp.gate`` / ``mlp.router`` in the same lists), and many MoE checkpoints keep
attention, shared experts or the first dense layers in bf16 as well (Kimi-K2.5's INT4 release
quantises only the routed experts; gpt-oss-120b's MXFP4 only the experts).  Which groups stay
bf16 for a model in a format is data (``bf16_modules`` in the model's ``epdsim.yaml``, with the
checkpoint it was read from); the input embedding is never quantised and never streamed.

:func:`linear_groups` returns each group's parameters, bytes per stored weight and compute
dtype for one deployment, which the step model turns into weight bytes and compute time.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwdb.models import ModelArch
from hwdb.schema import COMPUTE_DTYPE, WEIGHT_BYTES

# Groups a checkpoint may keep unquantised (ModelSidecar.bf16_modules names these).
OPTIONAL_BF16 = ("attention", "dense_mlp", "shared_experts")
ALWAYS_BF16 = ("router", "lm_head")
QUANTISED = ("fp8", "fp4", "int4", "int8")


@dataclass(frozen=True)
class Group:
    """One group of linear weights of the whole model (all ranks together).

    ``params``: stored parameters; ``per_token``: parameters one token multiplies through (routed
    experts: the top-k only; the LM head: per sampled sequence, not per token); ``weight_bytes``:
    bytes per stored parameter including scales; ``compute_dtype``: the tensor-core dtype its GEMMs
    run in (weight-only int4 dequantises to bf16).
    """

    name: str
    params: float
    per_token: float
    weight_bytes: float
    compute_dtype: str


def group_params(a: ModelArch) -> dict[str, tuple[float, float]]:
    """(stored, per token) parameters of each group; together they are ``total_params`` without the
    input embedding, and ``linear_params_per_token`` plus the LM head."""
    moe = a.moe_layers
    lm = a.lm_head_params
    out = {
        "attention": (a.attention_params, a.attention_params),
        "dense_mlp": ((a.num_layers - moe) * a.dense_mlp_params,) * 2,
        "shared_experts": ((moe * a.num_shared_experts * a.expert_params),) * 2,
        "router": ((moe * a.hidden_size * a.num_experts) if a.is_moe else 0,) * 2,
        "experts": (moe * a.num_experts * a.expert_params, moe * a.experts_per_token * a.expert_params),
        "lm_head": (lm, lm),
    }
    return {k: (float(s), float(t)) for k, (s, t) in out.items()}


def unquantised_dtype(weight_dtype: str) -> str:
    return "fp16" if weight_dtype == "fp16" else "bf16"


def linear_groups(
    a: ModelArch, weight_dtype: str, bf16_modules: frozenset[str], peaks: set[str], quant_bytes: float | None = None
) -> list[Group]:
    """The model's groups under ``weight_dtype``: those in ``bf16_modules`` and the always-bf16 ones
    keep 2-byte weights and bf16 compute; the rest take the format's bytes (``quant_bytes`` when the
    checkpoint's differ from the format's default) and compute dtype.  ``peaks``: the dtypes the GPU
    has tensor-core peaks for (a format without one computes in bf16)."""
    plain = unquantised_dtype(weight_dtype)
    quant = weight_dtype in QUANTISED
    qcompute = COMPUTE_DTYPE.get(weight_dtype, weight_dtype)
    qcompute = qcompute if qcompute in peaks else plain
    out = []
    for name, (stored, per_token) in group_params(a).items():
        if stored <= 0:
            continue
        keep = quant and (name in ALWAYS_BF16 or name in bf16_modules)
        wbytes = WEIGHT_BYTES[plain] if keep else (quant_bytes if quant and quant_bytes else WEIGHT_BYTES[weight_dtype])
        out.append(Group(name, stored, per_token, wbytes, plain if keep else qcompute))
    return out


def stored_weight_bytes(a: ModelArch, groups: list[Group], weight_dtype: str) -> float:
    """Bytes of the whole model's weights in memory: the groups plus the input embedding table
    (kept unquantised; shared with the LM head when the model ties them)."""
    embed = 0.0 if a.tie_embeddings else a.embedding_params * WEIGHT_BYTES[unquantised_dtype(weight_dtype)]
    return sum(g.params * g.weight_bytes for g in groups) + embed
