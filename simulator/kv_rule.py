"""What ``kv_cache_dtype: auto`` means for a pool: the engine release's rule applied to the checkpoint.

vLLM took the checkpoint's KV directive for ``--kv-cache-dtype auto`` from 0.14 on (PR #29980, re-landed as
#30785: a ModelOpt ``kv_cache_quant_algo: FP8`` gives an fp8 cache; compressed-tensors ``kv_cache_scheme``
followed in PR #30141); before, and for checkpoints without a directive (block-fp8 DeepSeek, Qwen3-FP8,
MiniMax, gpt-oss's MXFP4), ``auto`` is the activation dtype.  SGLang and TensorRT-LLM read ModelOpt's
directive the same way.  The rule is data: :class:`hwdb.engine_schema.KvAutoRule` in the engine file,
:class:`hwdb.schema.KvDirective` in the model's sidecar.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from hwdb.engine_schema import EngineProfile
from hwdb.schema import KvDirective, ModelSidecar


def release_key(version: str) -> tuple[int, ...]:
    """A release string as comparable numbers ("0.14.1" -> (0, 14, 1); "1.3.0rc20" -> (1, 3, 0, 20))."""
    out = []
    for part in version.replace("rc", ".").replace("post", ".").split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def resolve_kv_dtype(
    setting: str, weight_dtype: str, engine: EngineProfile, release: str | None, sidecar: ModelSidecar
) -> tuple[str, str]:
    """(KV dtype, why) for a pool whose scenario says ``setting`` (auto or a dtype).

    ``release``: the engine release the pool runs (None: the engine profile's own version)."""
    if setting != "auto":
        return setting, "set in the scenario"
    plain = "fp16" if weight_dtype == "fp16" else "bf16"
    # keyed by the quantised formats; any other dtype (bf16, ...) has no directive
    directive = cast(Mapping[str, KvDirective], sidecar.kv_cache_directive).get(weight_dtype)
    rule = engine.kv_auto
    release = release or engine.version
    if directive is None:
        return plain, f"auto: {sidecar.name}'s {weight_dtype} checkpoint declares no KV format, so the activation dtype"
    if rule is None or release_key(release) < release_key(rule.checkpoint_from):
        since = f"from {rule.checkpoint_from} on" if rule else "in no release"
        return plain, (
            f"auto: {engine.name} {release} keeps the activation dtype (it follows the checkpoint's KV "
            f"directive {since})"
        )
    return directive.dtype, f"auto: the {weight_dtype} checkpoint's KV directive ({directive.source})"
