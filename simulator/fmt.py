"""One way to write durations, percentages and rates, for the CLI, the app's pages and the reports.

Durations are seconds in the data: below a millisecond they read in µs, below a second in ms,
then in seconds (and minutes or hours past them), with three significant figures or so, so
that a card never needs more than about eight characters.  Fractions (0.987) read as
percentages ("98.7%"); an attainment with a confidence interval is written as the interval
itself, clipped to what a fraction can be (never "57.1% (±174.2%)").
"""

from __future__ import annotations

import math

_NA = "-"


def _nan(x: float) -> bool:
    """Whether ``x`` is a float NaN, which is written as missing, like None."""
    return isinstance(x, float) and math.isnan(x)


def duration(x: float | None) -> str:
    """Seconds as "850 µs", "12.3 ms", "412 ms", "1.23 s", "45.6 s", "144 s", "12.5 min", "2.1 h"."""
    if x is None or _nan(x):
        return _NA
    x = float(x)
    if math.isinf(x):
        return "∞"
    a = abs(x)
    if a == 0:
        return "0 ms"
    if a < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if a < 1:
        ms = x * 1e3
        return f"{ms:.2f} ms" if abs(ms) < 10 else f"{ms:.1f} ms" if abs(ms) < 100 else f"{ms:.0f} ms"
    if a < 10:
        return f"{x:.2f} s"
    if a < 100:
        return f"{x:.1f} s"
    if a < 600:
        return f"{x:.0f} s"
    if a < 3 * 3600:
        return f"{x / 60:.1f} min"
    return f"{x / 3600:.1f} h"


def percent(frac: float | None, digits: int = 1) -> str:
    """A fraction as a percentage: 0.9872 -> "98.7%"; never rounds a miss up to 100% or a hit down to 0%."""
    if frac is None or _nan(frac):
        return _NA
    p = float(frac) * 100
    text = f"{p:.{digits}f}%"
    if p < 100 and text == f"{100:.{digits}f}%":
        return f">{100 - 10**-digits:.{digits}f}%"
    if p > 0 and text == f"{0:.{digits}f}%":
        return f"<{10**-digits:.{digits}f}%"
    return text


def attainment(mean: float | None, ci95: float | None = None, runs: int | None = None) -> str:
    """An SLO attainment, with its 95% interval over seeds when there is one: "57.1% (95% CI 31.0-83.2%
    over 3 seeds)".  The interval is clipped to [0%, 100%]; a t interval over two or three seeds is
    often wider than that, so the clipped bounds are what it can say."""
    if mean is None or _nan(mean):
        return _NA
    if ci95 is None or _nan(ci95) or not ci95:
        return percent(mean)
    lo, hi = max(0.0, mean - ci95), min(1.0, mean + ci95)
    seeds = f" over {runs} seeds" if runs else ""
    return f"{percent(mean)} (95% CI {percent(lo).rstrip('%')}-{percent(hi)}{seeds})"


def number(x: float | None, digits: int = 2) -> str:
    """A plain figure with thousands separators ("1,234.57"); "-" when missing, "∞" when infinite."""
    if x is None or _nan(x):
        return _NA
    if math.isinf(float(x)):
        return "∞"
    return f"{float(x):,.{digits}f}"


def rate(x: float | None, unit: str = "req/s") -> str:
    """A rate with enough figures to compare: "19.87 req/s", "4,930 tok/s"."""
    if x is None or _nan(x):
        return _NA
    return f"{number(x, 2 if abs(float(x)) < 100 else 0)} {unit}"


def usd(x: float | None, digits: int = 2) -> str:
    if x is None or _nan(x):
        return _NA
    return "∞" if math.isinf(float(x)) else f"${float(x):,.{digits}f}"
