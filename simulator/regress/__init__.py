"""Sizing regression: run a suite of scenarios, compare figures with a baseline, report drift.

``load_suite`` (suite.py) -> ``run_suite`` (runner.py) -> ``compare`` against
``read_baseline`` (compare.py) -> ``write_junit`` / ``markdown`` (report.py).
The command line is ``epdsim regress`` (simulator/cli/regress.py).
"""

from simulator.regress.compare import Row, compare, read_baseline, rows_frame, write_baseline
from simulator.regress.report import markdown, write_junit
from simulator.regress.runner import run_suite
from simulator.regress.suite import LoadedSuite, RegressError, load_suite
from simulator.regress.suite_schema import Tolerance

__all__ = [
    "LoadedSuite",
    "RegressError",
    "Row",
    "Tolerance",
    "compare",
    "load_suite",
    "markdown",
    "read_baseline",
    "rows_frame",
    "run_suite",
    "write_baseline",
    "write_junit",
]
