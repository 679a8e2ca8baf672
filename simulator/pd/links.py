"""The links a :class:`simulator.pd.fabric.Fabric` shares among transfers, and a transfer's event and record.

Units: bytes, seconds, bytes/s.  See :mod:`simulator.pd.fabric` for how rates are shared.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import simpy

if TYPE_CHECKING:  # the fabric imports this module
    from simulator.pd.fabric import Fabric

#: Extra latency (s, >= 0) drawn per transfer crossing a link; see :attr:`LinkState.jitter`.
Jitter = Callable[[np.random.Generator], float]


class LinkState:
    """One direction of one physical link instance, and its utilisation accounting.

    ``capacity_Bps`` is the usable rate (bytes/s) with protocol efficiency
    already applied; ``bandwidth_factor`` (0 < f <= 1) degrades it, so the
    rate shared among transfers is ``available_Bps = capacity_Bps * f``.
    Change the factor of a link in use with :meth:`Fabric.set_bandwidth_factor`
    so that rates are recomputed at once.

    ``jitter`` is the extension point for faults: an optional callable drawing
    extra latency (s, >= 0) for each transfer that crosses this link, from the
    fabric's ``numpy.random.Generator``.

    Accounting (read only): ``bytes_carried`` (bytes), ``rate_in_use`` (bytes/s
    now), ``rate_series`` (``[(time_s, rate_Bps), ...]`` change points; the rate
    is 0 before the first point and holds until the next).  A LinkState belongs
    to the one :class:`Fabric` it is first used with.
    """

    def __init__(
        self,
        name: str,
        capacity_Bps: float,
        latency_s: float = 0.0,
        bandwidth_factor: float = 1.0,
        jitter: Jitter | None = None,
    ) -> None:
        if not capacity_Bps > 0 or not math.isfinite(capacity_Bps):
            raise ValueError(f"link {name!r}: capacity_Bps must be finite and > 0, got {capacity_Bps}")
        if not latency_s >= 0:
            raise ValueError(f"link {name!r}: latency_s must be >= 0, got {latency_s}")
        self.name = name
        self.capacity_Bps = float(capacity_Bps)
        self.latency_s = float(latency_s)
        self._factor = 1.0
        self.bandwidth_factor = bandwidth_factor
        self.jitter = jitter
        self.bytes_carried = 0.0
        self.rate_in_use = 0.0
        self.rate_series: list[tuple[float, float]] = []
        self._busy_s = 0.0
        self._busy_since = 0.0
        self._flows: dict[Transfer, None] = {}
        self._fabric: Fabric | None = None  # the Fabric it belongs to, once used
        self._rem = 0.0  # water-filling scratch: capacity left, unfixed flows, rate in use
        self._cnt = 0
        self._used = 0.0

    @classmethod
    def from_link(
        cls, link, name: str | None = None, bandwidth_factor: float = 1.0, jitter: Jitter | None = None
    ) -> LinkState:
        """From an ``hwdb.schema.Link``: capacity = ``effective_Bps``, its latency."""
        return cls(name or link.name, link.effective_Bps, link.latency_s.value, bandwidth_factor, jitter)

    @property
    def bandwidth_factor(self) -> float:
        return self._factor

    @bandwidth_factor.setter
    def bandwidth_factor(self, f: float) -> None:
        if not 0 < f <= 1:
            raise ValueError(f"link {self.name!r}: bandwidth_factor must be in (0, 1], got {f}")
        self._factor = float(f)

    @property
    def available_Bps(self) -> float:
        """Rate (bytes/s) shared among active transfers: capacity × bandwidth factor."""
        return self.capacity_Bps * self._factor

    @property
    def n_active(self) -> int:
        return len(self._flows)

    def busy_s(self, now: float) -> float:
        """Seconds up to ``now`` during which at least one transfer was active on the link."""
        return self._busy_s + (now - self._busy_since if self._flows else 0.0)

    def __repr__(self) -> str:
        return f"LinkState({self.name!r}, {self.available_Bps:.4g} B/s, {self.latency_s:.3g} s)"


@dataclass(frozen=True, slots=True)
class TransferRecord:
    """What a finished transfer's event carries.  Times in s, size in bytes."""

    start_s: float  # when transfer() was called
    active_s: float  # when the latency phase ended and bytes began to flow
    end_s: float  # when the last byte crossed the path
    nbytes: float
    path: tuple[str, ...]

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class Transfer(simpy.Event):
    """The event returned by :meth:`Fabric.transfer`; also the fabric's flow state.

    Read-only progress: ``rate_Bps`` (0 unless active) and ``remaining_bytes``.
    """

    def __init__(self, env, path: tuple[LinkState, ...], nbytes: float) -> None:
        super().__init__(env)
        self.path = path
        self.nbytes = nbytes
        self.remaining_bytes = nbytes
        self.rate_Bps = 0.0
        self.start_s = env.now
        self.active_s = math.nan
        self._fixed = False
