"""Shared by the perf-model validation tests (test_perf_validation.py, test_perf_vs_measured.py): the
kernel data folder, the step model of a model on a GPU, and the error tables they print."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from calibration.validation import perf_check as pc
from simulator.scenario import PoolConfig, deployment_for
from simulator.step_build import build_step_model

SHARED = Path(__file__).resolve().parents[2] / "shared"
KERNELS = SHARED / "data" / "kernels"
needs_shared = pytest.mark.skipif(
    not KERNELS.is_dir(), reason=f"{KERNELS} is absent (CI has ../shared); these tests read measured kernel data"
)


def deployment(db, model: str, gpu: str = "H100", tp: int = 1, dtype: str = "bf16", pp: int = 1):
    return deployment_for(PoolConfig(gpu=gpu, tp=tp, pp=pp, dtype=dtype), db.model(model), db)


def step_model(db, model: str, gpu: str = "H100", tp: int = 1, dtype: str = "bf16", pp: int = 1):
    return build_step_model(deployment(db, model, gpu, tp, dtype, pp))


def show(title: str, table: pd.DataFrame) -> None:
    print(f"\n{title}\n{pc.format_table(table)}")
