"""The figures a regression suite can watch, and how each is read off a run.

A figure is one number (or, for a plan's recommended deployment, one label)
that answers a sizing question.  Scenario figures come from the run summary
at the entry's rate (:func:`simulator.run.simulate`) or from the goodput
bisection (:func:`simulator.goodput.find_goodput`); every one is averaged over
the entry's seeds and replications.  Plan figures come from the planner's
recommended deployment (:func:`simulator.plan.run_plan`), whose request sets
its own seed and replications.  Units are in the name's suffix:
``_s`` seconds, ``_rps`` requests per second, ``_usd_per_hour`` dollars per hour.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Figure:
    """A watched figure: what it means, its unit, and how to read it from a summary dict.

    ``read`` takes a run summary (scenario figures) or a plan's recommended
    record (plan figures: a dict, or None when nothing meets the SLO); it is
    None for goodput, which the runner computes.
    """

    name: str
    meaning: str
    unit: str
    read: Callable[[Any], float | str] | None = None

    def value(self, record: Mapping[str, Any] | None) -> float | str:
        """The figure read off ``record`` (see ``read``)."""
        if self.read is None:
            raise ValueError(f"figure {self.name} is not read off a record: the runner computes it")
        return self.read(record)


def _pct(metric: str, p: str) -> Callable[[dict], float]:
    return lambda s: s[metric][p]


def _key(k: str) -> Callable[[dict], float]:
    return lambda s: s[k]


_SCENARIO = [
    Figure("goodput_rps", "highest arrival rate meeting the SLO attainment target (bisection)", "req/s"),
    *(
        Figure(f"{m}_{p}_s", f"{p} {label} at the entry's rate", "s", _pct(f"{m}_s", p))
        for m, label in (
            ("ttft", "time to first token"),
            ("tpot", "time per output token"),
            ("itl", "inter-token latency"),
            ("e2e", "end-to-end latency"),
        )
        for p in ("p50", "p90", "p99")
    ),
    Figure(
        "slo_attainment", "fraction of requests meeting the SLO at the entry's rate", "fraction", _key("slo_attainment")
    ),
    Figure("throughput_rps", "completed requests per second at the entry's rate", "req/s", _key("throughput_rps")),
    Figure("output_tokens_per_s", "output tokens per second at the entry's rate", "tok/s", _key("output_tokens_per_s")),
    Figure(
        "output_tokens_per_s_per_gpu",
        "output tokens per second per GPU at the entry's rate",
        "tok/s",
        _key("output_tokens_per_s_per_gpu"),
    ),
    Figure("mean_batch_size", "step-time weighted mean batch size", "seqs", _key("mean_batch_size")),
    Figure("preemptions", "preemptions (KV cache full) over the run", "count", _key("preemptions")),
    Figure("gpus", "GPUs in the deployment", "GPUs", _key("gpus")),
    Figure("cost_usd_per_hour", "price of the deployment's GPUs", "$/h", _key("cost_usd_per_hour")),
    Figure(
        "cost_usd_per_million_output_tokens",
        "GPU cost per million output tokens at the entry's rate",
        "$/M tok",
        _key("cost_usd_per_million_output_tokens"),
    ),
]

_PLAN = [
    Figure(
        "recommended",
        "the planner's recommended deployment (a label: held only if identical; 'none' when nothing meets the SLO)",
        "label",
        lambda r: r["layout"] if r else "none",
    ),
    Figure(
        "recommended_gpus", "GPUs in the recommended deployment (0 when none)", "GPUs", lambda r: r["gpus"] if r else 0
    ),
    Figure(
        "recommended_cost_usd_per_hour",
        "price of the recommended deployment (0 when none)",
        "$/h",
        lambda r: r["cost_usd_per_hour"] if r else 0.0,
    ),
    Figure(
        "recommended_goodput_rps",
        "simulated goodput of the recommended deployment",
        "req/s",
        lambda r: r["goodput_rps"] if r else float("nan"),
    ),
    Figure(
        "recommended_ttft_s",
        "TTFT at the SLO percentile and target rate of the recommended deployment",
        "s",
        lambda r: r["ttft_s"] if r else float("nan"),
    ),
    Figure(
        "recommended_tpot_s",
        "TPOT at the SLO percentile and target rate of the recommended deployment",
        "s",
        lambda r: r["tpot_s"] if r else float("nan"),
    ),
]

SCENARIO_FIGURES: dict[str, Figure] = {f.name: f for f in _SCENARIO}
# Read off a plan's recommended record (simulator.plan.PlanResult.recommended; None when nothing meets the SLO).
PLAN_FIGURES: dict[str, Figure] = {f.name: f for f in _PLAN}
ALL_FIGURES: dict[str, Figure] = SCENARIO_FIGURES | PLAN_FIGURES
# Read off one simulation at the entry's rate (everything but the goodput bisection).
RUN_FIGURES = frozenset(n for n, f in SCENARIO_FIGURES.items() if f.read is not None)
