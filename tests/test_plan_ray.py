"""The Ray executor on a local Ray instance gives the answer of the local executor."""

from __future__ import annotations

import pytest

from simulator.plan import parse_plan_request, run_plan
from tests.test_plan import request

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]'); the Ray path is untested here")


@pytest.fixture
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_ray_executor_matches_local_processes(local_ray):
    req = parse_plan_request(
        request(
            search={
                "verify": 2,
                "borderline": 1,
                "verify_front": 0,
                "replications": 1,
                "requests": 200,
                "goodput_iterations": 1,
            }
        )
    )
    seen = []
    on_ray = run_plan(req, progress=lambda d, t, s: seen.append((d, t, s)), ray_address="local")
    local = run_plan(req, workers=1)
    cols = ["id", "verified", "goodput_rps", "ttft_s", "tpot_s", "meets_slo", "rejected_reason"]
    assert on_ray.candidates[cols].equals(local.candidates[cols])
    assert on_ray.candidates["verified"].sum() >= 2
    verify = [(d, t) for d, t, s in seen if s == "verify"]
    assert verify[-1][0] == verify[-1][1] == on_ray.candidates["verified"].sum()
