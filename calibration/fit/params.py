"""The parameters a step-time fit fits (:data:`PARAMS`: efficiencies, the compute curve's half point,
per-step and per-sequence host costs), their bounds and units, those that fall back to the simulator's
default, and :class:`FitResult`, what a fit of them returns (:func:`calibration.fit.solver.fit_points`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hwdb.profiles import FitQuality

PARAMS = (
    "compute_max_eff",
    "compute_half",
    "attention_max_eff",
    "memory_max_eff",
    "kv_max_eff",
    "step_overhead_s",
    "prefill_overhead_s",
    "per_seq_s",
)
#: bounds of each parameter (linear units); the fit works on their logarithms
BOUNDS = {
    "compute_max_eff": (1e-6, 1.0),
    "compute_half": (1e-2, 1e6),
    "attention_max_eff": (1e-6, 1.0),
    "memory_max_eff": (1e-4, 1.0),
    "kv_max_eff": (1e-5, 1.0),
    "step_overhead_s": (1e-7, 10.0),
    "prefill_overhead_s": (1e-7, 10.0),
    "per_seq_s": (1e-8, 1.0),
}
UNITS = {
    "compute_max_eff": "",
    "compute_half": "tokens",
    "attention_max_eff": "",
    "memory_max_eff": "",
    "kv_max_eff": "",
    "step_overhead_s": "s",
    "prefill_overhead_s": "s",
    "per_seq_s": "s",
}
#: parameters that fall back to the simulator's default when the data cannot determine them
#: (attention: the compute curve; memory: the GPU's curve; kv: the memory curve; prefill_overhead_s: none,
#: i.e. a step that carries a prompt chunk has the same overhead as a decode-only one; per_seq_s: none, i.e. 0)
OPTIONAL = ("attention_max_eff", "memory_max_eff", "kv_max_eff", "prefill_overhead_s", "per_seq_s")


@dataclass
class FitResult:
    params: dict[str, float]  # every parameter the profile sets
    free: list[str]  # fitted
    fixed: dict[str, str]  # name -> why it was not fitted
    sigma_rel: dict[str, float]  # relative standard error of each free parameter
    correlation: list[list[float | None]]  # None where undefined (a parameter without spread)
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
