"""Calibration profiles: fitted efficiencies that override a GPU's defaults.

A profile is produced by fitting measurements (kernel tables or engine runs)
and records where they came from, the fitted curves and their residuals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from hwdb.schema import AllReduceCurve, EfficiencyCurve, GemmShapeCurve
from simulator.bounds import Range

RelError = Annotated[float, Range(0, 1e3, fix="give the error as a fraction of the measured value (0.1 = 10 %)")]
# the fit's own bound (calibration/fit/params.py)
Overhead = Annotated[float, Range(0, 10, "s", fix="give seconds per step")]


class FitQuality(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    n_points: Annotated[int, Range(0, 10**9, "points", whole=True)]
    median_abs_rel_error: RelError
    p90_abs_rel_error: RelError
    held_out_median_abs_rel_error: RelError | None = None


class Profile(BaseModel):
    """Fitted efficiency curves for one (GPU, engine, engine version[, model]).

    ``model``: the model an end-to-end (harness) fit measured, whose curves hold for that model only;
    None for kernel fits, which hold for any model.  Lookup: :meth:`hwdb.db.HardwareDB.find_profile`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    gpu: str
    engine: str = "vllm"
    engine_version: str
    model: str | None = None
    created: str
    source: str = Field(min_length=3)
    method: str
    compute_efficiency: EfficiencyCurve | None = None
    compute_efficiency_fp8: EfficiencyCurve | None = None
    memory_efficiency: EfficiencyCurve | None = None
    attention_prefill_efficiency: EfficiencyCurve | None = None
    attention_decode_efficiency: EfficiencyCurve | None = None
    # Per compute dtype (bf16, fp8, fp4): GEMM efficiency by rows and weight shape; when present the
    # step model derives each deployment's compute curve from its own per-rank GEMM shapes.
    gemm_shape_efficiency: dict[str, GemmShapeCurve] = {}
    # The engine's tensor-parallel all-reduce as measured (latency by message size per TP size);
    # when present it replaces the intra-node link's alpha-beta estimate.
    allreduce: AllReduceCurve | None = None
    step_overhead_s: Overhead | None = None
    # More host time in a step that carries a prompt chunk than in a decode-only step (a harness fit,
    # when its data resolves the two; new-request bookkeeping, prefill metadata); added to every such step.
    prefill_step_overhead_s: Overhead | None = None
    quality: dict[str, FitQuality] = {}
    notes: str | None = None


def version_matches(fitted: str, wanted: str) -> bool:
    """Whether a profile fitted under engine version ``fitted`` is one of version ``wanted``: equal, or
    ``wanted`` a release line of it ("0.11" covers "0.11.2", not "0.110")."""
    return fitted == wanted or fitted.startswith(wanted + ".")


@dataclass(frozen=True)
class ProfileMatch:
    """A profile lookup's answer: the profile (None: no profile for that GPU and engine) and, when it
    is not of the version asked for, why it was taken anyway (``fallback``; "" for an exact match)."""

    profile: Profile | None
    fallback: str = ""
