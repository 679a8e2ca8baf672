"""Capacity planner: the cheapest deployment that meets the SLOs, and what to deploy.

Public API (stable; see docs/planner.md)::

    from simulator.plan import PlanRequest, load_plan_request, run_plan, artefacts
"""

from simulator.plan.artefacts import artefacts
from simulator.plan.candidates import Candidate, PoolChoice
from simulator.plan.families import FAMILIES
from simulator.plan.request import PlanError, PlanRequest, load_plan_request, parse_plan_request


def __getattr__(name: str):
    # The runner brings pandas and the simulator (~0.3 s); `epdsim --help` and the plan request's
    # checks do not need them, so it is imported on first use of one of its names.
    if name in ("PlanResult", "run_plan", "write_result"):
        from simulator.plan import runner  # noqa: PLC0415 - on first use: pandas and the simulator

        return getattr(runner, name)
    raise AttributeError(f"module 'simulator.plan' has no attribute {name!r}")


__all__ = [
    "FAMILIES",
    "Candidate",
    "PlanError",
    "PlanRequest",
    "PlanResult",
    "PoolChoice",
    "artefacts",
    "load_plan_request",
    "parse_plan_request",
    "run_plan",
    "write_result",
]
