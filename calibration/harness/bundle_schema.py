"""What a bundle's manifest and records may hold, as pydantic models, and their errors as messages.

The models describe what ``epdsim calibrate run`` (and ``python -m calibration.harness.kernels``) write,
with every field the writers may leave out optional and every other key allowed: they refuse a value
of the wrong kind or out of its physical range, never a real bundle.  Each error names the file (and
the line of a record), the field, the value and the fix, through the formatter scenarios use
(:func:`simulator.errors.format_validation_error`) and the ranges they share (:mod:`simulator.bounds`).

A request record is checked at two levels: :func:`check_record` takes any record the bundle's own
bookkeeping can use (resume, phase ends); with ``complete`` it also needs the measurements that
``calibrate show``, ``fit`` and ``validate`` read (``ttft_s``, ``token_times_s``, ...), which a
successful request's record always has.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError

from simulator.bounds import MAX_SECONDS, MAX_TOKENS, Range
from simulator.errors import format_validation_error

SCHEMA_VERSION = 1
PHASE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
DOCS = "docs/calibration.md"
FIX = (
    f"fix: restore the value `epdsim calibrate run` wrote ({DOCS} describes the bundle), "
    f"or measure again into a new folder"
)

# written as Annotated types (simulator/bounds.py): a type checker reads the float or int, pydantic the Range
Seconds = Annotated[float, Range(0, MAX_SECONDS, "s", fix="give seconds, as the harness recorded them")]
Millis = Annotated[float, Range(0, MAX_SECONDS * 1e3, "ms", fix="give milliseconds, as vLLM reported them")]
Epoch = Annotated[float, Range(0, 1e11, "s since 1970", fix="give the wall-clock time of the send (Unix seconds)")]
Tokens = Annotated[int, Range(0, MAX_TOKENS, "tokens", whole=True)]
Index = Annotated[int, Range(0, 10**9, whole=True)]
Rate = Annotated[float, Range(0, 1e7, "requests/s", fix="give requests per second")]
Load = Annotated[float, Range(0, 1e6, fix="give the 1-, 5- and 15-minute load averages")]
KvTokens = Annotated[int, Range(0, 10**12, "tokens", whole=True)]


def _phase_name(v: str) -> str:
    if not PHASE_NAME.match(v):
        raise ValueError(
            "a phase name is letters, digits, '_', '.' and '-', starting with a letter or digit "
            "(it names the file records/<name>.jsonl); rename the phase"
        )
    return v


def _version(v):
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(
            f"must be the whole number {SCHEMA_VERSION}, not {type(v).__name__} {v!r}: "
            f"write {SCHEMA_VERSION} without quotes"
        )
    return v


def _named(v: str) -> str:
    if not v.strip():
        raise ValueError("must name the model the server served (the --served-model-name), not be empty")
    return v


PhaseName = Annotated[str, AfterValidator(_phase_name)]


class _Open(BaseModel):
    """Unknown keys are kept: the writers add fields over time, and readers ignore what they don't use."""

    model_config = ConfigDict(extra="allow", strict=False)


# ----------------------------------------------------------------------------- manifest
class ModelInfo(_Open):
    served_name: Annotated[str, AfterValidator(_named)]
    max_model_len: Tokens | None = None
    root: str | None = None
    config: dict[str, Any] | None = None
    config_sha256: str | None = None


class PlannedPhase(_Open):
    name: PhaseName
    kind: str | None = None
    mode: str | None = None
    concurrency: Index | None = None
    rate: Rate | None = None
    requests: list[tuple[str, Tokens, Tokens, Seconds | None]] | None = None


class StartupSummary(_Open):
    weights_load_s: Seconds | None = None
    torch_compile_s: Seconds | None = None
    cuda_graph_capture_s: Seconds | None = None
    engine_init_s: Seconds | None = None
    api_ready_t: Seconds | None = None
    kv_cache_tokens: KvTokens | None = None


class Startup(_Open):
    summary: StartupSummary = StartupSummary()
    events: list[dict[str, Any]] = []


class Pin(_Open):
    engine_cpus: list[Index]
    front_cpus: list[Index]


class Launch(_Open):
    index: Index | None = None
    ready_s: Seconds | None = None
    exit_code: int | None = None
    startup: Startup | None = None
    pin: Pin | None = None


class Attachment(_Open):
    url: str | None = None
    server_log: str | None = None
    startup: Startup | None = None


class Conditions(_Open):
    loadavg: list[Load] | None = None


class Run(_Open):
    started: str | None = None
    finished: str | None = None
    status: str | None = None
    conditions: dict[str, Conditions | None] | None = None


class Manifest(_Open):
    schema_version: Annotated[int, BeforeValidator(_version)]
    created: str
    mode: str
    model: ModelInfo
    plan: list[PlannedPhase]
    runs: list[Run] = []
    launches: list[Launch] = []
    attachments: list[Attachment] = []
    versions: dict[str, Any] | None = None
    hardware: dict[str, Any] | None = None
    engine: dict[str, Any] | None = None


# ----------------------------------------------------------------------------- records
class ServerMetrics(_Open):
    time_to_first_token_ms: Millis | None = None
    mean_itl_ms: Millis | None = None


class Record(_Open):
    kind: Literal["phase_start", "request", "metrics", "phase_done", "note"]
    segment: Index | None = None
    phase: str | None = None


class MetricsRecord(Record):
    histograms: dict[str, list[dict[str, Any]]] | None = None
    counters: dict[str, float | None] | None = None


class FailedRequest(Record):
    """A request that failed: its figures are whatever the failure left (NaN, null) and none is read."""

    id: str
    ok: bool
    model: str | None = None


class RequestRecord(FailedRequest):
    """Any successful request record the bundle's bookkeeping can use: the measurements it has,
    each of its kind and range."""

    t_send: Epoch | None = None
    ttft_s: Seconds | None = None
    e2e_s: Seconds | None = None
    token_times_s: list[Seconds] | None = None
    prompt_tokens: Tokens | None = None
    output_tokens: Tokens | None = None
    server_metrics: ServerMetrics | None = None


class MeasuredRequest(RequestRecord):
    """A successful request of a measurement bundle: the fields every reader of its figures needs
    (the harness writes them all; a time is null when no token came)."""

    t_send: Epoch
    ttft_s: Seconds | None
    e2e_s: Seconds | None
    token_times_s: list[Seconds]
    prompt_tokens: Tokens | None
    output_tokens: Tokens | None


class KernelRequest(RequestRecord):
    seconds: Seconds | None = None


def _error(err: ValidationError, data, root: type[BaseModel], origin: str, what: str) -> str:
    return format_validation_error(err, data, root=root, origin=origin, what=what, docs=DOCS) + "\n  " + FIX


def check_manifest(mf: Path, m: dict) -> Manifest:
    """``m`` (the parsed ``manifest.json`` at ``mf``) as a :class:`Manifest`; ValueError says what is wrong."""
    try:
        return Manifest.model_validate(m)
    except ValidationError as exc:
        raise ValueError(_error(exc, m, Manifest, str(mf), "bundle manifest")) from None


def check_record(f: Path, line: int, rec: dict, mode: str | None, complete: bool = False) -> None:
    """One record of ``f`` (at ``line``); ValueError names the file, line, field, value and fix."""
    model: type[Record]
    if rec.get("kind") == "request":
        model = (
            FailedRequest
            if rec.get("ok") is not True
            else KernelRequest
            if mode == "kernels"
            else MeasuredRequest
            if complete
            else RequestRecord
        )
    else:
        model = MetricsRecord if rec.get("kind") == "metrics" else Record
    try:
        model.model_validate(rec)
    except ValidationError as exc:
        kind = rec.get("kind") if isinstance(rec.get("kind"), str) else "bundle"
        raise ValueError(_error(exc, rec, model, f"{f} line {line}", f"{kind} record")) from None
