"""The run summary's shape: :class:`RunSummary` and the mappings nested in it, as ``TypedDict``\\ s.

:func:`simulator.engine.results.summarize` builds the required keys; :func:`simulator.run.simulate`
adds the optional sections (``NotRequired``) that apply to the run; ``epdsim simulate --out`` adds
``model_error_band``.  At run time each is a plain ``dict`` (so ``summary.json`` is what ``json.dumps``
makes of it); the types let mypy check every key read or written.  Units are SI: seconds (``_s``),
bytes (``_bytes``, ``_Bps`` bytes per second), requests per second (``_rps``), fractions in [0, 1];
money in US dollars.  Definitions: docs/metrics.md.

No ``from __future__ import annotations`` here: Python 3.11 reads ``NotRequired`` (``__optional_keys__``)
only off evaluated annotations.
"""

from typing import Any, Literal, NotRequired, TypedDict

# The statistics of a :class:`Percentiles` mapping, and the latency figures that are one.
PctKey = Literal["p50", "p90", "p99", "mean"]
LatencyKey = Literal["ttft_s", "tpot_s", "itl_s", "e2e_s", "queue_s"]


class Percentiles(TypedDict):
    """A latency distribution over completed requests (closed-loop warm-up left out), seconds; NaN when
    there is nothing to measure."""

    p50: float
    p90: float
    p99: float
    mean: float


class TTFTBreakdown(TypedDict, total=False):
    """Mean seconds of each phase of the time to first token over completed requests (0.0 where no
    request has the phase).  The encoder phases appear only in a multimodal run (an ``encode_s`` column)."""

    frontend: float  # API server on the way in
    encode_queue: float  # waiting for an encoder (multimodal)
    encode: float  # encoding the images (multimodal)
    embedding_transfer: float  # moving the embeddings to the language model (multimodal, E+P+D)
    queue: float  # waiting to be scheduled
    prefill: float
    transfer_wait: float  # PD: waiting for the KV transfer to start
    transfer: float  # PD: the KV transfer
    decode_admission: float  # PD: waiting for the decode side to admit the request


class PoolStats(TypedDict):
    """One pool's steps: step-duration weighted means, the maximum KV occupancy and the step count."""

    mean_batch_size: float  # sequences
    mean_kv_occupancy: float  # fraction of the KV cache in use
    max_kv_occupancy: float  # fraction
    steps: int


class LinkStats(TypedDict):
    """One fabric link over the run (:meth:`simulator.pd.fabric.Fabric.link_stats`)."""

    link: str
    capacity_Bps: float
    bytes_carried: float
    busy_s: float  # seconds with a transfer on the link
    utilisation: float  # bytes carried / (capacity x run time)


class Crossover(TypedDict):
    """PD: the bandwidth below which moving the mean prompt's KV takes longer than prefilling it
    (:func:`simulator.pd.pd.crossover_bandwidth`)."""

    prompt_tokens: int  # the run's mean prompt, rounded
    kv_bytes: float  # its KV cache, bytes
    prefill_s: float  # its prefill alone on a prefill instance
    crossover_Bps: float  # kv_bytes / prefill_s, bytes/s per instance


class EncoderSummary(TypedDict):
    """A multimodal run's vision encoding (:func:`simulator.epd.epd_flow.encoder_summary`)."""

    topology: str  # "colocated", "E+PD", "E+P+D", "EP+D" or "P+D" (simulator.epd.epd.topology)
    pool: str  # the encoder pool, or the language-model pool that encodes inline
    images: int  # images in the requests
    images_encoded: int  # encoder runs (cache misses)
    cache_hits: int
    cache_hit_rate: float  # hits / (hits + encoded); 0.0 without lookups
    utilisation: float  # mean over encoder instances of busy time / run span
    utilisation_per_instance: list[float]
    embedding_bytes_moved: float  # bytes of embeddings sent to the language model
    links: list[LinkStats]  # the encoder fabric's links; empty without one


class ScaleUp(TypedDict):
    """An autoscaler's scale-up decision."""

    pool: str
    decided_s: float
    serving_s: float | None  # when its capacity served; None if it never did
    cancelled_s: float | None  # when it was cancelled; None if it was not


class OpsEvent(TypedDict):
    """An autoscaler action."""

    time_s: float
    pool: str
    action: str  # "scale-up" | "scale-down"
    count: int  # instances
    why: str


class CrashRecord(TypedDict):
    """An instance crash (:meth:`simulator.engine.opsengine.OpsRun.crash`)."""

    time_s: float
    pool: str
    instance: int
    kind: str  # the fault: "node" (node failure) or "fp8" (FP8 outlier crash)
    reason: str
    requests: int  # requests on the instance when it crashed
    lost_kv_tokens: int


class InstanceLife(TypedDict):
    """One billed incarnation of an instance (:class:`simulator.engine.opsrecord.Life`)."""

    pool: str
    instance: int
    cause: str  # initial | scale-up | restart | replacement
    billed_s: float  # billing start
    ready_s: float | None  # when it began serving; None if it never did
    ended_s: float | None  # removal or crash; None if alive at the end
    end: str  # crash reason, "removed", "cancelled", or "" (alive at the end)
    gpus: int


class OperationsSummary(TypedDict):
    """An operations run's autoscaling and faults (definitions: :mod:`simulator.engine.opsresults`)."""

    failed: int  # requests ended by a crash or out of retries
    availability: float  # completed / (completed + rejected + failed)
    retried_requests: int
    retries: int
    discarded_tokens: int
    crashes: int
    crashes_by_kind: dict[str, int]
    gpu_hours: float  # GPU-hours billed
    cost_usd: float
    wasted_gpu_s: float  # starting_gpu_s + lost_work_gpu_s, GPU-seconds
    starting_gpu_s: float
    lost_work_gpu_s: float
    scale_ups: list[ScaleUp]
    slo_violations_during_scale_up: int
    slo_violations: int
    slo_violation_arrivals_s: list[float] | None  # [first, last] arrival of a violating request
    events: list[OpsEvent]
    crash_log: list[CrashRecord]
    link_degradations: int
    instances: list[InstanceLife]
    peak_instances: dict[str, int]  # per pool: most incarnations serving at once
    end_s: float  # end of the run (billing stops)


class RunSummary(TypedDict):
    """A run's headline figures (:attr:`simulator.engine.results.Results.summary`).  Latency figures
    cover completed requests; rates are over the span from the first arrival to the last finish."""

    requests: int
    completed: int
    rejected: int
    unfinished: int
    duration_s: float  # first arrival to last finish
    throughput_rps: float  # completed requests per second
    output_tokens_per_s: float
    total_tokens_per_s: float  # input and output tokens of completed requests per second
    output_tokens_per_s_per_gpu: float
    ttft_s: Percentiles
    tpot_s: Percentiles
    itl_s: Percentiles  # token gaps: step durations weighted by decode tokens, plus resume gaps
    e2e_s: Percentiles
    queue_s: Percentiles
    preemptions: int
    prefix_cache_hit_rate: float  # cached / input tokens
    mean_batch_size: float  # step-duration weighted, sequences
    mean_kv_occupancy: float  # step-duration weighted fraction
    max_kv_occupancy: float
    slo_attainment: float  # share of requests completed within every SLO; NaN without requests
    ttft_breakdown_mean_s: TTFTBreakdown
    pools: dict[str, PoolStats]  # per pool name
    gpus: int
    cost_usd_per_hour: float
    cost_usd_per_million_output_tokens: float  # inf without output
    # Optional sections, present where they apply:
    operations: NotRequired[OperationsSummary]  # a run with an operations block
    kv_bytes_moved: NotRequired[float]  # PD: KV cache bytes moved prefill -> decode
    links: NotRequired[list[LinkStats]]  # PD: the KV fabric's links
    crossover: NotRequired[Crossover]  # PD
    encoder: NotRequired[EncoderSummary]  # a multimodal run
    # ``epdsim simulate --out`` only: {"source", "basis", per banded figure ("ttft_s", ...) its
    # "relative_error" and "<stat>_low"/"<stat>_high" seconds} (simulator.cli.simulate.band_record).
    model_error_band: NotRequired[dict[str, Any]]
