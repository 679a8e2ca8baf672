"""A sweep as asked (``--rates`` or ``--knob``) turned into validated points, ready for :func:`run_sweep`."""

from __future__ import annotations

from dataclasses import dataclass

import hwdb
from simulator.scenario import Scenario
from simulator.sweep.ladder import POINTS, capacity_rps, ladder
from simulator.sweep.points import (
    MAX_POINTS,
    RATE,
    RATE_PATH,
    Point,
    SweepError,
    check_points,
    knob_points,
    parse_knob,
    parse_rates,
    rate_points,
    with_requests,
)


@dataclass(frozen=True)
class Prepared:
    """The points of a sweep and their validated scenarios (``scenarios[i]`` is ``points[i]``)."""

    knob: str  # "rate", or the knob's dotted path
    points: tuple[Point, ...]
    scenarios: tuple[Scenario, ...]
    auto: bool  # a --rates auto ladder (it may be extended while running)
    capacity_rps: float | None  # the estimated ceiling an auto ladder is built around (req/s)


def prepare(
    scn: Scenario,
    *,
    rates: str | None = None,
    knob: str | None = None,
    points: int = POINTS,
    num_requests: int | None = None,
    db: hwdb.HardwareDB | None = None,
) -> Prepared:
    """The sweep of ``scn`` over ``rates`` (``"1,2,4"`` or ``"auto"``: ``points`` rates around the estimated
    capacity) or over ``knob`` (``"pools[0].tp=1,2,4"``), each point with ``num_requests`` requests (None:
    the scenario's).  Raises :class:`SweepError` naming the option, the value and the fix."""
    if (rates is None) == (knob is None):
        raise SweepError(
            "epdsim sweep: give either --rates (e.g. --rates 1,2,4,8 or --rates auto) or one --knob "
            "(e.g. --knob pools[0].tp=1,2,4), not both and not neither"
        )
    if not 2 <= points <= MAX_POINTS:
        raise SweepError(f"--points {points}: give 2 to {MAX_POINTS} points for --rates auto")
    data = with_requests(scn.model_dump(mode="json"), num_requests)
    if knob is not None:
        path, values = parse_knob(knob)
        pts = knob_points(data, path, values)
        name = RATE if path in (RATE, RATE_PATH) else path  # the arrival rate as a knob is a rate sweep
        return Prepared(name, tuple(pts), tuple(check_points(pts, "--knob", db)), False, None)
    asked = parse_rates(str(rates))
    cap = None
    if asked is None:
        base = check_points(rate_points(data, [1.0], "--rates auto"), "--rates auto", db)[0]
        cap = capacity_rps(base, db)
        asked = ladder(cap, points)
    pts = rate_points(data, asked, "--rates")
    return Prepared(RATE, tuple(pts), tuple(check_points(pts, "--rates", db)), cap is not None, cap)
