"""Hardware database: GPUs, links, models and calibration profiles as sourced data files."""

from hwdb.db import HardwareDB, ModelEntry, load_model_dir
from hwdb.engine_schema import EngineProfile
from hwdb.files import HwdbError
from hwdb.hf_config import arch_from_config
from hwdb.loader import load
from hwdb.models import ModelArch
from hwdb.schema import DTYPE_BYTES, GPU, EfficiencyCurve, Figure, Link

__all__ = [
    "HardwareDB",
    "HwdbError",
    "ModelEntry",
    "load",
    "load_model_dir",
    "ModelArch",
    "arch_from_config",
    "DTYPE_BYTES",
    "EngineProfile",
    "GPU",
    "EfficiencyCurve",
    "Figure",
    "Link",
]
