"""Cold starts at scale: the low / typical / high range of a start-up, and the sourced real start-ups.

The single-GPU fit (``hwdb/data/coldstart/vllm-v1.yaml``, 0.5-14B models on
one GPU) cannot see what multi-GPU and MoE starts spend their time on.
``hwdb/data/coldstart/vllm-scale.yaml`` adds, for each such phase, the range
of the per-unit rate that public logs span (every number with its source),
and per vLLM release the behaviours that switch phases on or off:

==========================  ===================================================================
distributed init            ``base + per_rank * ranks`` (worker start, NCCL), when ``tp x pp > 1``
custom all-reduce P2P check ``s_per_pair * tp (tp - 1) / 2`` on a cold ``~/.cache``, where the
                            release runs it (<= 0.10) or ``VLLM_SKIP_P2P_CHECK=0`` (level high)
weights                     per-rank loader rate (each rank moves its shard; MoE experts alike)
Dynamo                      host multiplier; MoE layers weigh more (Qwen3-235B vs Llama-3-70B)
Inductor                    distinct pieces x a fitted per-piece time (+ repeated pieces where
                            the release still re-runs AOTAutograd), times a host multiplier
kernel JIT / DeepGEMM       constants on a cold cache (DeepGEMM: FP8 MoE, Hopper or later)
CUDA-graph capture          seconds per captured graph per layer (MoE layers weigh more), plus
                            gc.collect once per graph on releases before gc was frozen
process start               imports, engine process (host speed)
==========================  ===================================================================

``typical`` is what ``epdsim coldstart`` prints first; ``high`` sizes the
probe recommendations (``epdsim probes``, :func:`recommend_high`), so a slow
host or storage still starts inside the startupProbe.  :func:`calibration.coldstart.cases.check_cases`
re-predicts every sourced real start-up kept in the file, over the phases the
source timed (``observed_phases``), at the release it ran (``vllm_version``);
:func:`calibration.coldstart.holdout.held_out_checks` predicts each again with
the ranges re-derived without the case's own source.
"""

from __future__ import annotations

from simulator.ops.coldstart import LEVELS, Breakdown, CompileCache, breakdown
from simulator.ops.k8s import recommend_probes


def breakdown_range(
    dep, compile_cache: CompileCache = "miss", storage: str = "nvme", image_cached: bool = True, **kw
) -> dict[str, Breakdown]:
    """``{level: Breakdown}`` for low, typical and high (same arguments as :func:`breakdown`)."""
    return {lv: breakdown(dep, compile_cache, storage, image_cached, level=lv, **kw) for lv in LEVELS}


def recommend_high(dep, storage: str = "nvme", image_cached: bool = True, margin: float = 0.5, **kw):
    """Probe recommendation sized on the high end of a cold-cache start (see :mod:`simulator.ops.k8s`)."""
    path = kw.pop("path", "/health")
    port = kw.pop("port", 8000)
    return recommend_probes(
        breakdown(dep, "miss", storage, image_cached, level="high", **kw), margin=margin, path=path, port=port
    )
