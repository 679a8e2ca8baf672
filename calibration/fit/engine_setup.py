"""The engine arguments a bundle's server ran with (:class:`EngineSetup`), as the simulator's
EngineConfig needs them: from the command line's overrides, the server's logged ``non-default args``
(:func:`calibration.fit.inputs.logged_args`), its ``/metrics`` cache config and start-up log, and vLLM's
defaults for a CPU server."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from calibration.fit.inputs import FitInputError, is_cpu_server, logged_args
from calibration.harness.bundle import MANIFEST, Bundle

#: vLLM's batch defaults for the OpenAI server on a CPU platform, world size 1
#: (vllm 0.32 ``EngineArgs.get_batch_defaults``: max_num_batched_tokens 2048, max_num_seqs 128).
CPU_DEFAULT_MAX_NUM_SEQS = 128
CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


@dataclass(frozen=True)
class EngineSetup:
    """The engine arguments a bundle's server ran with, as the simulator's EngineConfig needs them."""

    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    block_size: int
    num_gpu_blocks: int | None
    enforce_eager: bool
    max_model_len: int | None
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    dtype: str
    tp: int
    pp: int
    sources: dict = field(default_factory=dict, compare=False)

    def engine_config(self) -> dict:
        """The ``engine:`` mapping of a scenario pool."""
        d = {
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "block_size": self.block_size,
            "enforce_eager": self.enforce_eager,
            "max_model_len": self.max_model_len,
            "num_gpu_blocks_override": self.num_gpu_blocks,
            "enable_chunked_prefill": self.enable_chunked_prefill,
            "enable_prefix_caching": self.enable_prefix_caching,
        }
        return {k: v for k, v in d.items() if v is not None}

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _truthy(v) -> bool:
    return v is True or str(v).lower() in ("true", "1", "yes")


def engine_setup(b: Bundle, overrides: dict | None = None) -> EngineSetup:
    """Engine arguments from the server's logged arguments and /metrics cache config.

    Order of precedence: ``overrides`` (command line), the ``non-default args`` line, the
    ``vllm:cache_config_info`` labels, vLLM's defaults for a CPU server (128 sequences, 2048
    tokens), else None (the simulator's defaults for the GPU)."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    args = logged_args(b)
    m = b.manifest
    cc = (m.get("engine") or {}).get("cache_config") or {}
    src: dict[str, str] = {}
    cpu = is_cpu_server(b)

    def pick(key, *cands):
        if key in overrides:
            src[key] = "command line"
            return overrides[key]
        for where, val in cands:
            if val is not None and val != "None":
                src[key] = where
                return val
        src[key] = "simulator default"
        return None

    seqs = pick(
        "max_num_seqs",
        ("server args", args.get("max_num_seqs")),
        ("vLLM CPU default", CPU_DEFAULT_MAX_NUM_SEQS if cpu else None),
    )
    toks = pick(
        "max_num_batched_tokens",
        ("server args", args.get("max_num_batched_tokens")),
        ("vLLM CPU default", CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS if cpu else None),
    )
    block = pick("block_size", ("server args", args.get("block_size")), ("cache_config", cc.get("block_size")))
    blocks = pick(
        "num_gpu_blocks",
        ("server args", args.get("num_gpu_blocks_override")),
        ("cache_config", cc.get("num_gpu_blocks")),
        ("start-up log", _kv_blocks_from_log(m, block)),
    )
    eager = pick("enforce_eager", ("server args", args.get("enforce_eager")))
    mml = pick(
        "max_model_len",
        ("server args", args.get("max_model_len")),
        ("/v1/models", (m.get("model") or {}).get("max_model_len")),
    )
    chunked = pick("enable_chunked_prefill", ("server args", args.get("enable_chunked_prefill")))
    prefix = pick(
        "enable_prefix_caching",
        ("server args", args.get("enable_prefix_caching")),
        ("cache_config", cc.get("enable_prefix_caching")),
    )
    tp = pick("tp", ("server args", args.get("tensor_parallel_size")))
    pp = pick("pp", ("server args", args.get("pipeline_parallel_size")))
    cfg = (m.get("model") or {}).get("config") or {}
    dtype = args.get("dtype") if args.get("dtype") not in (None, "auto") else cfg.get("dtype") or cfg.get("torch_dtype")
    dtype = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "bf16", None: "bf16"}.get(dtype, "bf16")
    block = int(block) if block is not None else 16
    if block not in (1, 8, 16, 32, 64, 128):
        raise FitInputError(
            f"{b.path / MANIFEST}: block size {block} is not one the simulator models "
            f"(1, 8, 16, 32, 64, 128); pass --block-size to override."
        )
    return EngineSetup(
        max_num_seqs=int(seqs) if seqs is not None else None,
        max_num_batched_tokens=int(toks) if toks is not None else None,
        block_size=block,
        num_gpu_blocks=int(blocks) if blocks is not None else None,
        enforce_eager=_truthy(eager) if eager is not None else False,
        max_model_len=int(mml) if mml is not None else None,
        enable_chunked_prefill=_truthy(chunked) if chunked is not None else True,
        enable_prefix_caching=_truthy(prefix) if prefix is not None else True,
        dtype=dtype,
        tp=int(tp or 1),
        pp=int(pp or 1),
        sources=src,
    )


def _kv_blocks_from_log(m: dict, block) -> int | None:
    if block in (None, "None"):
        return None
    for ln in reversed(m.get("launches") or []):
        tok = ((ln.get("startup") or {}).get("summary") or {}).get("kv_cache_tokens")
        if tok:
            return int(tok) // int(block)
    return None
