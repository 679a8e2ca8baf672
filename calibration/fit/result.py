"""A bundle's fit as one record (:class:`BundleFit`): what :func:`calibration.fit.command.fit_bundle` returns and
:mod:`calibration.fit.report` writes.  Its own module so that the report needs nothing from the command."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import hwdb
from calibration.fit.engine_setup import EngineSetup
from calibration.fit.frontend import FrontEndFit
from calibration.fit.params import FitResult
from calibration.fit.points import Point
from calibration.harness.bundle import Bundle
from hwdb.profiles import Profile


@dataclass
class BundleFit:
    bundle: Bundle
    gpu: hwdb.GPU
    model: hwdb.ModelEntry
    setup: EngineSetup
    points: list[Point]
    notes: dict
    result: FitResult
    frontend: FrontEndFit
    profile: Profile
    provenance: dict
    deployment: Any = None
    host: dict | None = None  # calibration.fit.host.host_check's report (CPU servers)

    @property
    def derived_gpu(self) -> bool:
        """Whether ``gpu`` is a CPU-host entry derived from the bundle's host (written to gpus/)."""
        return bool(self.host and self.host.get("entry") == "derived")

    @property
    def frontend_s(self) -> float | None:
        """The front end's fixed delay on the way in (s), None when the bundle could not give it."""
        return self.frontend.frontend_s

    @property
    def engine_name(self) -> str:
        """The calibrated engine scenarios name (``engines/<profile>.yaml``, written by every fit)."""
        return self.profile.name
