"""Run a scenario through the operations engine and keep the engine's objects, for the white-box checks
of tests/test_faults.py and tests/test_faults_fp8.py."""

from __future__ import annotations

from simulator.engine.opsrun import run_operations
from simulator.engine.results import requests_frame
from simulator.pd.pd import build_transfer_plan
from simulator.resolved import resolve, rng_streams
from simulator.run import pool_spec
from simulator.workload import generate


def run_objects(scn):
    """Like :func:`simulate`, returning the operations engine's objects too (for white-box checks)."""
    rs = resolve(scn)
    db = rs.db
    rngs = rng_streams(scn.seed, 0)
    reqs = generate(scn.workload, rngs["arrivals"], rngs["lengths"])
    front, back = (rs.role("prefill"), rs.role("decode")) if scn.is_pd else (rs.role("colocated"), None)
    plan = build_transfer_plan(scn.kv_transfer, db, front.dep, back.dep) if back else None
    ops, run, rec = run_operations(scn, reqs, front, back, plan, None, rngs, pool_spec)
    return ops, run, requests_frame(run, "x", operations=True)
