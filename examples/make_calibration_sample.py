"""Regenerate examples/calibration_sample/: a small calibration bundle for the app's Calibration page.

It is synthetic: the simulator "measured" a tiny random-weight Llama (the harness's CPU test model) on
a known CPU-host profile, with 3% noise, the way ``epdsim calibrate run`` records a real server
(prefill sweep, decode sweeps at 1-8 users, an open-loop load test).  A fit of it should recover that
profile, which makes it a check of the page as much as a demonstration.  Run from the repository root:

    python examples/make_calibration_sample.py
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import hwdb  # noqa: E402 - after the sys.path entry: this checkout's packages
from tests import synthetic_bundle as sb  # noqa: E402 - after the sys.path entry (tests/ is not installed)

OUT = REPO / "examples" / "calibration_sample"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tiny = Path(tmp) / "tiny-llama"
        tiny.mkdir()
        (tiny / "config.json").write_text(json.dumps(sb.TINY_CONFIG))
        (tiny / "epdsim.yaml").write_text(yaml.safe_dump({"name": "tiny-llama", "source": "calibration harness"}))
        hw = sb.write_truth_hwdb(Path(tmp) / "truth", tiny, sb.CPU_TRUTH, hwdb.load())
        shutil.rmtree(OUT, ignore_errors=True)
        sb.make_bundle(OUT, hw, tiny, seed=0)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
