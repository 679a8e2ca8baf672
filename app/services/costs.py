"""The named costs of a run: one function for `epdsim simulate` and the app, so both say the same.

* ``static``: the scenario's configured GPUs at their price per GPU-hour (``summary["cost_usd_per_hour"]``):
  what the deployment as written costs while it runs; $ per million tokens at the run's token rates.
* ``mean billed``: only for a run with an ``operations`` section (autoscaling, crashes): the GPU-hours
  billed as instances came and went (``summary["operations"]["cost_usd"]``), over the run's length as a
  mean $/h, and per million of the run's tokens.

Pure Python over a run's summary (no Streamlit, no pandas): the CLI imports it as cheaply as the app.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulator.summary_types import RunSummary

STATIC, BILLED = "static", "mean billed"
# What each cost is, in the words every table and card uses.
MEANING = {
    STATIC: "configured GPUs x price per GPU-hour",
    BILLED: "GPU-hours billed as instances came and went, averaged over the run",
}


def _per_million(usd: float, tokens: float) -> float:
    return usd / tokens * 1e6 if tokens > 0 else math.inf


def named_costs(
    summary: RunSummary, static_usd_per_hour: float | None = None, billed_usd: float | None = None
) -> dict[str, dict]:
    """``{STATIC: {...}, BILLED: {...}}`` (BILLED only for a run with operations), each with ``usd_per_hour``,
    ``usd_per_million_output_tokens``, ``usd_per_million_total_tokens`` and ``meaning``; BILLED adds ``usd``
    (the run's billed total) and ``gpu_hours``.

    ``static_usd_per_hour`` and ``billed_usd`` replace the summary's own figures (hwdb list prices) when
    prices are overridden (the app's Prices); every rate is then derived here the same way.
    """
    s = summary
    per_h = s["cost_usd_per_hour"] if static_usd_per_hour is None else float(static_usd_per_hour)
    out = {
        STATIC: {
            "usd_per_hour": per_h,
            "usd_per_million_output_tokens": _per_million(per_h, s["output_tokens_per_s"] * 3600.0),
            "usd_per_million_total_tokens": _per_million(per_h, s["total_tokens_per_s"] * 3600.0),
            "meaning": MEANING[STATIC],
        }
    }
    o = s.get("operations")
    if o is not None:
        usd = o["cost_usd"] if billed_usd is None else float(billed_usd)
        hours = float(o["end_s"]) / 3600.0
        out[BILLED] = {
            "usd": usd,
            "gpu_hours": o["gpu_hours"],
            "usd_per_hour": usd / hours if hours > 0 else math.nan,
            "usd_per_million_output_tokens": _per_million(usd, s["output_tokens_per_s"] * s["duration_s"]),
            "usd_per_million_total_tokens": _per_million(usd, s["total_tokens_per_s"] * s["duration_s"]),
            "meaning": MEANING[BILLED],
        }
    return out


def headline(named: dict[str, dict]) -> str:
    """The cost a run is judged by: the billed one where instances came and went, else the static one."""
    return BILLED if BILLED in named else STATIC


def cost_text(named: dict[str, dict]) -> str:
    """Every named cost on one line, each with its name: "$4.25/h, $1.310 per M output tokens (static:
    configured GPUs x price per GPU-hour); $16.61/h, ... (mean billed: ...)"."""
    parts = []
    for name, c in named.items():
        extra = f"; ${c['usd']:,.2f} for {c['gpu_hours']:,.2f} GPU-hours" if name == BILLED else ""
        parts.append(
            f"${c['usd_per_hour']:,.2f}/h, ${c['usd_per_million_output_tokens']:,.3f} per M output tokens "
            f"({name}: {c['meaning']}{extra})"
        )
    return "; ".join(parts)
