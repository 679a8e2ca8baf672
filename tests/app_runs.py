"""A small scenario (the app's default at a given rate and size) and the module-scoped run of it, for the
app's service and report tests (tests/test_app_services.py, tests/test_app_reports.py)."""

from __future__ import annotations

import pytest

from app.services import builder, scenarios


def small(n: int = 300, rate: float = 20.0) -> dict:
    d = scenarios.default_scenario()
    return builder.set_workload(d, rate=rate, num_requests=n)


@pytest.fixture(scope="module", name="res")
def res_fixture():
    return scenarios.run(small())
