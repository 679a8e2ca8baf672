"""Engine rules a pool's settings resolve through: vLLM's batch defaults by GPU, which weight formats an engine
serves weight-only, SGLang's running-request cap from its KV tokens, which releases ran their experts
through a kernel the measured tables do not hold, and which schedule a step ahead."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import cast

import hwdb
from hwdb.engine_schema import WeightOnly
from simulator.kv_rule import release_key
from simulator.perf import Deployment, FitError, plan_memory


def vllm_batch_defaults(gpu: hwdb.GPU) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) that vLLM's OpenAI server picks for ``gpu``.

    vLLM ``EngineArgs.get_batch_defaults``: >= 70 GiB and not an A100 gives
    1024 / 8192, otherwise 256 / 2048.
    """
    big = gpu.memory_bytes.value >= 70 * 2**30 and not gpu.name.upper().startswith("A100")
    return (1024, 8192) if big else (256, 2048)


def weight_only_refusal(pool: str, dtype: str, gpu: hwdb.GPU, engine: hwdb.EngineProfile) -> str:
    """'' or why ``dtype`` is refused on a GPU without its tensor cores: it is not unless the engine serves it
    weight-only there (``EngineProfile.weight_only``: vLLM's Marlin W8A16 on Ampere, W4A16 MXFP4 on Hopper)."""
    # keyed by the formats served weight-only; any other dtype has no weight-only kernel
    wo = cast(Mapping[str, WeightOnly], engine.weight_only).get(dtype)
    missing = [] if wo is None else [n for n in wo.needs if n not in gpu.peak_flops]
    if wo is not None and not missing:
        return ""
    why = (
        f"{engine.name} has no weight-only {dtype} kernel"
        if wo is None
        else f"{engine.name}'s weight-only {dtype} kernel needs {'/'.join(missing)} tensor cores"
    )
    return (
        f"pools[{pool}].dtype={dtype} but {gpu.name} has no {dtype} tensor cores and {why}; use "
        f"{'fp8 or ' if 'fp8' in gpu.peak_flops else ''}int4 (weight-only) or bf16, or another engine"
    )


def engine_running_cap(dep: Deployment, given: bool) -> Deployment:
    """SGLang without ``max_running_requests`` (``given``: the pool sets it) runs as many requests as its KV
    tokens allow (half of them, at most its request pool: :func:`simulator.memory.sglang_max_running`); a
    layout that does not fit keeps the knobs and fails later, in :func:`plan_memory`, with the fix."""
    if given or dep.engine.memory is None or dep.engine.memory.policy != "sglang":
        return dep
    try:
        cap = plan_memory(dep).max_running
    except FitError:
        return dep
    return dataclasses.replace(dep, knobs=dataclasses.replace(dep.knobs, max_num_seqs=cap))


def expert_backend_note(dep: Deployment) -> str:
    """What the deployment's expert kernel line adds when its engine release ran these experts through a
    kernel the measured tables do not hold (the engine profile's ``expert_backends``), else ''."""
    for rule in dep.engine.expert_backends:
        if (
            rule.format == dep.moe_format
            and dep.gpu.name in rule.gpus
            and release_key(dep.release) < release_key(rule.before)
        ):
            return (
                f"; {dep.engine.engine} {dep.release} ran {rule.format} experts on {dep.gpu.name} through "
                f"{rule.backend} by default, which no table measures: the curve is a later release's kernel "
                f"({rule.evidence})"
            )
    return ""


def scheduled_ahead(
    pool: str,
    setting: bool | None,
    release: str,
    pp: int,
    engine: hwdb.EngineProfile,
    gpu: hwdb.GPU,
    serial: bool = False,
) -> tuple[bool, str]:
    """(whether the pool's engine schedules a step ahead, '' or why ``setting`` is refused).

    ``setting``: the pool's ``async_scheduling`` (None: the release's default, the engine profile's
    ``async_scheduling`` rule: from its release on the vendors it names, never with pipeline parallelism).
    ``serial``: the profile switches its overlap off for this model (a linear-attention model with the prefix
    cache on, where ``overlap_with_linear_prefix_cache`` is false), so it does not schedule ahead either."""
    rule = engine.async_scheduling
    if setting is None:
        on = (
            rule is not None
            and pp == 1
            and not serial
            and gpu.vendor in rule.vendors
            and release_key(release) >= release_key(rule.since)
        )
        return on, ""
    if setting and rule is None:
        return False, f"pools[{pool}].engine.async_scheduling=true: not modelled for {engine.name}; remove it"
    if setting and pp > 1:
        return (
            False,
            (
                f"pools[{pool}].engine.async_scheduling=true with pp={pp}: {engine.name} does not schedule ahead "
                "with pipeline parallelism; remove it or set pp 1"
            ),
        )
    if setting and serial:
        return (
            False,
            (
                f"pools[{pool}].engine.async_scheduling=true: {engine.name} turns its overlap scheduler off for a "
                "linear-attention model with the prefix cache on; remove it or set enable_prefix_caching false"
            ),
        )
    return setting, ""
