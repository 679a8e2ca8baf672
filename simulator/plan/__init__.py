"""Capacity planner: the cheapest deployment that meets the SLOs, and what to deploy.

Public API (stable; see docs/planner.md)::

    from simulator.plan import PlanRequest, load_plan_request, run_plan, artefacts
"""
from simulator.plan.artefacts import artefacts
from simulator.plan.candidates import Candidate, PoolChoice
from simulator.plan.families import FAMILIES
from simulator.plan.request import PlanError, PlanRequest, load_plan_request, parse_plan_request
from simulator.plan.rank import PlanResult
from simulator.plan.runner import run_plan, write_result

__all__ = ["FAMILIES", "Candidate", "PlanError", "PlanRequest", "PlanResult", "PoolChoice", "artefacts",
           "load_plan_request", "parse_plan_request", "run_plan", "write_result"]
