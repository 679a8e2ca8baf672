"""Fluid (max-min fair) bandwidth sharing of data transfers over chains of links.

Used for KV-cache transfers between prefill and decode instances: a transfer
crosses a *path*, a sequence of :class:`LinkState` (:mod:`simulator.pd.links`: one direction of one
physical link instance, e.g. "NIC of prefill instance 3, egress").  Units:
bytes, seconds, bytes/s.

Life of a transfer (:meth:`Fabric.transfer`):

1. *latency phase*: it waits ``sum(link.latency_s) + extra_s + jitter``;
2. *active phase*: it streams at a rate set by max-min fairness over every
   active transfer on every link (progressive filling), recomputed whenever a
   transfer becomes active or finishes;
3. its event succeeds with a :class:`TransferRecord` when all bytes crossed.

The fabric keeps at most one live "next completion" timeout; a timeout whose
version is no longer current is ignored when it fires (cancel by version).

Invariants (checked by ``tests/test_fabric.py``):

* each transfer's event succeeds exactly once, never earlier than
  ``latency + extra_s + nbytes / min(available capacity on its path)``;
* the sum of rates on a link never exceeds its available capacity;
* ``bytes_sent == bytes_delivered`` whenever the fabric is idle, and each
  link's ``bytes_carried`` equals the bytes of the transfers that crossed it.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np
import simpy

from simulator.pd.links import LinkState, Transfer, TransferRecord
from simulator.summary_types import LinkStats

#: A transfer is complete when its remaining bytes are at most this fraction of its size.
REL_TOL = 1e-9
_UNIT = 1 << 1074  # every finite float is a whole number of 2**-1074
#: At most one active transfer: rates without the progressive filling's heap (Fabric._reallocate_one; the
#: same values).  tests/test_fabric.py turns it off to compare.
ONE_FLOW_PATH = True


def _exact(x: float) -> int:
    """``x`` (finite, >= 0) as a whole number of 2**-1074, exactly: the byte totals add these."""
    n, d = x.as_integer_ratio()  # d is a power of two, at most 2**1074
    return n << (1075 - d.bit_length())


class Fabric:
    """Active transfers on a set of links, with max-min fair rates.

    ``rng`` is needed only when some link has a ``jitter``.  Totals (bytes):
    ``bytes_sent`` grows when a transfer is submitted, ``bytes_delivered``
    when it completes; they are summed exactly (as integers in units of 2**-1074,
    of which every float is a whole number, so the order of completion cannot
    matter) and are equal whenever :attr:`idle`.
    """

    def __init__(self, env: simpy.Environment, rng: np.random.Generator | None = None) -> None:
        self.env = env
        self.rng = rng
        self.links: dict[str, LinkState] = {}
        self._sent = 0  # bytes submitted and completed, in units of 2**-1074
        self._delivered = 0
        self.n_pending = 0  # transfers in their latency phase
        self._active: dict[Transfer, None] = {}  # insertion ordered, O(1) removal
        self._last = env.now  # time up to which bytes are accounted
        self._version = 0
        self._wake_at: float | None = None

    # ------------------------------------------------------------------ public
    @property
    def n_active(self) -> int:
        return len(self._active)

    @property
    def bytes_sent(self) -> float:
        return self._sent / _UNIT

    @property
    def bytes_delivered(self) -> float:
        return self._delivered / _UNIT

    @property
    def idle(self) -> bool:
        return not self._active and not self.n_pending

    def transfer(self, path: Sequence[LinkState], nbytes: float, extra_s: float = 0.0) -> Transfer:
        """Move ``nbytes`` over ``path``; the returned event succeeds with a :class:`TransferRecord`.

        The transfer first waits the sum of the links' latencies, plus
        ``extra_s`` (s, e.g. setup or serial CPU cost computed by the caller),
        plus each link's jitter draw; then it shares bandwidth.  A transfer of
        0 bytes, or over an empty path, completes after that wait.
        """
        if not nbytes >= 0 or not math.isfinite(nbytes):
            raise ValueError(f"nbytes must be finite and >= 0, got {nbytes}")
        if not 0 <= extra_s < math.inf:
            raise ValueError(f"extra_s must be finite and >= 0, got {extra_s}")
        path = tuple(path)
        if len(set(map(id, path))) != len(path):
            raise ValueError(f"path crosses a link twice: {[ln.name for ln in path]}")
        delay = float(extra_s)
        for ln in path:
            self._register(ln)
            delay += ln.latency_s
            if ln.jitter is not None:
                if self.rng is None:
                    raise ValueError(f"link {ln.name!r} has jitter but the Fabric has no rng")
                j = float(ln.jitter(self.rng))
                if not j >= 0:
                    raise ValueError(f"link {ln.name!r}: jitter must be >= 0 s, got {j}")
                delay += j
        tr = Transfer(self.env, path, float(nbytes))
        self._sent += _exact(tr.nbytes)
        self.n_pending += 1
        self.env.timeout(delay).callbacks.append(lambda _e: self._activate(tr))
        return tr

    def set_bandwidth_factor(self, link: LinkState, factor: float) -> None:
        """Degrade (or restore) ``link`` now; rates of transfers on it are recomputed."""
        self._advance()
        link.bandwidth_factor = factor
        if link._flows:
            self._reallocate(())

    def sync(self) -> None:
        """Bring byte accounting (``bytes_carried``, ``remaining_bytes``) up to ``env.now``."""
        self._advance()

    def rate_series(self) -> dict[str, list[tuple[float, float]]]:
        """Per link name, the ``(time_s, rate_Bps)`` change points of the rate in use."""
        return {name: list(ln.rate_series) for name, ln in self.links.items()}

    def link_stats(self) -> list[LinkStats]:
        """Per link up to ``env.now``: bytes carried, busy seconds, mean utilisation of capacity."""
        self._advance()
        now = self.env.now
        return [
            {
                "link": name,
                "capacity_Bps": ln.capacity_Bps,
                "bytes_carried": ln.bytes_carried,
                "busy_s": ln.busy_s(now),
                "utilisation": ln.bytes_carried / (ln.capacity_Bps * now) if now > 0 else 0.0,
            }
            for name, ln in self.links.items()
        ]

    # ---------------------------------------------------------------- internal
    def _register(self, ln: LinkState) -> None:
        if ln._fabric is self:
            return
        if ln._fabric is not None:
            raise ValueError(f"link {ln.name!r} already belongs to another Fabric")
        if ln.name in self.links:
            raise ValueError(f"two different links are named {ln.name!r}")
        ln._fabric = self
        self.links[ln.name] = ln

    def _record(self, tr: Transfer) -> TransferRecord:
        return TransferRecord(tr.start_s, tr.active_s, self.env.now, tr.nbytes, tuple(ln.name for ln in tr.path))

    def _activate(self, tr: Transfer) -> None:
        """End of the latency phase: start streaming (or finish at once if nothing to stream)."""
        self.n_pending -= 1
        now = self.env.now
        tr.active_s = now
        if tr.nbytes == 0 or not tr.path:
            self._delivered += _exact(tr.nbytes)
            tr.remaining_bytes = 0.0
            tr.succeed(self._record(tr))
            return
        self._advance()
        self._active[tr] = None
        for ln in tr.path:
            if not ln._flows:
                ln._busy_since = now
            ln._flows[tr] = None
        self._reallocate(())

    def _advance(self) -> None:
        """Move bytes at the current rates from the last accounting time to now."""
        now = self.env.now
        dt = now - self._last
        self._last = now
        if dt <= 0:
            return
        for tr in self._active:
            d = tr.rate_Bps * dt
            if d > tr.remaining_bytes:
                d = tr.remaining_bytes
            tr.remaining_bytes -= d
            for ln in tr.path:
                ln.bytes_carried += d

    def _reallocate(self, dirty) -> None:
        """Max-min fair rates by progressive filling, then log rate changes and reschedule.

        The link with the smallest fair share (capacity left / unfixed flows)
        fixes its unfixed flows at that share; shares only grow as flows are
        fixed, so a lazy heap gives O(active flows × path length × log links).
        ``dirty``: links whose flows just all ended, whose rate may drop to 0.
        """
        if len(self._active) <= 1 and ONE_FLOW_PATH:
            self._reallocate_one(dirty)
            return
        touched: dict[LinkState, None] = {}
        for tr in self._active:
            tr._fixed = False
            for ln in tr.path:
                if ln not in touched:
                    touched[ln] = None
                    ln._rem, ln._cnt, ln._used = ln.available_Bps, 0, 0.0
                ln._cnt += 1
        for ln in dirty:
            if ln not in touched:
                touched[ln] = None
                ln._cnt, ln._used = 0, 0.0
        # (share, tie-break sequence, link): the sequence keeps links from being compared
        heap = [(ln._rem / ln._cnt, i, ln) for i, ln in enumerate(touched) if ln._cnt]
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        seq = len(heap)
        while heap:
            share, _, ln = pop(heap)
            if not ln._cnt or share != max(ln._rem, 0.0) / ln._cnt:
                continue  # stale entry, or every flow on the link is already fixed
            for tr in ln._flows:
                if tr._fixed:
                    continue
                tr._fixed = True
                tr.rate_Bps = share
                for l2 in tr.path:
                    l2._rem -= share
                    l2._cnt -= 1
                    l2._used += share
                    if l2._cnt and l2 is not ln:
                        push(heap, (max(l2._rem, 0.0) / l2._cnt, seq, l2))
                        seq += 1
        self._log_rates(touched)
        self._schedule()

    def _reallocate_one(self, dirty) -> None:
        """:meth:`_reallocate` with at most one active transfer (the common case of KV transfers): it
        takes the smallest available rate on its path (the first link's that has it), which every
        link on the path then uses; the same values, in the same order, as the progressive filling."""
        touched: dict[LinkState, None] = {}
        for tr in self._active:
            path = tr.path
            share = path[0].capacity_Bps * path[0]._factor
            for ln in path:
                avail = ln.capacity_Bps * ln._factor
                if avail < share:
                    share = avail
            tr._fixed = True
            tr.rate_Bps = share
            for ln in path:
                touched[ln] = None
                ln._rem, ln._cnt, ln._used = ln.capacity_Bps * ln._factor - share, 0, share
        for ln in dirty:
            if ln not in touched:
                touched[ln] = None
                ln._cnt, ln._used = 0, 0.0
        self._log_rates(touched)
        self._schedule()

    def _log_rates(self, touched) -> None:
        """Record each touched link's new rate in use (one change point per time)."""
        now = self.env.now
        for ln in touched:
            if ln._used != ln.rate_in_use:
                ln.rate_in_use = ln._used
                s = ln.rate_series
                if s and s[-1][0] == now:
                    s[-1] = (now, ln._used)
                else:
                    s.append((now, ln._used))

    def _schedule(self) -> None:
        """Keep exactly one live wake-up, at the next completion time."""
        if not self._active:
            self._version += 1
            self._wake_at = None
            return
        dt = min(tr.remaining_bytes / tr.rate_Bps for tr in self._active)
        at = self.env.now + dt
        if at == self._wake_at:
            return  # the live wake-up is already at the right time
        self._version += 1
        self._wake_at = at
        version = self._version
        self.env.timeout(dt).callbacks.append(lambda _e: self._wake(version))

    def _wake(self, version: int) -> None:
        """A scheduled completion: finish every transfer whose bytes ran out, together."""
        if version != self._version:
            return  # stale: rates changed since this wake-up was scheduled
        self._wake_at = None
        self._advance()
        now = self.env.now
        # Time rounding (now + dt - now != dt) may leave a few bytes; treat a
        # transfer within a few ulps of now as done so that progress is assured.
        eps_s = 8 * math.ulp(now)
        done = [
            tr
            for tr in self._active
            if tr.remaining_bytes <= REL_TOL * tr.nbytes or tr.remaining_bytes <= tr.rate_Bps * eps_s
        ]
        if not done:
            done = [min(self._active, key=lambda tr: tr.remaining_bytes / tr.rate_Bps)]
        dirty: dict[LinkState, None] = {}
        for tr in done:
            del self._active[tr]
            residual = tr.remaining_bytes
            tr.remaining_bytes = 0.0
            tr.rate_Bps = 0.0
            for ln in tr.path:
                ln.bytes_carried += residual
                del ln._flows[tr]
                if not ln._flows:
                    ln._busy_s += now - ln._busy_since
                    dirty[ln] = None
            self._delivered += _exact(tr.nbytes)
        self._reallocate(dirty)
        for tr in done:
            tr.succeed(self._record(tr))
