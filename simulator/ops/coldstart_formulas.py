"""The formulas of the cold-start phases on plain numbers, shared by :func:`simulator.ops.coldstart.breakdown`
and the start-up fit and its checks (:mod:`calibration.coldstart.fit`, :mod:`calibration.coldstart.holdout`).

Times in seconds, bytes and bytes/s, layers, graphs and batch sizes as counts; the coefficients
(``d0 d1 c0 c1 h1 k0 k g0 g1 g2``) come from a :class:`hwdb.coldstart.StartupCoefficients`.  Each
formula is written out in the table of :mod:`simulator.ops.coldstart`'s docstring.  Also the error
class of bad cold-start input, which these formulas and ``breakdown`` raise.
"""

from __future__ import annotations

from hwdb.coldstart import StartupCoefficients


class ColdStartError(ValueError):
    """Bad cold-start input; the message names the argument, the value and the fix."""


# ---- CUDA-graph capture sizes ------------------------------------------------------------


def capture_sizes(max_size: int, max_num_batched_tokens: int | None = None, rule: str = "v1") -> list[int]:
    """Batch sizes vLLM captures CUDA graphs for (ascending).

    ``rule="v1"`` (vLLM releases of 2026; ``latest`` in vllm-scale.yaml):
    ``[1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16)``, with ``max``
    = ``max_cudagraph_capture_size`` (default ``min(2 * max_num_seqs, 512)``):
    51 sizes for 512.  ``rule="0.10"`` (vLLM 0.9 to 0.11):
    ``[1, 2, 4] + range(8, max + 1, 8)``: 35 sizes for 256, 67 for 512.
    Sizes above ``max_num_batched_tokens`` are dropped.
    """
    if max_size < 1:
        return []
    sizes = [s for s in (1, 2, 4) if s <= max_size]
    if rule == "v1":
        sizes += list(range(8, min(max_size + 1, 256), 8))
        if max_size >= 256:
            sizes += list(range(256, max_size + 1, 16))
    elif rule == "0.10":
        sizes += list(range(8, max_size + 1, 8))
    else:
        raise ColdStartError(f"capture-size rule={rule!r} is unknown; use 'v1' or '0.10'")
    if max_num_batched_tokens:
        sizes = [s for s in sizes if s <= max_num_batched_tokens]
    return sizes


def captured_graphs(
    piecewise: list[int], max_num_seqs: int, mode: str, full_relative_cost: float
) -> tuple[float, float]:
    """(graphs, sum of batch sizes) captured, FULL decode graphs weighted by their relative cost.

    ``FULL_AND_PIECEWISE`` (default since vLLM 0.11) captures every size as
    a piecewise graph for mixed batches and, for uniform decode batches, the
    sizes up to ``max_num_seqs`` again as full graphs; ``PIECEWISE`` (vLLM
    0.9 and 0.10) the piecewise set only; ``NONE`` nothing.
    """
    if mode == "NONE":
        return 0.0, 0.0
    n, s = float(len(piecewise)), float(sum(piecewise))
    if mode == "FULL_AND_PIECEWISE":
        full = [b for b in piecewise if b <= max_num_seqs]
        n += full_relative_cost * len(full)
        s += full_relative_cost * sum(full)
    elif mode != "PIECEWISE":
        raise ColdStartError(f"cudagraph_mode={mode!r} is unknown; use FULL_AND_PIECEWISE, PIECEWISE or NONE")
    return n, s


# ---- phase formulas on plain numbers (shared by breakdown and the fit check) -------------


def weights_seconds(
    checkpoint_bytes: float, ranks: int, storage_Bps: float, latency_s: float, loader_Bps: float
) -> float:
    """Node reads the checkpoint once; each rank moves its shard at the loader rate, overlapped."""
    return latency_s + max(checkpoint_bytes / storage_Bps, checkpoint_bytes / ranks / loader_Bps)


def dynamo_seconds(c: StartupCoefficients, layers: int, moe_layers: int = 0, moe_weight: float = 1.0) -> float:
    """Dynamo bytecode transform, s: ``d0 + d1 * (layers + (moe_weight - 1) * moe_layers)``."""
    return c.coef("dynamo", "d0_s") + c.coef("dynamo", "d1_s_per_layer") * (layers + (moe_weight - 1.0) * moe_layers)


def unique_piece_seconds(c: StartupCoefficients) -> float:
    """Inductor time of one distinct piece, s: ``(c0 + 2 c1) / 3`` (3 distinct pieces in the fitted dense rows)."""
    return (c.coef("compile_miss", "c0_s") + 2.0 * c.coef("compile_miss", "c1_s_per_layer")) / 3.0


def compile_seconds(
    c: StartupCoefficients,
    layers: int,
    cache: str,
    compile_sizes: int = 0,
    unique: int = 3,
    repeats_compiled: bool = True,
) -> float:
    """Inductor on a miss (``unique`` distinct of ``layers + 1`` pieces), artifact load on a hit, s."""
    extra = 1.0 + c.compile_size_relative_cost.value * compile_sizes
    if cache == "miss":
        pieces = layers + 1
        u = min(unique, pieces)
        repeat = c.coef("compile_miss", "c1_s_per_layer") if repeats_compiled else 0.0
        return (u * unique_piece_seconds(c) + (pieces - u) * repeat) * extra
    return c.coef("compile_hit", "h1_s_per_layer") * layers * extra


def kv_profile_seconds(c: StartupCoefficients, layers: int, cache: str) -> float:
    k = c.coef("kv_profile", "k_miss_s_per_layer" if cache == "miss" else "k_hit_s_per_layer")
    return c.coef("kv_profile", "k0_s") + k * layers


def capture_seconds(
    c: StartupCoefficients,
    graphs: float,
    size_sum: float,
    layers: float,
    params_per_rank: float,
    peak_flops: float,
    g1: float | None = None,
) -> float:
    """CUDA-graph capture without gc, s; ``layers`` may be weighted (MoE), ``g1`` defaults to the fit."""
    if graphs <= 0:
        return 0.0
    g1 = c.coef("cuda_graphs", "g1_s_per_graph_layer") if g1 is None else g1
    return (
        c.coef("cuda_graphs", "g0_s")
        + g1 * graphs * layers
        + c.coef("cuda_graphs", "g2_passes") * size_sum * 2.0 * params_per_rank / peak_flops
    )
