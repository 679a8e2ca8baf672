"""The figures a regression suite can watch, and how each is read off a run.

A figure is one number (or, for a plan's recommended deployment, one label)
that answers a sizing question.  Scenario figures come from the run summary
at the entry's rate (:func:`simulator.run.simulate`) or from the goodput
bisection (:func:`simulator.goodput.find_goodput`); every one is averaged over
the entry's seeds and replications.  Units are in the name's suffix:
``_s`` seconds, ``_rps`` requests per second, ``_usd_per_hour`` dollars per hour.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Figure:
    """A watched figure: what it means, its unit, and how to read it from a summary dict.

    ``read`` is None for figures that are not read off one simulation
    (goodput); the runner computes those itself.
    """

    name: str
    meaning: str
    unit: str
    read: Callable[[dict], float] | None = None


def _pct(metric: str, p: str) -> Callable[[dict], float]:
    return lambda s: s[metric][p]


def _key(k: str) -> Callable[[dict], float]:
    return lambda s: s[k]


_SCENARIO = [
    Figure("goodput_rps", "highest arrival rate meeting the SLO attainment target (bisection)", "req/s"),
    *(Figure(f"{m}_{p}_s", f"{p} {label} at the entry's rate", "s", _pct(f"{m}_s", p))
      for m, label in (("ttft", "time to first token"), ("tpot", "time per output token"),
                       ("itl", "inter-token latency"), ("e2e", "end-to-end latency"))
      for p in ("p50", "p90", "p99")),
    Figure("slo_attainment", "fraction of requests meeting the SLO at the entry's rate", "1",
           _key("slo_attainment")),
    Figure("throughput_rps", "completed requests per second at the entry's rate", "req/s",
           _key("throughput_rps")),
    Figure("output_tokens_per_s", "output tokens per second at the entry's rate", "tok/s",
           _key("output_tokens_per_s")),
    Figure("output_tokens_per_s_per_gpu", "output tokens per second per GPU at the entry's rate", "tok/s",
           _key("output_tokens_per_s_per_gpu")),
    Figure("mean_batch_size", "step-time weighted mean batch size", "seqs", _key("mean_batch_size")),
    Figure("preemptions", "preemptions (KV cache full) over the run", "1", _key("preemptions")),
    Figure("gpus", "GPUs in the deployment", "GPUs", _key("gpus")),
    Figure("cost_usd_per_hour", "price of the deployment's GPUs", "$/h", _key("cost_usd_per_hour")),
    Figure("cost_usd_per_million_output_tokens", "GPU cost per million output tokens at the entry's rate",
           "$/M tok", _key("cost_usd_per_million_output_tokens")),
]

SCENARIO_FIGURES: dict[str, Figure] = {f.name: f for f in _SCENARIO}
# Read off one simulation at the entry's rate (everything but the goodput bisection).
RUN_FIGURES = frozenset(n for n, f in SCENARIO_FIGURES.items() if f.read is not None)
