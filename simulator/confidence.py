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
from functools import lru_cache
from pathlib import Path

from hwdb.profiles import version_matches

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
            band = {**engine_band["widest"], "basis": f"no {eng.engine} runs of {dep.arch.name} measured: the widest "
                                                      f"held-out family's band"}
        elif gpu_band and gpu_band.get("rows", 0) >= MIN_ROWS:
            band = {**gpu_band, "basis": f"{eng.engine} held-out rows on {dep.gpu.name}"}
        elif engine_band.get("all"):
            band = {**engine_band["all"], "basis": f"{eng.engine} held-out rows, all GPUs"}
    # The profile lookup falls back to the newest profile when none is of the engine's version; say so.
    fallback = ""
    if dep.profile is not None and not version_matches(dep.profile.engine_version, eng.version):
        fallback = (f"profile fitted under {dep.profile.engine} {dep.profile.engine_version}; none for "
                    f"{eng.engine} {eng.version}, so the newest is used")
    return {
        "gpu": (f"kernel-fitted ({dep.profile.name})" if dep.profile is not None else "datasheet only"),
        "profile_fallback": fallback,
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
    return f"GPU {status['gpu']}{fallback}; engine {status['engine']}; model {status['model_family']}; {b}"
