"""The Kubernetes settings of a serving pod: its HTTP probes and what happens on a restart.

:class:`Probe` has Kubernetes' fields (``initialDelaySeconds``, ``periodSeconds``, ``timeoutSeconds``,
``failureThreshold``, ``successThreshold``: seconds and counts, whole numbers) and refuses a value
Kubernetes or the pod model (:func:`simulator.ops.k8s.simulate_pod`) does not accept;
:class:`PodSpec` holds the startup, liveness and readiness probes, the compile-cache volume and the
CrashLoopBackOff timing (seconds).  :class:`ProbeError` names the field, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


class ProbeError(ValueError):
    """Invalid probe or pod settings; the message names the field, the value and the fix."""


_FIELDS = {  # our name -> Kubernetes field
    "initial_delay_s": "initialDelaySeconds",
    "period_s": "periodSeconds",
    "timeout_s": "timeoutSeconds",
    "failure_threshold": "failureThreshold",
    "success_threshold": "successThreshold",
}


@dataclass(frozen=True)
class Probe:
    """An HTTP probe with Kubernetes' fields (seconds and counts are whole numbers).

    Defaults are Kubernetes' own: initialDelaySeconds 0, periodSeconds 10,
    timeoutSeconds 1, successThreshold 1, failureThreshold 3.
    """

    initial_delay_s: int = 0
    period_s: int = 10
    timeout_s: int = 1
    failure_threshold: int = 3
    success_threshold: int = 1
    name: str = "probe"
    path: str = "/health"
    port: int = 8000

    def __post_init__(self) -> None:
        self.validate()

    def _bad(self, attr: str, why: str, fix: str) -> ProbeError:
        return ProbeError(f"{self.name}.{_FIELDS[attr]}={getattr(self, attr)!r} is invalid: {why}. Fix: {fix}.")

    def validate(self) -> None:
        for attr in _FIELDS:
            v = getattr(self, attr)
            number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if not number or (isinstance(v, float) and not v.is_integer()):
                example = int(v) if number else 10
                raise self._bad(
                    attr,
                    "Kubernetes takes a whole number here",
                    f"write {_FIELDS[attr]} as an integer (e.g. {example})",
                )
        if self.initial_delay_s < 0:
            raise self._bad(
                "initial_delay_s",
                "it must be >= 0 seconds",
                "set initialDelaySeconds to 0 or more (0 probes right after the gate)",
            )
        if self.period_s < 1:
            raise self._bad(
                "period_s",
                "it must be >= 1 second (Kubernetes rejects 0 and negative periods)",
                "set periodSeconds to a positive value, e.g. 10 (the Kubernetes default)",
            )
        if self.timeout_s < 1:
            raise self._bad(
                "timeout_s",
                "it must be >= 1 second",
                "set timeoutSeconds to a positive value, e.g. 1 (the default) to 5",
            )
        if self.failure_threshold < 1:
            raise self._bad(
                "failure_threshold",
                "it must be >= 1 (Kubernetes rejects 0)",
                "set failureThreshold to 1 or more, e.g. 3 (the default); size a startupProbe's "
                "threshold with `epdsim probes`",
            )
        if self.success_threshold != 1:
            raise self._bad(
                "success_threshold",
                "liveness and startup probes must use 1, and this model supports only 1",
                "set successThreshold to 1 (the default)",
            )
        if self.timeout_s >= self.period_s:
            raise ProbeError(
                f"{self.name}.timeoutSeconds={self.timeout_s} must be less than periodSeconds={self.period_s}: a probe "
                f"allowed to run a whole period overlaps the next and a hung server is noticed "
                f"failureThreshold x timeoutSeconds late. Fix: lower timeoutSeconds (e.g. "
                f"{max(1, min(5, self.period_s - 1))}) or raise periodSeconds above {self.timeout_s}."
            )

    @property
    def give_up_after_s(self) -> int:
        """Seconds from the gate to the decisive failure when the endpoint never answers."""
        return self.initial_delay_s + self.period_s * (self.failure_threshold - 1)

    def to_k8s(self) -> dict:
        return {
            "httpGet": {"path": self.path, "port": self.port},
            "initialDelaySeconds": int(self.initial_delay_s),
            "periodSeconds": int(self.period_s),
            "timeoutSeconds": int(self.timeout_s),
            "successThreshold": int(self.success_threshold),
            "failureThreshold": int(self.failure_threshold),
        }


@dataclass(frozen=True)
class PodSpec:
    """The probes of the serving container and what survives a restart."""

    startup: Probe | None = None
    liveness: Probe | None = None
    readiness: Probe | None = None
    compile_cache_volume: bool = False
    termination_s: float = 0.0  # SIGTERM to container exit after a kill
    backoff_initial_s: float = 10.0
    backoff_cap_s: float = 300.0
    backoff_reset_s: float = 600.0  # a container that ran this long resets the back-off

    def __post_init__(self) -> None:
        for attr, k8s in (("startup", "startupProbe"), ("liveness", "livenessProbe"), ("readiness", "readinessProbe")):
            p = getattr(self, attr)
            if p is not None and not isinstance(p, Probe):
                raise ProbeError(f"{k8s} must be a Probe, got {type(p).__name__}")
            if p is not None and p.name != k8s:
                object.__setattr__(self, attr, dataclasses.replace(p, name=k8s))
        if self.termination_s < 0:
            raise ProbeError(f"termination_s={self.termination_s} must be >= 0 (seconds from SIGTERM to exit)")
        if not 0 < self.backoff_initial_s <= self.backoff_cap_s:
            raise ProbeError(
                f"back-off: need 0 < backoff_initial_s ({self.backoff_initial_s}) <= backoff_cap_s "
                f"({self.backoff_cap_s}); Kubernetes uses 10 and 300"
            )
