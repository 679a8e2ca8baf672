"""Cold-start data: storage paths, container images and fitted start-up coefficients.

Files live in ``hwdb/data/coldstart/`` (and ``coldstart/`` of a user hwdb
folder); each names its ``kind``:

* ``storage``: where the checkpoint is read from (local NVMe, a network file
  system, an object store, the node's page cache): a node-wide read bandwidth
  and a first-byte latency;
* ``image``: a serving container image: compressed and unpacked size, registry
  and unpack rates;
* ``scale``: low / typical / high ranges of the multi-GPU, large-model and
  MoE phases where sources disagree, and the sourced real start-ups they are
  checked against;
* ``startup``: the coefficients of the start-up phase formulas of one engine
  generation, least-squares fitted to measured start-ups, with the rows they
  were fitted to and the residuals kept beside them (``fits``).

Every figure is a :class:`hwdb.schema.Figure` (value in SI units + source +
``empirical`` flag).  Unknown keys are errors.  :func:`load_coldstart` reads
the shipped folder plus user folders (later folders win on name clashes).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from pydantic import model_validator

from hwdb.db import DATA_DIR, find
from hwdb.files import HwdbError, parse_file, read_data_yaml
from hwdb.loader import load_kind
from hwdb.schema import DATASHEET, Figure, StrictModel
from simulator.bounds import Range

Seconds = Annotated[float, Range(0, 1e6, "s", fix="give seconds")]
Residual = Annotated[float, Range(-1e6, 1e6, "s", fix="give seconds")]
Throughput = Annotated[Figure, Range(1e3, 1e13, "bytes/s", fix="give bytes per second")]
Size = Annotated[Figure, Range(1e3, 1e13, "bytes", fix="give bytes")]
Factor = Annotated[Figure, Range(0, 100, "times", fix="give a factor")]

COLDSTART_DIR = DATA_DIR / "coldstart"


class StoragePath(StrictModel):
    """A storage path for checkpoint files, as seen by one node."""

    kind: Literal["storage"]
    name: str
    aliases: tuple[str, ...] = ()
    description: str
    bandwidth_Bps: Throughput  # node-wide sustained read bandwidth of large files
    latency_s: Annotated[Figure, Range(0, 60, "s", fix="give seconds")]  # open / first byte
    notes: str | None = None


class ContainerImage(StrictModel):
    """A serving container image; pull = download of the compressed layers + unpack."""

    kind: Literal["image"]
    name: str
    aliases: tuple[str, ...] = ()
    compressed_bytes: Size
    uncompressed_bytes: Size
    registry_Bps: Throughput  # download rate from the registry to one node
    extract_Bps: Throughput  # unpack rate, in uncompressed bytes per second
    notes: str | None = None


class FitRow(StrictModel):
    """One measured row a coefficient set was fitted to: observed, predicted, residual (s)."""

    row: str
    observed_s: Seconds
    predicted_s: Residual
    residual_s: Residual


class PhaseFit(StrictModel):
    """A fitted phase formula: coefficients, the data, and the residuals of the fit."""

    formula: str
    coefficients: dict[
        str, Annotated[float, Range(-1e13, 1e13, fix="give the fitted coefficient in the formula's units")]
    ]
    data: str
    method: str
    rows: tuple[FitRow, ...]
    rms_s: Seconds
    max_abs_s: Seconds
    excluded: dict[str, str] = {}
    notes: str | None = None


class ProfiledModel(StrictModel):
    """Architecture facts of a model in the fitted data (read from its config.json)."""

    hf_id: str
    params: Annotated[float, Range(0, 1e14, "parameters", lo_open=True)]
    layers: Annotated[int, Range(1, 10_000, "layers", whole=True)]
    checkpoint_bytes_per_param: Annotated[float, Range(0, 8, "bytes", lo_open=True)] = 2.0


class Outlier(StrictModel):
    """A documented tail observation that the default formulas do not reproduce."""

    what: str
    seconds: Annotated[float, Range(0, 1e6, "s", lo_open=True, fix="give seconds")]
    source: str


class ProfiledHost(StrictModel):
    """A machine the fitted data was measured on."""

    description: str
    # dense bf16 peak of its GPU (for the capture compute term)
    peak_flops: Annotated[Figure, Range(1e9, 1e19, "FLOP/s", fix=DATASHEET)]
    source: str


class StartupCoefficients(StrictModel):
    """Start-up phase coefficients of one serving-engine generation (see simulator/ops/coldstart.py).

    ``fits`` holds the least-squares fitted phases (``process_start``,
    ``weights_storage``, ``weights_page_cache``, ``dynamo``, ``compile_miss``,
    ``compile_hit``, ``kv_profile``, ``cuda_graphs``, ``api_ready``); the
    figures below are not fitted (no data varies them) and say so.
    """

    kind: Literal["startup"]
    name: str
    aliases: tuple[str, ...] = ()
    engine_version_fitted: str
    distributed_init_s: Annotated[Figure, Range(0, 3600, "s", fix="give seconds")]
    compile_size_relative_cost: Factor
    full_graph_relative_cost: Factor
    fits: dict[str, PhaseFit]
    profiled_models: dict[str, ProfiledModel]
    profiled_hosts: dict[str, ProfiledHost]
    outliers: tuple[Outlier, ...] = ()
    notes: str | None = None

    def coef(self, phase: str, name: str) -> float:
        try:
            return self.fits[phase].coefficients[name]
        except KeyError:
            raise HwdbError(
                f"start-up coefficients '{self.name}': fits.{phase}.coefficients lacks '{name}'; "
                f"regenerate the file with calibration.coldstart.fit.fit_profiler_csvs"
            ) from None


RangeFigure = Annotated[float, Range(0, 1e13, fix="give the figure in the range's unit")]


class PhaseRange(StrictModel):
    """One start-up figure where sources disagree: low / typical / high, with the sources."""

    low: RangeFigure
    typical: RangeFigure
    high: RangeFigure
    unit: str
    sources: tuple[str, ...]

    def at(self, level: str) -> float:
        return {"low": self.low, "typical": self.typical, "high": self.high}[level]


class StartupCase(StrictModel):
    """A sourced real start-up the model is checked against (docs/operations.md table).

    ``observed_s`` is the sum of ``observed_phases`` as the source logged them
    (None: from container start to an answering API); ``logged`` keeps the
    per-phase seconds the source names; ``feeds`` lists the range keys one of
    whose bounds was read from this very run, so its check is partly circular.
    """

    name: str
    model: str
    gpu: str
    tp: Annotated[int, Range(1, 1024, "GPUs", whole=True)]
    dtype: str = "bf16"
    storage: str
    compile_cache: Literal["miss", "hit"]
    vllm_version: str = "0.11"
    capture_sizes: tuple[Annotated[int, Range(1, 1_000_000, "sequences", whole=True)], ...] | None = None
    observed_s: Annotated[float, Range(0, 1e6, "s", lo_open=True, fix="give seconds")]
    observed_phases: tuple[str, ...] | None = None
    logged: dict[str, Seconds] = {}
    feeds: tuple[str, ...] = ()
    level: Literal["low", "typical", "high"] = "typical"  # the end of the range it is checked against
    source: str


class VersionRules(StrictModel):
    """What one vLLM release does at start-up that switches phases on or off (sourced)."""

    capture_rule: Literal["0.10", "v1"]  # simulator.ops.coldstart_formulas.capture_sizes
    cudagraph_mode: Literal["FULL_AND_PIECEWISE", "PIECEWISE", "NONE"]
    gc_per_capture_size: bool  # gc.collect once per captured size (before vLLM PR #21146)
    p2p_check: bool  # custom all-reduce P2P access check on by default
    repeat_pieces_compiled: bool  # repeated per-layer pieces cost Inductor time (before PR #34003)
    moe_pieces_unique: bool  # every MoE layer's piece is a distinct graph (issue #29992)
    source: str


class ScaleRanges(StrictModel):
    """Multi-GPU / large-model / MoE phase ranges of one engine generation (simulator/ops/coldstart_scale.py)."""

    kind: Literal["scale"]
    name: str
    aliases: tuple[str, ...] = ()
    applies_to: str
    default_version: str
    ranges: dict[str, PhaseRange]
    versions: dict[str, VersionRules]
    cases: tuple[StartupCase, ...] = ()
    notes: str | None = None

    @model_validator(mode="after")
    def _consistent(self):
        if self.default_version not in self.versions:
            raise ValueError(
                f"default_version {self.default_version!r} is not one of versions ({', '.join(self.versions)})"
            )
        for case in self.cases:
            if case.vllm_version not in self.versions:
                raise ValueError(
                    f"case {case.name!r}: vllm_version {case.vllm_version!r} is not one of versions "
                    f"({', '.join(self.versions)})"
                )
            unknown = sorted(set(case.feeds) - set(self.ranges))
            if unknown:
                raise ValueError(f"case {case.name!r}: feeds names {unknown}, not keys of ranges")
        return self

    def at(self, key: str, level: str) -> float:
        try:
            return self.ranges[key].at(level)
        except KeyError:
            raise HwdbError(
                f"scale set '{self.name}': ranges lacks '{key}' or level '{level}' (levels: low, typical, high)"
            ) from None

    def version(self, name: str | None) -> VersionRules:
        """The rules of release ``name`` (None: ``default_version``); unknown names list the known ones."""
        key = self.default_version if name is None else str(name)
        if key not in self.versions:
            raise HwdbError(
                f"vllm_version={name!r} is unknown; use one of {', '.join(self.versions)} "
                f"(hwdb/data/coldstart/{self.name}.yaml, versions)"
            )
        return self.versions[key]


_KINDS: dict[str, type[StrictModel]] = {
    "storage": StoragePath,
    "image": ContainerImage,
    "startup": StartupCoefficients,
    "scale": ScaleRanges,
}


@dataclass(frozen=True)
class ColdStartDB:
    """Storage paths, images and start-up coefficient sets by name."""

    storage: dict[str, StoragePath] = field(default_factory=dict)
    images: dict[str, ContainerImage] = field(default_factory=dict)
    startup: dict[str, StartupCoefficients] = field(default_factory=dict)
    scale: dict[str, ScaleRanges] = field(default_factory=dict)
    # What a user folder replaces or shadows of the shipped data (hwdb.HardwareDB.notes says why these matter).
    notes: tuple[str, ...] = ()

    @staticmethod
    def _lookup(kind: str, table: dict, name: str):
        return find(
            kind, table, name, f"Add one as a YAML file (kind: {kind}) in a user hwdb folder's coldstart/ (--hwdb DIR)."
        )

    def storage_path(self, name: str) -> StoragePath:
        return self._lookup("storage", self.storage, name)

    def image(self, name: str) -> ContainerImage:
        return self._lookup("image", self.images, name)

    def coefficients(self, name: str) -> StartupCoefficients:
        return self._lookup("startup", self.startup, name)

    def scale_ranges(self, engine: str) -> ScaleRanges | None:
        """The range set for start-up set ``engine`` (``applies_to``), or None."""
        for s in self.scale.values():
            if s.applies_to == engine or s.name == engine:
                return s
        return None


def _parse(path: Path) -> StoragePath | ContainerImage | StartupCoefficients | ScaleRanges:
    kind = read_data_yaml(path).get("kind")
    if kind not in _KINDS:
        raise HwdbError(f"{path}: field 'kind' must be one of {sorted(_KINDS)} (got {kind!r})")
    return parse_file(path, _KINDS[kind])


def load_coldstart(user_dirs: Iterable[str | Path] = ()) -> ColdStartDB:
    """Read ``coldstart/*.yaml`` of the shipped database and of user hwdb folders, by the rules of
    :func:`hwdb.load` (:func:`hwdb.loader.load_kind`): one table per ``kind``, later folders win on name clashes."""
    tables, notes = load_kind("coldstart", _parse, user_dirs, table_of=lambda item: item.kind)
    return ColdStartDB(
        storage=tables.get("storage", {}),
        images=tables.get("image", {}),
        startup=tables.get("startup", {}),
        scale=tables.get("scale", {}),
        notes=notes,
    )
