"""Instance incarnations of an operations run and their billing (:class:`Life`).

A restarted container or a new pod is a new incarnation, billed from its provisioning to its
removal, crash or the end of the run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Life:
    """One incarnation of an instance: billed from ``billed_s`` to ``ended_s`` (seconds)."""

    pool: str
    index: int
    gpus: int
    cause: str  # initial | scale-up | restart | replacement
    billed_s: float
    ready_s: float | None = None
    ended_s: float | None = None
    end: str = ""  # crash reason, "removed" (scale-down), "cancelled", or "" (alive at the end)
    lost_tokens: int = 0  # KV tokens lost in a crash
