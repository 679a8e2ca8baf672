"""What the planner is asked: workload, SLOs, hardware on offer with prices, constraints, search effort.

A :class:`PlanRequest` is one frozen pydantic model, built from YAML
(:func:`load_plan_request`) or Python.  Unknown keys and bad values become a
:class:`PlanError` naming the field, the value and the fix.  Units: seconds,
requests/s, US dollars per GPU-hour.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BeforeValidator, ValidationError, field_validator, model_validator

import hwdb
from simulator.bounds import Range, Seed
from simulator.errors import format_validation_error
from simulator.inputs import read_yaml
from simulator.scenario import SLO, EngineConfig, resolve_relative
from simulator.strict_model import Folders, StrictModel
from simulator.workload_config import Gamma, Poisson, TraceArrivals, WorkloadConfig


class PlanError(ValueError):
    """The plan request is malformed or its constraints admit no deployment at all."""


# The planner ranks deployments by cost: a price of 0 (or 1e-300) makes every candidate cost nothing,
# and the recommendation is arbitrary; a cent per GPU-hour is below any rented or amortised GPU.
OfferPrice = Annotated[
    float,
    Range(
        0.01,
        1e4,
        "US dollars per GPU-hour",
        fix="give the price of one GPU for one hour (an owned GPU: its amortised hourly cost)",
    ),
]


class GpuOffer(StrictModel):
    """A GPU type the user can buy or rent; ``price_usd_per_hour`` (per GPU) overrides hwdb's."""

    name: str
    price_usd_per_hour: OfferPrice | None = None
    # at most this many of this type in one deployment
    max_gpus: Annotated[int, Range(1, 4096, "GPUs", whole=True)] | None = None

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, v):
        if isinstance(v, (dict, GpuOffer)):
            return v
        raise ValueError(
            "a GPU offer is a mapping such as {name: H100, price_usd_per_hour: 2.5} (price and "
            "max_gpus optional)" + (f", not {v!r}" if isinstance(v, list) else "")
        )


Degree = Annotated[int, Range(1, 72, "GPUs", whole=True, fix="give parallel sizes such as [1, 2, 4, 8]")]


class Constraints(StrictModel):
    """Limits on the deployments the planner may propose."""

    max_gpus: Annotated[int, Range(1, 4096, "GPUs", whole=True)] = 32  # all pools together
    max_instances_per_pool: Annotated[int, Range(1, 512, "instances", whole=True)] = 16
    tp: tuple[Degree, ...] = (1, 2, 4, 8)  # tensor-parallel degrees to try
    # Attention data-parallel degrees to try (vLLM --data-parallel-size, SGLang --enable-dp-attention):
    # MoE models only, an instance is then dp x tp GPUs whose ranks step together for the MoE layers.
    dp: tuple[Degree, ...] = (1,)
    # Expert parallelism to try: False keeps every expert sliced over each rank's TP GPUs, True spreads
    # the experts over all dp x tp GPUs of an instance (vLLM --enable-expert-parallel); [false, true] tries both.
    expert_parallel: tuple[bool, ...] = (False,)
    families: tuple[str, ...] = ("colocated", "pd", "epd")  # names in simulator.plan.families.FAMILIES
    heterogeneous: bool = True  # PD may use different GPU types per pool
    # Weight formats to try (one string or a list): fp4 (NVFP4/MXFP4) and int4 (W4A16) are pre-quantised
    # checkpoints; GPUs without the format's tensor cores are listed as misfits.
    dtype: tuple[Literal["bf16", "fp16", "fp8", "fp4", "int4"], ...] = ("bf16",)
    kv_cache_dtype: Literal["auto", "bf16", "fp16", "fp8"] = "auto"
    engine: EngineConfig = EngineConfig()  # engine arguments for every pool
    # Leave out GPUs that have no calibration profile (datasheet-only figures, no error band) when at
    # least one offered GPU has one; the plan's notes say which were left out.
    prefer_calibrated: bool = False
    # Plan at the model error band's pessimistic edge: a candidate meets the SLO only if its TTFT and TPOT
    # at the SLO percentile, times (1 + its band), still meet the targets; one without a band for a
    # targeted figure (datasheet-only GPU) is refused, since nothing bounds its error (simulator/plan/bands.py).
    slo_at_band_edge: bool = False

    @field_validator("dtype", mode="before")
    @classmethod
    def _one_dtype(cls, v):
        return (v,) if isinstance(v, str) else v

    @model_validator(mode="after")
    def _check(self) -> Constraints:
        for name in ("tp", "dp"):
            sizes = getattr(self, name)
            if not sizes:
                raise ValueError(
                    f"{name}={list(sizes)} must be a non-empty list of sizes from 1 to 72 (e.g. [1, 2, 4, 8])"
                )
        if not self.dtype or not self.expert_parallel:
            raise ValueError("dtype and expert_parallel need at least one value each (e.g. dtype: fp8)")
        if not self.families:
            raise ValueError("families is empty; allow at least one of colocated, pd, epd")
        return self


LINK_HINT = (
    "a link name (ib-ndr, roce-400, tcp-25gbe, ...: `epdsim hw list links`), a cloud node type "
    "(gcp-a3-high, aws-p5, ...) or null for each GPU's own NIC"
)


def _link_entry(v):
    """One entry of ``fabrics.links``: a name or None, refused with the forms it may take."""
    if v is None or isinstance(v, str):
        return v
    raise ValueError(f"must be {LINK_HINT}" + (f", not {v!r}" if isinstance(v, (list, dict)) else ""))


class Fabrics(StrictModel):
    """How PD candidates may move KV: fabrics to try (``None`` = each GPU's default NIC) and the connector."""

    links: tuple[Annotated[str | None, BeforeValidator(_link_entry)], ...] = (None,)
    connector: str = "nixl"

    @field_validator("links", mode="before")
    @classmethod
    def _links(cls, v):
        if isinstance(v, str):
            return (v,)
        if not isinstance(v, (list, tuple)) or not v:
            # an empty list would try no fabric, and so drop every PD candidate without a word
            raise ValueError(
                f"must be a non-empty list, each entry {LINK_HINT}; e.g. [null, ib-ndr]"
                + (", not []" if isinstance(v, (list, tuple)) else "")
            )
        return v

    @field_validator("connector", mode="before")
    @classmethod
    def _connector(cls, v):
        if not isinstance(v, str):
            shown = f", not {v!r}" if isinstance(v, (list, dict)) else ""
            raise ValueError(
                "must be the name of a KV connector of the hardware database (nixl, mooncake, "
                "p2pnccl, tcp, ...: hwdb connectors/<name>.yaml)" + shown
            )
        return v


class SearchConfig(StrictModel):
    """How hard the planner works.

    ``verify``: candidates checked by the discrete-event simulation (the
    cheapest the screen accepts, plus ``borderline`` cheaper ones it rejected
    narrowly); ``verify_front``: then the cheapest Pareto-front points with an
    estimated goodput of at least half the target that the simulation has not
    seen yet; ``replications``: seeds per simulated point; ``requests``:
    the fewest requests per simulation (runs are lengthened so that arrivals span eight request
    lifetimes, TTFT + mean output x TPOT at the SLO, and the first and last lifetime are left out);
    ``goodput_iterations``: bisection steps of the simulated goodput search;
    ``goodput_max_factor``: the search's upper bound, in multiples of the
    target rate.
    """

    verify: Annotated[int, Range(0, 1000, "candidates", whole=True)] = 6
    borderline: Annotated[int, Range(0, 100, "candidates", whole=True)] = 2
    verify_front: Annotated[int, Range(0, 100, "candidates", whole=True)] = 4
    replications: Annotated[int, Range(1, 50, "seeds", whole=True)] = 3
    # runs are capped at 50,000 requests (verify.py)
    requests: Annotated[int, Range(50, 50_000, "requests", whole=True)] | None = 1000
    goodput_iterations: Annotated[int, Range(0, 30, "steps", whole=True)] = 5
    goodput_max_factor: Annotated[float, Range(1, 100, "times the target rate", lo_open=True)] = 4.0
    seed: Seed = 0


class PlanRequest(StrictModel):
    """Everything a plan needs.  ``workload.arrival.rate`` is the target rate (requests/s) the
    deployment must sustain while meeting ``slo`` (per-request TTFT/TPOT thresholds met by at least
    ``slo.attainment`` of the requests: attainment 0.9 means the thresholds hold at p90)."""

    name: str = "plan"
    model: str
    hwdb: Folders = ()
    workload: WorkloadConfig
    slo: SLO
    gpus: tuple[GpuOffer, ...]
    fabrics: Fabrics = Fabrics()
    constraints: Constraints = Constraints()
    search: SearchConfig = SearchConfig()

    @field_validator("gpus", mode="before")
    @classmethod
    def _some_gpus(cls, v):
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError(
                "must list the GPU types you can buy or rent, e.g. [{name: H100}, {name: H200}]"
                + (f", not {v!r}" if isinstance(v, (list, tuple, dict)) else "")
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> PlanRequest:
        arrival = self.workload.arrival
        if not isinstance(arrival, (Poisson, Gamma, TraceArrivals)):  # kinds poisson, gamma, trace
            raise ValueError(
                f"workload.arrival.kind={arrival.kind!r}: the planner needs an open-loop arrival rate "
                "(poisson, gamma, or a trace with rate) to search goodput over; use kind: poisson"
            )
        if isinstance(arrival, TraceArrivals) and arrival.rate is None:
            raise ValueError("workload.arrival: a trace needs rate (requests/s) to plan for; add rate: <target>")
        if self.slo.ttft_s is None and self.slo.tpot_s is None:
            raise ValueError(
                "slo: give ttft_s, tpot_s or both; without a latency target every deployment "
                "meets the SLO and the cheapest one always wins"
            )
        names = [g.name for g in self.gpus]
        if len(set(names)) != len(names):
            raise ValueError(f"gpus lists {names}; name each GPU type once")
        return self

    @property
    def target_rate(self) -> float:
        """The arrival rate (requests/s) the deployment must sustain."""
        arrival = self.workload.arrival
        assert isinstance(arrival, (Poisson, Gamma, TraceArrivals)) and arrival.rate is not None, "checked by _check"
        return float(arrival.rate)

    @property
    def quantile(self) -> float:
        """The latency quantile the SLO is judged at: ``slo.percentile`` / 100 when given (then that
        percentile of TTFT and of TPOT must meet the targets), else the attainment (0.9: nine in ten
        requests meet both targets)."""
        return self.slo.percentile / 100.0 if self.slo.percentile is not None else self.slo.attainment

    @property
    def percentile(self) -> int:
        """:attr:`quantile` as a percentile (0.9 -> 90)."""
        return int(round(self.quantile * 100))


def parse_plan_request(data: dict, origin: str = "plan request", base: Path | None = None) -> PlanRequest:
    """Validate a mapping into a :class:`PlanRequest` (raises :class:`PlanError`)."""
    if not isinstance(data, dict):
        raise PlanError(
            f"{origin}: expected a mapping with model, workload, slo and gpus at the top level, "
            f"got {type(data).__name__}; see examples/plan_llama8b.yaml"
        )
    if base is not None:
        data = resolve_relative(data, base)
    try:
        req = PlanRequest.model_validate(data)
    except ValidationError as err:
        raise PlanError(
            format_validation_error(
                err, data, root=PlanRequest, origin=origin, what="plan request", docs="docs/planner.md"
            )
        ) from None
    resolve_hardware(req, origin)
    return req


def resolve_hardware(req: PlanRequest, origin: str = "plan request") -> tuple[hwdb.HardwareDB, hwdb.ModelEntry]:
    """The request's hardware database and model, once every name it gives (model, GPUs, links, connector)
    is found there: a name the database lacks is the request's error, naming ``origin`` (its file), the
    field, the value and the names known, not a candidate that fails to meet the SLO (raises PlanError)."""
    try:
        db = hwdb.load(req.hwdb)
    except hwdb.HwdbError as exc:
        raise PlanError(f"{origin}: hwdb: {exc}") from None
    named = [
        ("model", db.model, req.model),
        *((f"gpus[{i}].name", db.gpu, g.name) for i, g in enumerate(req.gpus)),
        *((f"fabrics.links[{i}]", db.fabric, n) for i, n in enumerate(req.fabrics.links) if n is not None),
        ("fabrics.connector", db.connector, req.fabrics.connector),
    ]
    for where, lookup, name in named:
        try:
            lookup(name)
        except hwdb.HwdbError as exc:
            raise PlanError(f"{origin}: invalid plan request:\n  {where}: {exc}") from None
    return db, db.model(req.model)


def load_plan_request(path: str | Path) -> PlanRequest:
    """Read and validate a plan request YAML file."""
    path = Path(path)
    data = read_yaml(path, PlanError, "plan request")
    return parse_plan_request(data, str(path), path.parent)
