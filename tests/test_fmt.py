"""simulator.fmt: one way to write durations, percentages and attainments (issue 18, items 7 and 10)."""

from __future__ import annotations

import inspect
import math

import pytest

from simulator import fmt
from simulator.cli import plan as cli_plan
from simulator.plan import rank


@pytest.mark.parametrize(
    "s, text",
    [
        (0.0004, "400 µs"),
        (0.00731, "7.31 ms"),
        (0.0456, "45.6 ms"),
        (0.5, "500 ms"),
        (1.234, "1.23 s"),
        (45.6, "45.6 s"),
        (144.492, "144 s"),
        (750, "12.5 min"),
        (7.6 * 3600, "7.6 h"),
        (float("nan"), "-"),
        (None, "-"),
        (math.inf, "∞"),
    ],
)
def test_duration_picks_the_unit_and_stays_short(s, text):
    assert fmt.duration(s) == text
    assert len(fmt.duration(s)) <= 9


def test_percent_never_rounds_to_a_false_0_or_100():
    assert fmt.percent(0.9872) == "98.7%"
    assert fmt.percent(1.0) == "100.0%" and fmt.percent(0.0) == "0.0%"
    assert fmt.percent(0.99996) == ">99.9%" and fmt.percent(0.00001) == "<0.1%"


def test_attainment_interval_is_clipped_to_what_a_fraction_can_be():
    """The plan's "attainment 57.1% (±174.2%)": a t interval over 2 seeds, printed as mean ± half-width."""
    text = fmt.attainment(0.571, 1.742, 2)
    assert "±" not in text and "174" not in text
    assert text == "57.1% (95% CI 0.0-100.0% over 2 seeds)"
    assert fmt.attainment(0.9, 0.02, 3) == "90.0% (95% CI 88.0-92.0% over 3 seeds)"
    assert fmt.attainment(0.95, 0.0, 1) == "95.0%"


def test_plan_reasons_use_the_clipped_interval():
    for mod in (rank, cli_plan):
        src = inspect.getsource(mod)
        assert "±" not in src and "fmt.attainment(" in src, mod.__name__
