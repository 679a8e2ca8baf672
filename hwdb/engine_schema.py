"""Validated schema of a serving-engine profile (``hwdb/data/engines/*.yaml``): host costs, launch costs,
defaults, release-dependent rules and the fitted end-to-end terms, each sourced like every hardware figure."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from hwdb.schema import DATASHEET, Figure, HostCost, Latency, PerItemCost
from simulator.bounds import Range, Tokens
from simulator.strict_model import StrictModel

# A release's memory terms: bytes kept back, and factors on the profiling run's tensors.
MemoryBytes = Annotated[Figure, Range(0, 1e11, "bytes", fix=DATASHEET)]
MemoryFactor = Annotated[Figure, Range(0, 100, "times", fix=DATASHEET)]
Ratio = Annotated[Figure, Range(0, 1, "fraction", fix=DATASHEET)]  # an admission rule's KV ratio
Sequences = Annotated[int, Range(1, 1_000_000, "sequences", whole=True)]


class KvAutoRule(StrictModel):
    """How an engine resolves ``--kv-cache-dtype auto``: from release ``checkpoint_from`` on it takes the
    checkpoint's KV directive (:class:`KvDirective`), before it (and for checkpoints without one) the model's
    activation dtype."""

    checkpoint_from: str = Field(min_length=1)
    source: str = Field(min_length=3)


class WeightOnly(StrictModel):
    """A weight format the engine also serves weight-only on GPUs without that format's tensor cores: the
    GEMMs dequantise to bf16 (Marlin W8A16 for fp8, W4A16 kernels for 4-bit floats), so weights stream at
    the format's bytes while the math runs at the bf16 peak.  ``needs``: tensor-core dtypes the GPU must
    still have (a kernel written for Hopper needs its fp8 units)."""

    needs: tuple[Literal["fp8"], ...] = ()
    source: str = Field(min_length=3)


class ExpertBackendRule(StrictModel):
    """Releases before ``before`` ran a weight format's routed experts on the listed GPUs through a kernel the
    measured expert tables do not hold (the tables time the kernels of later releases).  The simulator keeps
    the measured curve and says so with the deployment's expert kernel; ``evidence`` is what is known of the
    difference, with its measurement."""

    format: str = Field(min_length=1)  # an expert format of hwdb/data/moe_kernels (fp8_block, ...)
    gpus: tuple[str, ...] = Field(min_length=1)
    before: str = Field(min_length=1)
    backend: str = Field(min_length=3)
    evidence: str = Field(min_length=3)
    source: str = Field(min_length=3)


class AsyncSchedulingRule(StrictModel):
    """From release ``since`` the engine schedules a step ahead by default on GPUs of ``vendors``: batch K+1 is
    scheduled when batch K is launched, so a prompt sent while K runs first joins K+2 (vLLM's async
    scheduling, SGLang's overlap scheduler).  Never with pipeline parallelism, which the engine does not
    schedule ahead, nor where the profile turns its overlap off (``overlap_with_linear_prefix_cache``)."""

    since: str = Field(min_length=1)
    vendors: tuple[Literal["nvidia", "amd", "intel", "other"], ...] = Field(min_length=1)
    source: str = Field(min_length=3)


class MemoryRelease(StrictModel):
    """The memory terms of one engine release on (later entries of :class:`EngineMemory` override earlier
    ones field by field).  Bytes, and dimensionless factors on the profiling run's tensors
    (simulator/memory.py has the formula each enters)."""

    since: str = Field(min_length=1)
    activation_base_bytes: MemoryBytes | None = None
    activation_per_token_hidden: MemoryFactor | None = None  # x max_num_batched_tokens x hidden x 2 B
    sampler_copies: MemoryFactor | None = None  # x max_num_seqs x vocab x 4 B
    moe_bytes: MemoryBytes | None = None  # more for a MoE model's routing buffers
    non_torch_bytes: MemoryBytes | None = None  # one GPU per rank (TP 1)
    non_torch_tp_bytes: MemoryBytes | None = None  # TP > 1: NCCL and custom all-reduce buffers
    graph_bytes: MemoryBytes | None = None  # CUDA-graph pool taken from the KV budget
    # gpu_memory_utilization's default
    default_fraction: Annotated[Figure, Range(0, 1, "fraction", lo_open=True, fix=DATASHEET)] | None = None
    # Linear-attention (Gated DeltaNet) state pool carved from the KV budget (SGLang): state bytes per KV bytes
    # (mamba_full_memory_ratio), and state slots per running request with the prefix cache on (1 with it off).
    linear_state_ratio: Annotated[Figure, Range(0, 100, "times", lo_open=True, fix=DATASHEET)] | None = None
    linear_state_running_ratio: Annotated[Figure, Range(1, 100, "times", fix=DATASHEET)] | None = None


class EngineMemory(StrictModel):
    """How an engine sizes its KV cache: ``policy`` names the rule (a key of simulator.memory.POLICIES),
    ``releases`` its terms, release by release, each with the measurements it came from."""

    policy: Literal["vllm", "sglang", "trtllm"]
    releases: tuple[MemoryRelease, ...] = Field(min_length=1)
    source: str = Field(min_length=3)


class AdmissionRule(StrictModel):
    """KV an engine keeps free for its running requests' future output before it admits another request.

    A waiting request is admitted only while the free KV covers ``ratio`` x the output the running requests
    have still to produce (each at most ``clip_tokens``) plus the newcomer's whole prompt and output.  The
    ratio starts at ``init_ratio`` and falls by (init - min) / ``decay_steps`` per step to ``min_ratio``
    (0 steps: constant); a preemption or an idle engine starts it again.  SGLang's new_token_ratio
    (0.7 down to 0.098 over 600 steps, outputs clipped at 4,096); TensorRT-LLM's GUARANTEED_NO_EVICT keeps
    every request's whole output (ratio 1).  vLLM keeps nothing back (None)."""

    init_ratio: Ratio
    min_ratio: Ratio
    decay_steps: Annotated[int, Range(0, 10**7, "steps", whole=True)] = 0
    clip_tokens: Tokens | None = None


class MemoryTierDefaults(StrictModel):
    """Defaults an engine picks from the GPU's memory (SGLang's ``server_args._handle_gpu_memory_settings``): the
    first tier of a profile whose ``below_gib`` exceeds the memory the GPU shows applies (None: any memory)."""

    below_gib: Annotated[float, Range(1, 100_000, "GiB")] | None = None
    max_num_batched_tokens: Tokens  # chunked_prefill_size
    max_capture_size: Sequences  # cuda_graph_max_bs below tp 4 ...
    max_capture_size_tp4: Sequences | None = None  # ... and from tp 4 (None: the same)
    source: str = Field(min_length=3)


class CpuCosts(StrictModel):
    """Host (CPU) work of one engine step, in seconds.

    cost = ``step_s`` + ``per_running_seq_s`` x running + ``per_waiting_seq_s`` x waiting
           + ``per_token_s`` x tokens in the step + ``per_sampled_seq_s`` x sequences sampled.
    """

    step_s: HostCost
    per_running_seq_s: PerItemCost
    per_waiting_seq_s: PerItemCost
    per_token_s: PerItemCost
    per_sampled_seq_s: PerItemCost


class EngineProfile(StrictModel):
    """One serving-engine generation: its CPU side, kernel launches and defaults.

    Step time = GPU time + launch cost + CPU cost when scheduling is serial;
    max(GPU time + launch cost, CPU cost) when the engine prepares the next
    step while the GPU runs the current one (``scheduling_overlapped``).
    Launch cost is ``graph_launch_s`` when the step fits a captured CUDA graph
    (any step with ``graphs_for_mixed_batches``, else decode-only steps), else
    ``eager_launch_s_per_layer`` x layers.  ``max_capture_size`` None means
    vLLM V1's rule, min(2 x max_num_seqs, 512).
    """

    name: str
    aliases: tuple[str, ...] = ()
    engine: str
    version: str
    scheduling_overlapped: bool
    # False: the overlap scheduler is switched off for a linear-attention model while the prefix cache is on
    # (SGLang's mamba "no_buffer" strategy cannot overlap), so such steps pay GPU + host time.
    overlap_with_linear_prefix_cache: bool = True
    cpu: CpuCosts
    graph_launch_s: HostCost
    eager_launch_s_per_layer: PerItemCost
    graphs_for_mixed_batches: bool
    max_capture_size: Sequences | None = None
    # --kv-cache-dtype auto: from which release the checkpoint's KV directive is taken (None: never, the
    # activation dtype always).
    kv_auto: KvAutoRule | None = None
    # How routed tokens reach their experts under attention data parallelism: 'allgather' (every GPU
    # receives every rank's tokens and permutes them all: vLLM's default all2all backend
    # allgather_reducescatter), or 'all_to_all' (a GPU receives only the rows routed to its experts:
    # DeepEP in SGLang and TensorRT-LLM).
    moe_dispatch: Literal["allgather", "all_to_all"] = "allgather"
    # Formats it runs weight-only where the GPU lacks their tensor cores (absent: such a deployment is refused).
    weight_only: dict[Literal["fp8", "fp4"], WeightOnly] = {}
    # Earlier releases' expert kernels the measured tables do not hold (named with the deployment's kernel).
    expert_backends: tuple[ExpertBackendRule, ...] = ()
    # Which releases schedule a step ahead by default (None: none; a prompt joins the step after it arrives).
    async_scheduling: AsyncSchedulingRule | None = None
    # What it keeps back from the KV cache (simulator/memory.py); None: vLLM's rule with its 0.19 terms.
    memory: EngineMemory | None = None
    # KV it keeps free for running requests' future output at admission (None: none, as vLLM).
    admission: AdmissionRule | None = None
    # Attention DP: a rank holds new prompts back up to this many steps until every rank has one, so the
    # ranks prefill together (TensorRT-LLM's attention_dp_config enable_balance / timeout_iters); None: never.
    dp_context_wait_steps: Annotated[int, Range(1, 10_000, "steps", whole=True)] | None = None
    # End-to-end terms fitted on measured serving runs (calibration/e2e/fit.py, docs/validation/e2e.md):
    # a fixed GPU time per decoder layer per step (kernel floors and gaps between the ~15 small
    # kernels of a layer, independent of TP: the measured TPOT at TP1..8 leaves the same residual),
    # and the client-visible front end before the engine sees a request (HTTP, tokenisation,
    # detokenisation and streaming of the first token): ``frontend_s`` + ``frontend_s_per_token`` x prompt.
    # ``frontend_serial_s_per_token``: the way in's serial part, per prompt token, one request at a time in
    # the order they were sent (the API server's tokenizer/renderer: vLLM renderer_num_workers = 1);
    # fitted by `calibrate fit` from lone requests' client - server TTFT, which a GPU end-to-end fit cannot see.
    # The way out, the API server's event loop per instance (vLLM AsyncLLM.output_handler): each engine
    # output processed ``frontend_stream_s_per_output`` (detokenise, queue to its request), then each
    # request with outputs waiting streams them in one SSE chunk, ``frontend_stream_s_per_chunk`` (its
    # first ``frontend_stream_s_per_request`` more); fitted by `calibrate fit` from the harness's client
    # and server timestamps (simulator/engine/frontend.py).
    layer_overhead_s: PerItemCost | None = None
    moe_layer_overhead_s: PerItemCost | None = None  # more per MoE layer: routing, top-k, permutation, grouped GEMM
    # Per GPU type: a factor on both per-layer terms (kernel floors differ between GPU generations);
    # a GPU not listed uses 1, the GPU the terms were fitted on.
    layer_overhead_scale: dict[
        str, Annotated[Figure, Range(0, 100, "times", lo_open=True, fix="give a factor such as 1.5")]
    ] = {}
    frontend_s: Latency | None = None
    frontend_s_per_token: PerItemCost | None = None
    frontend_serial_s_per_token: PerItemCost | None = None
    frontend_stream_s_per_output: PerItemCost | None = None
    frontend_stream_s_per_chunk: Latency | None = None
    frontend_stream_s_per_request: Latency | None = None  # more for a request's first token (its stream opens)
    default_chunked_prefill: bool
    default_prefix_caching: bool
    default_max_num_seqs: Sequences | None = None
    default_max_num_batched_tokens: Tokens | None = None
    # Token budget and CUDA-graph size that follow the GPU's memory, in increasing ``below_gib`` order (empty:
    # the two defaults above, whatever the GPU).
    memory_tiers: tuple[MemoryTierDefaults, ...] = ()
    defaults_source: str
    notes: str | None = None

    @field_validator("memory_tiers")
    @classmethod
    def _tiers_in_order(cls, v: tuple[MemoryTierDefaults, ...]) -> tuple[MemoryTierDefaults, ...]:
        # The first tier above the GPU's memory applies, so an unordered list would pick a wrong one silently.
        bounds = [t.below_gib for t in v]
        if None in bounds[:-1] or any(b <= a for a, b in zip(bounds, bounds[1:], strict=False) if a and b):
            shown = ", ".join("none" if b is None else f"{b:g}" for b in bounds)
            raise ValueError(
                f"below_gib must increase from tier to tier, with none (any memory) only last; got {shown}: "
                "sort the tiers by below_gib"
            )
        return v

    def memory_tier(self, visible_bytes: float, tp: int) -> tuple[int | None, int | None]:
        """(token budget, CUDA-graph size) this engine defaults to on a GPU showing ``visible_bytes`` at ``tp``
        (:class:`MemoryTierDefaults`); the profile's own defaults where it has no tiers."""
        gib = visible_bytes / 2**30
        for tier in self.memory_tiers:
            if tier.below_gib is None or gib < tier.below_gib:
                size = tier.max_capture_size_tp4 if tp >= 4 and tier.max_capture_size_tp4 else tier.max_capture_size
                return tier.max_num_batched_tokens, size
        return self.default_max_num_batched_tokens, self.max_capture_size
