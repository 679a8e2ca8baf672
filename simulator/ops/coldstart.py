"""Cold start of one serving instance: the phases from pod start to an answering API.

``breakdown(deployment, compile_cache=..., storage=..., image_cached=...)``
returns the phases in order, each in seconds (SI units throughout).  With
``L`` the decoder layers on one rank (``ceil(layers / pp)``), ``M`` the MoE
layers among them, ``R`` the ranks (``tp * pp``), ``P`` the parameters one
rank computes per token (active ones for MoE) and ``B`` the checkpoint bytes:

==================  ==========================================================
image_pull          ``compressed / registry_Bps + uncompressed / extract_Bps``;
                    0 when the image is already on the node
process_start       constant (imports, config, tokenizer, engine process)
distributed_init    ``base + per_rank * R`` when ``R > 1`` (workers, NCCL)
p2p_check           ``tp (tp - 1) / 2 * s_per_pair``: the custom all-reduce
                    P2P access check, on a cold ``~/.cache`` where the
                    release runs it by default
weights             ``latency + max(B / storage_Bps, B / R / loader_Bps)``:
                    the node reads the checkpoint once, each rank moves its
                    shard at the loader rate, overlapped
dynamo              ``(d0 + d1 * (L + (w - 1) * M)) * m`` (MoE layers weigh ``w``)
compile             miss: Inductor compiles every *distinct* piece (the graph
                    is split at attention into ``L + 1`` pieces; 3 distinct
                    for a dense model, one more per MoE layer where the
                    release names the layer in its graph) at ``c_u`` each,
                    and re-runs AOTAutograd on each repeated piece at ``c1``
                    until vLLM reuses the artifacts: ``(u * c_u + (L + 1 -
                    u) * c_r) * m``, with ``c_u = (c0 + 2 c1) / 3`` so a dense
                    model reproduces the fitted ``c0 + c1 L``; hit: ``h1 * L * m``
kv_profile          ``k0 + k * L`` with ``k`` = ``k_miss`` or ``k_hit``
jit_kernels         constant on a cold cache (Triton / FlashInfer JIT)
deepgemm_warmup     constant, FP8 MoE on Hopper or later, cold cache
cuda_graphs         ``g0 + g1 * N * (L + (w - 1) * M) + g2 * S * 2 P / peak``
                    ``+ gc * N * L`` where the release runs gc.collect once
                    per captured graph: ``N`` graphs (piecewise sizes, plus
                    the FULL decode sizes up to ``max_num_seqs``), ``S`` the
                    sum of their batch sizes; 0 with ``enforce_eager``
api_ready           constant (HTTP server up after the engine)
==================  ==========================================================

The constants ``d0 d1 c0 c1 h1 k0 k g0 g1 g2`` are least-squares fits
(:func:`calibration.coldstart.fit.fit_profiler_csvs`) to vLLM 0.10.1 start-ups
of 0.5B-14B models on one GPU, kept with their residuals in
``hwdb/data/coldstart/vllm-v1.yaml``.  What one GPU cannot show (ranks, the
P2P check, per-rank loading, MoE layers, capture at TP > 1, gc) comes from
``hwdb/data/coldstart/vllm-scale.yaml``: each rate as a sourced low / typical
/ high range (``level`` picks one end) and each vLLM release's switches
(``vllm_version``: capture sizes and mode, gc per capture, P2P check,
compiled repeats, distinct MoE pieces).  ``level="low"`` skips the P2P check
(``VLLM_SKIP_P2P_CHECK=1``), ``"high"`` runs it on any release (``=0``).  ``enforce_eager`` skips Dynamo,
Inductor and capture.  Beyond 48 layers, 14B parameters or one GPU the fitted
formulas extrapolate: :attr:`Breakdown.extrapolated` says which.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from hwdb.coldstart import ColdStartDB, VersionRules, load_coldstart
from hwdb.files import HwdbError
from hwdb.schema import WEIGHT_BYTES
from simulator.ops.coldstart_formulas import (
    ColdStartError,
    capture_seconds,
    capture_sizes,
    captured_graphs,
    compile_seconds,
    dynamo_seconds,
    kv_profile_seconds,
    unique_piece_seconds,
    weights_seconds,
)
from simulator.perf import Deployment

CompileCache = Literal["miss", "hit"]
CudagraphMode = Literal["FULL_AND_PIECEWISE", "PIECEWISE", "NONE"]

PHASES = (
    "image_pull",
    "process_start",
    "distributed_init",
    "p2p_check",
    "weights",
    "dynamo",
    "compile",
    "kv_profile",
    "jit_kernels",
    "deepgemm_warmup",
    "cuda_graphs",
    "api_ready",
)
LEVELS = ("low", "typical", "high")
PHASE_LABELS = {
    "image_pull": "container image pull",
    "process_start": "process start (imports, config, tokenizer)",
    "distributed_init": "distributed init (workers, NCCL)",
    "p2p_check": "custom all-reduce P2P access check",
    "weights": "weights load",
    "dynamo": "torch.compile (Dynamo transform)",
    "compile": "torch.compile (Inductor compile)",
    "kv_profile": "KV-cache profiling",
    "jit_kernels": "Triton / FlashInfer kernel JIT",
    "deepgemm_warmup": "DeepGEMM JIT warm-up (FP8 MoE)",
    "cuda_graphs": "CUDA-graph capture",
    "api_ready": "API server start",
}
# The range the coefficients were fitted on (vllm-startup-profiler rows).
FIT_MAX_LAYERS = 48
FIT_MAX_PARAMS = 14.2e9


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    detail: str = ""

    @property
    def label(self) -> str:
        return PHASE_LABELS.get(self.name, self.name)


@dataclass(frozen=True)
class Breakdown:
    """The start-up phases of one instance, in order; iterate for ``(phase, seconds)``."""

    phases: tuple[Phase, ...]
    compile_cache: str
    storage: str
    image_cached: bool
    description: str = ""
    extrapolated: tuple[str, ...] = ()
    level: str = "typical"

    def __iter__(self) -> Iterator[tuple[str, float]]:
        return iter((p.name, p.seconds) for p in self.phases)

    def as_list(self) -> list[tuple[str, float]]:
        return list(self)

    @property
    def total_s(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def container_s(self) -> float:
        """From container start to an answering API (what probes see: no image pull)."""
        return self.total_s - self.seconds("image_pull")

    def seconds(self, name: str) -> float:
        return sum(p.seconds for p in self.phases if p.name == name)

    def container_phases(self) -> tuple[Phase, ...]:
        return tuple(p for p in self.phases if p.name != "image_pull")


# ---- the breakdown -------------------------------------------------------------------------


def _choice(name: str, value, allowed) -> None:
    if value not in allowed:
        raise ColdStartError(f"{name}={value!r} is not valid; choose one of {', '.join(map(str, allowed))}")


# Without a scale set (a calibrated start-up set of one's own): the fit alone, no P2P check or gc.
_FIT_ONLY = VersionRules(
    capture_rule="v1",
    cudagraph_mode="FULL_AND_PIECEWISE",
    gc_per_capture_size=False,
    p2p_check=False,
    repeat_pieces_compiled=True,
    moe_pieces_unique=False,
    source="no scale set: the fitted formulas only",
)


def breakdown(
    dep: Deployment,
    compile_cache: CompileCache = "miss",
    storage: str = "nvme",
    image_cached: bool = True,
    *,
    image: str = "vllm-openai",
    engine: str = "vllm-v1",
    compile_sizes: int = 0,
    cudagraph_mode: CudagraphMode | None = None,
    capture_rule: str | None = None,
    compile_multiplier: float = 1.0,
    db: ColdStartDB | None = None,
    level: str = "typical",
    vllm_version: str | None = None,
    capture_sizes_override: list[int] | tuple[int, ...] | None = None,
) -> Breakdown:
    """Start-up phases of ``dep`` (see the module docstring for every formula).

    ``compile_cache``: ``"miss"`` (first start, or a cache that did not
    persist) or ``"hit"`` (``~/.cache/vllm`` on a volume); ``storage``: a
    storage file in ``hwdb/data/coldstart`` (``nvme``, ``nfs``, ``s3``,
    ``page_cache``); ``image_cached``: the image is already on the node (no
    pull); ``compile_sizes``: static sizes in ``compilation_config.compile_sizes``;
    ``compile_multiplier``: a what-if factor on the Inductor compile (the
    documented 37-minute MoE outlier is ~60x); ``level``: ``low``,
    ``typical`` or ``high`` end of the sourced ranges; ``vllm_version``: a
    release in ``vllm-scale.yaml`` ``versions`` (None: its
    ``default_version``); ``cudagraph_mode`` / ``capture_rule`` /
    ``capture_sizes_override`` override what that release captures.
    Raises :class:`ColdStartError` on a bad choice, ``HwdbError`` on an
    unknown storage or image.
    """
    _choice("compile_cache", compile_cache, ("miss", "hit"))
    if compile_sizes < 0 or int(compile_sizes) != compile_sizes:
        raise ColdStartError(
            f"compile_sizes={compile_sizes!r} must be a whole number >= 0 "
            f"(the length of compilation_config.compile_sizes)"
        )
    if not compile_multiplier > 0:
        raise ColdStartError(f"compile_multiplier={compile_multiplier!r} must be > 0 (1 = the fitted compile time)")
    _choice("level", level, LEVELS)
    db = db or load_coldstart()
    coef = db.coefficients(engine)
    sc = db.scale_ranges(engine)
    if sc is None and vllm_version is not None:
        raise ColdStartError(
            f"vllm_version={vllm_version!r} needs a scale set for start-up set '{engine}' "
            f"(hwdb/data/coldstart/vllm-scale.yaml applies to vllm-v1)"
        )
    try:
        rules = sc.version(vllm_version) if sc is not None else _FIT_ONLY
    except HwdbError as exc:
        raise ColdStartError(str(exc)) from None
    mode = cudagraph_mode or rules.cudagraph_mode
    _choice("cudagraph_mode", mode, ("FULL_AND_PIECEWISE", "PIECEWISE", "NONE"))
    rule = capture_rule or rules.capture_rule

    def R(key: str, fitted: float) -> float:
        return sc.at(key, level) if sc is not None else fitted

    path = db.storage_path(storage)
    a, k = dep.arch, dep.knobs
    ranks = dep.tp * dep.pp
    layers = math.ceil(a.num_layers / dep.pp)
    moe_l = round(layers * a.moe_layers / a.num_layers) if a.is_moe else 0
    ckpt = a.total_params * WEIGHT_BYTES[dep.weight_dtype]
    p_rank = (a.active_params if a.is_moe else a.total_params) / ranks
    peak = dep.gpu.flops(dep.weight_dtype)
    eager = k.enforce_eager
    miss = compile_cache == "miss"
    ver = vllm_version or (sc.default_version if sc is not None else "fit")
    phases: list[Phase] = []

    if not image_cached:
        img = db.image(image)
        t = img.compressed_bytes.value / img.registry_Bps.value + img.uncompressed_bytes.value / img.extract_Bps.value
        phases.append(
            Phase(
                "image_pull",
                t,
                f"{img.name}: {img.compressed_bytes.value / 1e9:.1f} GB at "
                f"{img.registry_Bps.value / 1e6:.0f} MB/s + unpack {img.uncompressed_bytes.value / 1e9:.1f}"
                f" GB at {img.extract_Bps.value / 1e6:.0f} MB/s",
            )
        )
    phases.append(
        Phase(
            "process_start",
            R("process_start_s", coef.coef("process_start", "seconds")),
            f"{level} of the sourced range",
        )
    )
    if ranks > 1:
        base, per = R("distributed_init_s_base", coef.distributed_init_s.value), R("distributed_init_s_per_rank", 0.0)
        phases.append(
            Phase(
                "distributed_init",
                base + per * ranks,
                f"{base:.0f} s + {ranks} ranks x {per:.2f} s (worker spawn, NCCL)",
            )
        )
    pairs = dep.tp * (dep.tp - 1) // 2
    p2p_on = level == "high" or (level == "typical" and rules.p2p_check)  # high: VLLM_SKIP_P2P_CHECK=0
    if pairs and miss and p2p_on and sc is not None:
        per_pair = R("p2p_check_s_per_pair", 0.0)
        phases.append(
            Phase(
                "p2p_check",
                pairs * per_pair,
                f"{pairs} GPU pairs x {per_pair:.2f} s, no cached "
                f"gpu_p2p_access_cache file (vLLM {ver} runs it by default)"
                if rules.p2p_check
                else f"{pairs} GPU pairs x {per_pair:.2f} s (VLLM_SKIP_P2P_CHECK=0)",
            )
        )
    loader = R("loader_Bps_per_rank", coef.coef("weights_page_cache", "loader_Bps"))
    tw = weights_seconds(ckpt, ranks, path.bandwidth_Bps.value, path.latency_s.value, loader)
    phases.append(
        Phase(
            "weights",
            tw,
            f"{ckpt / 1e9:.1f} GB from {path.name} at {path.bandwidth_Bps.value / 1e9:.2f}"
            f" GB/s; {ckpt / ranks / 1e9:.1f} GB/rank at {loader / 1e9:.2f} GB/s",
        )
    )
    if not eager:
        w_dyn = R("dynamo_moe_layer_weight", 1.0)
        phases.append(
            Phase(
                "dynamo",
                dynamo_seconds(coef, layers, moe_l, w_dyn) * R("dynamo_multiplier", 1.0),
                f"{layers} layers/rank" + (f", {moe_l} MoE at x{w_dyn:.2f}" if moe_l else ""),
            )
        )
        unique = min(layers + 1, 3 + (moe_l if rules.moe_pieces_unique else 0))
        tc = compile_seconds(coef, layers, compile_cache, compile_sizes, unique, rules.repeat_pieces_compiled)
        if miss:
            tc *= compile_multiplier * R("compile_miss_multiplier", 1.0)
            what = f"cache miss: {unique} distinct of {layers + 1} pieces at {unique_piece_seconds(coef):.2f} s" + (
                ", repeats re-run AOTAutograd" if rules.repeat_pieces_compiled else ", repeats reused"
            )
        else:
            tc *= R("compile_hit_multiplier", 1.0)
            what = f"cache hit: load artifacts, {layers} layers/rank"
        extra = f", {compile_sizes} static sizes" if compile_sizes else ""
        mult = f", x{compile_multiplier:g} what-if" if compile_multiplier != 1 and miss else ""
        phases.append(Phase("compile", tc, f"{what}{extra}{mult}"))
    phases.append(
        Phase(
            "kv_profile",
            kv_profile_seconds(coef, layers, "hit" if eager else compile_cache),
            f"profile run, {layers} layers/rank",
        )
    )
    if not eager and miss and R("jit_kernels_s", 0.0) > 0:
        phases.append(Phase("jit_kernels", R("jit_kernels_s", 0.0), "first forward passes on an empty ~/.cache"))
    hopper_plus = dep.gpu.name.startswith(("H100", "H200", "H20", "B200", "B300", "GB"))
    if a.is_moe and dep.weight_dtype == "fp8" and hopper_plus and miss and R("deepgemm_warmup_s", 0.0) > 0:
        phases.append(Phase("deepgemm_warmup", R("deepgemm_warmup_s", 0.0), "FP8 MoE GEMM kernels, cold cache"))
    if not eager and mode != "NONE":
        sizes = (
            sorted(capture_sizes_override)
            if capture_sizes_override
            else capture_sizes(k.max_cudagraph_capture_size, k.max_num_batched_tokens, rule)
        )
        n, s = captured_graphs(sizes, k.max_num_seqs, mode, coef.full_graph_relative_cost.value)
        w_cap = R("capture_moe_layer_weight", 1.0)
        g1 = R("capture_s_per_graph_layer", coef.coef("cuda_graphs", "g1_s_per_graph_layer"))
        tg = capture_seconds(coef, n, s, layers + (w_cap - 1.0) * moe_l, p_rank, peak, g1)
        gc = R("capture_gc_s_per_size_layer", 0.0) * n * layers if rules.gc_per_capture_size and n else 0.0
        phases.append(
            Phase(
                "cuda_graphs",
                tg + gc,
                f"{len(sizes)} sizes up to {max(sizes) if sizes else 0}, {mode}: "
                f"{n:.0f} graphs, {g1 * 1e3:.2f} ms per graph-layer"
                + (f", MoE x{w_cap:.2f}" if moe_l else "")
                + (f", gc.collect per graph {gc:.0f} s" if gc else ""),
            )
        )
    phases.append(Phase("api_ready", coef.coef("api_ready", "seconds"), "fitted constant"))

    notes = []
    if layers > FIT_MAX_LAYERS:
        notes.append(
            f"{layers} layers/rank is beyond the fitted 24-{FIT_MAX_LAYERS}: Dynamo, compile, profiling "
            f"and capture scale per layer and per piece from the fit"
        )
    if a.total_params > FIT_MAX_PARAMS:
        notes.append(
            f"{a.total_params / 1e9:.0f}B parameters is beyond the fitted 0.5-14B: weights load scales "
            f"with bytes (physics), the rest with layers"
        )
    if ranks > 1:
        notes.append(
            f"TP x PP = {ranks}: ranks compile and capture concurrently; worker start, NCCL, P2P check, "
            f"per-rank loading and capture at TP > 1 are sourced ranges (vllm-scale.yaml), not fits"
        )
    if a.is_moe:
        notes.append(
            "MoE: Dynamo, distinct compiled pieces and capture weigh MoE layers from sourced logs "
            "(vllm-scale.yaml); compile tails of tens of minutes lie beyond the high end (outliers in "
            "vllm-v1.yaml)"
        )
    desc = (
        f"{a.name} on {ranks}x {dep.gpu.name} TP{dep.tp}"
        + (f" PP{dep.pp}" if dep.pp > 1 else "")
        + f" {dep.weight_dtype}, vLLM {ver}, compile cache {compile_cache}, weights from {path.name}, image "
        + ("cached" if image_cached else "pulled")
        + (f" [{level}]" if level != "typical" else "")
    )
    return Breakdown(tuple(phases), compile_cache, path.name, image_cached, desc, tuple(notes), level)
