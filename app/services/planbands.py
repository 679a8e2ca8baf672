"""The model error band of a plan's candidates and whether the recommendation's SLO holds at its edge.

The logic is the planner's own (:mod:`simulator.plan.bands`), so that the Plan page, ``epdsim plan`` and
the planner's ``constraints.slo_at_band_edge`` judge the edge alike; this module is the app's name for it.
"""

from __future__ import annotations

from simulator.plan.bands import COLUMNS, band_frame, holds_at_edge, latency_text, verdict, with_bands

__all__ = ["COLUMNS", "band_frame", "holds_at_edge", "latency_text", "verdict", "with_bands"]
