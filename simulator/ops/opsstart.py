"""How long a new or restarted instance takes to serve: cold start behind probes.

:func:`start_times` runs the pod model (:func:`simulator.ops.k8s.simulate_pod`)
once for each kind of start, over the cold-start phases of the pool's
deployment (:func:`simulator.ops.coldstart.breakdown`):

* **new** (scale-up, node replacement): ``provisioning_s``, then a pod on a
  fresh node: image pulled unless ``image_cached``, compile cache hit only
  with a ``persistent`` cache volume;
* **restart** (a crashed container, restarted by the kubelet on the same
  node after its CrashLoopBackOff delay): image on the node, compile cache
  hit with a ``pod`` or ``persistent`` cache volume.

The delay is the pod's Ready time, so probe periods and crash loops count; a
start the probes never let finish gives ``None`` (the instance never serves).
"""

from __future__ import annotations

import hwdb
from hwdb.coldstart import load_coldstart
from simulator.ops.coldstart import CompileCache, breakdown
from simulator.ops.coldstart_formulas import ColdStartError
from simulator.ops.k8s import recommend_probes, simulate_pod
from simulator.ops.probe_spec import PodSpec, ProbeError

HORIZON_S = 3600.0


class StartupError(ValueError):
    """The start-up model cannot be built (cold-start data, probes); the message names the field."""


class StartTimes:
    """Delays (seconds) from ordering an instance to its first request, for one pool.

    A plain record of the pod model's results: :func:`start_times` computes them (once, when the
    scenario is resolved)."""

    def __init__(self, provisioning_s: float, new_breakdown, restart_breakdown, new, restart, pod_spec) -> None:
        self.provisioning_s = provisioning_s
        self.new_breakdown = new_breakdown
        self.restart_breakdown = restart_breakdown
        self.new = new  # simulator.ops.k8s pod result of a new instance
        self.restart = restart  # ... and of a restarted container
        self.pod_spec = pod_spec

    def new_delay(self) -> float | None:
        """Order -> serving for a new instance: provisioning plus the pod's Ready time."""
        return None if self.new.never_ready else self.provisioning_s + self.new.ready_s

    def restart_delay(self) -> float | None:
        """Container restart -> serving (the back-off before it is added by the caller)."""
        return None if self.restart.never_ready else self.restart.ready_s

    def never_reason(self, cause: str) -> str:
        res = self.restart if cause == "restart" else self.new
        return res.reason or "never ready"

    def describe(self) -> dict:
        return {
            "provisioning_s": self.provisioning_s,
            "new_start": self.new_breakdown.description,
            "new_ready_s": self.new.ready_s,
            "new_serving_delay_s": self.new_delay(),
            "restart_start": self.restart_breakdown.description,
            "restart_ready_s": self.restart.ready_s,
            "never_ready": self.new.reason if self.new.never_ready else None,
        }


def start_times(dep, cfg, hwdb_dirs=(), field: str = "operations.startup") -> StartTimes:
    """Run the pod model for ``dep`` under start-up config ``cfg``; raises :class:`StartupError`."""
    try:
        db = load_coldstart(hwdb_dirs)

        def bd(cache: CompileCache, image_cached: bool, level: str = "typical"):
            return breakdown(dep, cache, cfg.storage, image_cached, db=db, level=level)

        volume = cfg.compile_cache != "none"
        new_cold, new_warm = bd("miss", cfg.image_cached), bd("hit", cfg.image_cached)
        re_cold, re_warm = bd("miss", True), bd("hit", True)
        if cfg.probes == "recommended":
            # sized on the high end of the sourced range (simulator/ops/coldstart_scale.py)
            spec = recommend_probes(bd("miss", cfg.image_cached, "high"), cfg.margin).pod_spec(volume)
        else:
            startup, liveness, readiness = (
                getattr(cfg, n).probe() if getattr(cfg, n) is not None else None
                for n in ("startup_probe", "liveness", "readiness")
            )
            spec = PodSpec(startup, liveness, readiness, compile_cache_volume=volume)
    except (ColdStartError, hwdb.HwdbError, ProbeError) as exc:
        raise StartupError(f"{field}: {exc}") from None
    new_bd = new_warm if cfg.compile_cache == "persistent" else new_cold
    restart_bd = re_warm if volume else re_cold
    return StartTimes(
        cfg.provisioning_s,
        new_bd,
        restart_bd,
        simulate_pod(new_bd, spec, new_warm, HORIZON_S),
        simulate_pod(restart_bd, spec, re_warm, HORIZON_S),
        spec,
    )
