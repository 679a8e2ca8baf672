"""How sure a prediction is: the calibration status of what it rests on and its error band.

Each pool's prediction rests on three things, each with a status:

* the GPU: ``kernel-fitted`` (a calibration profile fitted on measured kernel tables) or
  ``datasheet only`` (peaks times default efficiencies); ``profile_fallback`` says when the profile
  is of another engine version than the pool's (none of its version exists, the newest is used);
* the engine: ``e2e-fitted`` (its per-layer and front-end terms were fitted on measured serving
  runs) or ``defaults``;
* the model family: ``validated end to end`` when the measured serving table holds runs of it on
  this engine (``fit`` or ``held-out`` family), else ``not validated``.

The error band is the mean absolute percentage error of mean TTFT and TPOT that the end-to-end
validation measured: on this engine's rows of the model's family when it has at least 20 (held-out
rows, or a fitting family's own rows, said as such); for a family with no measured runs, the widest
band any held-out family of this engine showed (an unvalidated model does not borrow the average);
else on held-out rows of this engine and GPU (or of this engine on any GPU when the GPU has fewer
than 20 rows).  From ``hwdb/data/validation/e2e.json``, which ``epdsim validate-e2e --write-bands``
writes.  A pool on a datasheet-only GPU has no band.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

from hwdb.profiles import version_matches
from simulator import fmt
from simulator.engine_rules import expert_backend_note
from simulator.summary_types import LatencyKey, PctKey

BANDS = Path(__file__).resolve().parent.parent / "hwdb" / "data" / "validation" / "e2e.json"
MIN_ROWS = 20


@lru_cache(maxsize=4)
def _bands(path: str) -> dict:
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else {}


def assess(dep, bands_path: Path = BANDS) -> dict:
    """Status and error band of one resolved pool (a :class:`simulator.perf.Deployment`)."""
    bands = _bands(str(bands_path))
    eng = dep.engine
    engine_band = bands.get("engines", {}).get(eng.engine, {})
    gpu_band = engine_band.get("gpus", {}).get(dep.gpu.name)
    families = engine_band.get("families", {})
    family = next((v for k, v in families.items() if dep.arch.name.startswith(k)), None)
    e2e_fitted = eng.layer_overhead_s is not None or eng.moe_layer_overhead_s is not None
    band = None
    fam_name = next((k for k in families if dep.arch.name.startswith(k)), None)
    fam_band = engine_band.get("family_bands", {}).get(fam_name) if fam_name else None
    if dep.profile is not None:
        if fam_band and fam_band.get("rows", 0) >= MIN_ROWS:
            band = {**fam_band, "basis": f"{eng.engine} {fam_name} rows ({fam_band['split']})"}
        elif fam_name is None and engine_band.get("widest"):
            # No measured run of this family: the widest band any held-out family showed, not the average.
            band = {
                **engine_band["widest"],
                "basis": f"no {eng.engine} runs of {dep.arch.name} measured: the widest held-out family's band",
            }
        elif gpu_band and gpu_band.get("rows", 0) >= MIN_ROWS:
            band = {**gpu_band, "basis": f"{eng.engine} held-out rows on {dep.gpu.name}"}
        elif engine_band.get("all"):
            band = {**engine_band["all"], "basis": f"{eng.engine} held-out rows, all GPUs"}
    # The profile lookup falls back to the newest profile when none is of the engine's version; say so.
    fallback = ""
    if dep.profile is not None and not version_matches(dep.profile.engine_version, eng.version):
        fallback = (
            f"profile fitted under {dep.profile.engine} {dep.profile.engine_version}; none for "
            f"{eng.engine} {eng.version}, so the newest is used"
        )
    return {
        "gpu": (f"kernel-fitted ({dep.profile.name})" if dep.profile is not None else "datasheet only"),
        "profile_fallback": fallback,
        # the release ran its experts through a kernel no table measures (hwdb engine expert_backends)
        "unmeasured_experts": expert_backend_note(dep).removeprefix("; "),
        "engine": "e2e-fitted" if e2e_fitted else "defaults",
        "model_family": (f"validated end to end ({family})" if family else "not validated"),
        "error_band": band,
        "calibrated": dep.profile is not None,
    }


def describe(status: dict) -> str:
    """One line for a summary table."""
    band = status["error_band"]
    if band:
        b = f"validation error ~{band['ttft_mape']:.0%} TTFT, ~{band['tpot_mape']:.0%} TPOT ({band['basis']})"
    elif status["calibrated"]:
        b = "no error band: no held-out serving runs of this engine (epdsim validate-e2e --write-bands)"
    else:
        b = "no error band: datasheet figures only, nothing measured behind them"
    fallback = f" ({status['profile_fallback']})" if status.get("profile_fallback") else ""
    experts = f"; {status['unmeasured_experts']}" if status.get("unmeasured_experts") else ""
    return f"GPU {status['gpu']}{fallback}; engine {status['engine']}; model {status['model_family']}; {b}{experts}"


# Figures that carry a model error band: which pools' validation errors bound them, and which error
# (E2E is TTFT plus the decode time, so its relative error is at most the larger of the two).
BANDED: dict[LatencyKey, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "ttft_s": (("colocated", "prefill"), ("ttft_mape",)),
    "tpot_s": (("colocated", "decode"), ("tpot_mape",)),
    "e2e_s": (("colocated", "prefill", "decode"), ("ttft_mape", "tpot_mape")),
}
STATS: tuple[PctKey, ...] = ("p50", "p90", "p99", "mean")
BAND_SOURCE = (
    "model error from the end-to-end validation (hwdb/data/validation/e2e.json): the mean "
    "|relative error| of mean TTFT and TPOT on the validated subset that fits each pool "
    "(simulator/confidence.py), applied to each figure as value x (1 +/- error); not a seed-noise "
    "interval"
)


def error_bands(info: dict) -> dict[str, float | None]:
    """The relative model error band of each banded figure (``BANDED``), the widest of the pools it
    rests on; None where one of those pools has no band (datasheet only, or nothing validated).
    ``info``: a run's info (``{"pools": [{"role", "confidence": assess(...)}, ...]}``); pools without a
    ``confidence`` entry (encoder pools) are not counted."""
    pools = [p for p in info["pools"] if "confidence" in p]
    out: dict[str, float | None] = {}
    for key, (roles, errors) in BANDED.items():
        bands = [p["confidence"]["error_band"] for p in pools if p["role"] in roles]
        out[key] = max(b[e] for b in bands for e in errors) if bands and all(b is not None for b in bands) else None
    return out


def band_basis(info: dict) -> str:
    """Which validated subset each pool's band comes from, or why it has none."""
    parts = []
    for p in info["pools"]:
        status = p.get("confidence")
        if status is None:  # an encoder pool: its time is in TTFT, but no validation measured it
            parts.append(f"{p['name']}: {p['role']} pool, not validated")
            continue
        band = status["error_band"]
        why = (
            "datasheet figures only, nothing measured"
            if not status["calibrated"]
            else "no held-out serving runs of its engine"
        )
        parts.append(f"{p['name']}: " + (band["basis"] if band else why))
    return "; ".join(dict.fromkeys(parts))


def band_range(value: float, rel: float | None) -> tuple[float, float] | None:
    """(low, high) of ``value`` x (1 -/+ ``rel``), the low end not below 0; None without a band or a
    finite value."""
    if rel is None or not math.isfinite(value):
        return None
    return max(0.0, value * (1 - rel)), value * (1 + rel)


# The units fmt.duration writes, in seconds: a band is written in its figure's unit.
UNITS = {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def band_text(value: float, rel: float) -> str:
    """``value``'s band in its own unit, two figures or so (the band is a ± tens of percent): "(61–109)"."""
    if not math.isfinite(value) or value <= 0:
        return ""
    unit = UNITS.get(fmt.duration(value).rpartition(" ")[2], 1.0)
    ends = [max(0.0, value * (1 - rel)) / unit, value * (1 + rel) / unit]
    return "(" + "–".join(f"{v:.0f}" if v >= 10 else f"{v:.1f}" if v >= 1 else f"{v:.2f}" for v in ends) + ")"


def with_band(value: float, rel: float | None) -> str:
    """A duration and its model error band: "415 ms (275–555)"; the bare duration without a band."""
    text = fmt.duration(value)
    band = band_text(value, rel) if rel is not None else ""
    return f"{text} {band}" if band else text


def band_caption(info: dict, rel: dict[str, float | None]) -> str:
    """What the figures in brackets are, or that no band applies (and which pool lacks one)."""
    shown = {k: r for k, r in rel.items() if r is not None}
    if not shown:
        return f"model error band: no band ({band_basis(info) or 'no pool assessed'})"
    names = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E"}
    missing = [names[k] for k, r in rel.items() if r is None]
    return (
        "(low–high): model error band, the mean |error| of the end-to-end validation on the subset that "
        f"fits ({band_basis(info)}), applied to each figure: "
        + ", ".join(f"{names[k]} {r:.0%}" + (" (the larger)" if k == "e2e_s" else "") for k, r in shown.items())
        + "; "
        + ", ".join([*missing, "ITL", "queue"])
        + ": no band"
    )
