"""How sure a prediction is: the calibration status of what it rests on and its error band.

Each pool's prediction rests on three things, each with a status:

* the GPU: ``kernel-fitted`` (a calibration profile fitted on measured kernel tables) or
  ``datasheet only`` (peaks times default efficiencies);
* the engine: ``e2e-fitted`` (its per-layer and front-end terms were fitted on measured serving
  runs) or ``defaults``;
* the model family: ``validated end to end`` when the measured serving table holds runs of it on
  this engine (``fit`` or ``held-out`` family), else ``not validated``.

The error band is the mean absolute percentage error of mean TTFT and TPOT that the end-to-end
validation measured on held-out rows of this engine and GPU (or of this engine on any GPU when
the GPU has fewer than 20 rows), from ``hwdb/data/validation/e2e.json``, which
``epdsim validate-e2e --write-bands`` writes.  A pool on a datasheet-only GPU has no band.
"""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

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
    if dep.profile is not None:
        if gpu_band and gpu_band.get("rows", 0) >= MIN_ROWS:
            band = {**gpu_band, "basis": f"{eng.engine} held-out rows on {dep.gpu.name}"}
        elif engine_band.get("all"):
            band = {**engine_band["all"], "basis": f"{eng.engine} held-out rows, all GPUs"}
    return {
        "gpu": (f"kernel-fitted ({dep.profile.name})" if dep.profile is not None else "datasheet only"),
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
    return f"GPU {status['gpu']}; engine {status['engine']}; model {status['model_family']}; {b}"
