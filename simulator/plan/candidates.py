"""Candidate deployments and the context the planner's families enumerate them from.

:func:`build_context` makes the :class:`PlanContext`: every pool layout
(GPU type x TP) is first checked for memory fit once (vLLM's own split,
:func:`simulator.perf.plan_memory`); layouts that do not fit are kept as
misfits (a family makes one rejected row of each), the others as
:class:`Layout` objects.  The families (:mod:`simulator.plan.families`)
combine layouts with instance counts within the constraints.  A candidate is
plain data; :func:`to_scenario` makes it a
:class:`~simulator.scenario.Scenario` that the simulator runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

import hwdb
from simulator.epd.epd import EPDError, draw_images, image_costs
from simulator.epd.vision import VisionArch, VisionError, vision_arch
from simulator.errors import WorkloadError
from simulator.perf import Deployment, FitError, MemoryPlan, plan_memory
from simulator.plan.request import PlanError, PlanRequest, resolve_hardware
from simulator.resolved import rng_streams
from simulator.scenario import PoolConfig, Scenario, ScenarioError, deployment_for, parse_scenario
from simulator.step_build import build_step_model
from simulator.stepmodel import StepModel
from simulator.workload import generate

PRE_SCREEN = ("memory", "kv-transfer", "encoder", "embedding-transfer")  # reasons that rule a row out unscreened


@dataclass(frozen=True)
class PoolChoice:
    """One pool of a candidate: ``instances`` identical instances of ``dp`` x ``tp`` GPUs of type ``gpu``
    (``dp`` attention data-parallel ranks of ``tp`` GPUs each, experts over ``ep`` of them), weights in
    ``dtype``."""

    role: str  # colocated | prefill | decode | encoder
    gpu: str  # hwdb canonical name
    tp: int
    instances: int
    dtype: str = "bf16"
    dp: int = 1
    ep: int = 1

    @property
    def gpus(self) -> int:
        return self.tp * self.dp * self.instances

    @property
    def key(self) -> tuple:
        """The :class:`Layout` this pool runs (its :attr:`Layout.key`)."""
        return (self.gpu, self.dtype, self.tp, self.dp, self.ep)

    def shape(self) -> str:
        """``TP4``, ``DP4xTP2 EP8 fp4``: the per-instance layout, defaults left out."""
        text = (f"DP{self.dp}xTP{self.tp}" if self.dp > 1 else f"TP{self.tp}") + (
            f" EP{self.ep}" if self.ep > 1 else ""
        )
        return text + ("" if self.dtype == "bf16" or self.role == "encoder" else f" {self.dtype}")

    def tag(self) -> str:
        """The layout's part of a candidate id: ``H100-tp2``, ``B200-fp4-dp4-tp2-ep8``."""
        return (
            self.gpu
            + (f"-{self.dtype}" if self.dtype != "bf16" else "")
            + (f"-dp{self.dp}" if self.dp > 1 else "")
            + f"-tp{self.tp}"
            + (f"-ep{self.ep}" if self.ep > 1 else "")
        )

    def label(self) -> str:
        return f"{self.instances}x {self.gpu} {self.shape()}" + ("" if self.role == "colocated" else f" {self.role}")


@dataclass(frozen=True)
class Candidate:
    """A deployment the planner considers; ``rejected`` is set when it was ruled out before screening."""

    id: str
    family: str
    pools: tuple[PoolChoice, ...]
    cost_usd_per_hour: float
    fabric: str | None = None
    connector: str | None = None
    rejected: str = ""
    embedding_fabric: str | None = None  # encoder -> language model (EPD)

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    @property
    def layout(self) -> str:
        text = " + ".join(p.label() for p in self.pools)
        return text + (f" over {self.fabric}" if self.fabric else "")

    def pool(self, role: str) -> PoolChoice:
        return next(p for p in self.pools if p.role == role)


@dataclass(frozen=True)
class Layout:
    """A pool layout (GPU type, weight format, TP, DP, EP) that fits: its resolved deployment, memory plan
    and step model (one data-parallel rank's)."""

    gpu: str
    tp: int
    dep: Deployment
    mem: MemoryPlan
    step: StepModel
    price: float  # $/h per GPU (the request's price, else hwdb's)
    dtype: str = "bf16"
    dp: int = 1
    ep: int = 1

    @property
    def key(self) -> tuple:
        return (self.gpu, self.dtype, self.tp, self.dp, self.ep)

    @property
    def gpus(self) -> int:
        """GPUs of one instance (dp x tp)."""
        return self.tp * self.dp

    def choice(self, role: str, instances: int) -> PoolChoice:
        return PoolChoice(role, self.gpu, self.tp, instances, self.dtype, self.dp, self.ep)

    def tag(self) -> str:
        return self.choice("colocated", 1).tag()


@dataclass(frozen=True)
class ImageStats:
    """Per-request means of a multimodal workload's encoder work (FLOPs, patches, bytes, tokens)."""

    vision: VisionArch
    images: float
    lin_flops: float
    attn_flops: float
    patches: float
    emb_bytes: float
    tokens: float


@dataclass(frozen=True)
class WorkloadStats:
    """Length statistics of the planned workload (tokens, visual tokens included), from one sample."""

    mean_in: float
    mean_out: float
    q_in: float  # input length at the SLO percentile
    n: int
    images: ImageStats | None = None


@dataclass
class PlanContext:
    """What enumeration and screening share: hardware, model, request, fitting layouts."""

    req: PlanRequest
    db: hwdb.HardwareDB
    model: hwdb.ModelEntry
    stats: WorkloadStats
    layouts: list[Layout] = field(default_factory=list)
    # layout (1 instance), $/h per GPU, reason
    misfits: list[tuple[PoolChoice, float, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def profile(self, gpu: str):
        """The calibration profile a simulated candidate on ``gpu`` uses: looked up by the key it is
        stored under (GPU, engine, engine version, model), as :func:`simulator.scenario.deployment_for`
        does; None when the GPU has none for this engine and model."""
        try:
            engine = self.db.engine(self.req.constraints.engine.engine)
            family, version = engine.engine, engine.version
        except hwdb.HwdbError:  # an unknown engine is refused while building layouts
            family, version = "vllm", None
        return self.db.profile_for(self.db.gpu(gpu).name, family, version, self.model.name)

    def max_count(self, gpu: str) -> int | None:
        offer = next(o for o in self.req.gpus if self.db.gpu(o.name).name == gpu)
        return offer.max_gpus


def _sample_stats(req: PlanRequest, model) -> WorkloadStats:
    wl = req.workload
    if wl.arrival.kind != "trace":
        # model_copy skips validation: keep the sample within what a run may generate
        wl = wl.model_copy(
            update={"num_requests": min(50_000, max(2000, req.search.requests or 0)), "duration_s": None}
        )
    rngs = rng_streams(req.search.seed, 0)
    try:
        reqs = generate(wl, rngs["arrivals"], rngs["lengths"])
    except WorkloadError as exc:
        raise PlanError(f"workload: {exc}") from None
    inp, out = reqs.input_tokens.astype(float), reqs.output_tokens.astype(float)
    img = None
    if wl.images is not None:
        try:
            vision = vision_arch(model)
            images = draw_images(wl, len(inp), rngs["images"])  # as simulate draws them, from the same stream
            costs = image_costs(vision, images, "workload.images.resolutions")
        except (VisionError, EPDError) as exc:
            raise PlanError(f"workload.images: {exc}") from None
        per_req = np.zeros(len(inp))
        if images.total:
            np.add.at(per_req, np.repeat(np.arange(len(inp)), np.diff(images.offsets)), costs.tokens)
        inp = inp + per_req
        n = len(inp)
        img = ImageStats(
            vision,
            images.total / n,
            float(costs.lin_flops.sum() / n),
            float(costs.attn_flops.sum() / n),
            float(costs.patches.sum() / n),
            float(costs.emb_bytes.sum() / n),
            float(per_req.mean()),
        )
    return WorkloadStats(
        float(inp.mean()), float(max(1.0, out.mean())), float(np.quantile(inp, req.quantile)), len(inp), img
    )


def _known(db, name: str) -> bool:
    try:
        db.gpu(name)
        return True
    except hwdb.HwdbError:
        return False


def build_context(req: PlanRequest) -> PlanContext:
    """Load hardware, sample the workload and check every (GPU, TP) layout's memory fit once."""
    db, model = resolve_hardware(req)
    ctx = PlanContext(req, db, model, _sample_stats(req, model))
    c = req.constraints
    calibrated = {o.name for o in req.gpus if _known(db, o.name) and ctx.profile(o.name) is not None}
    for offer in req.gpus:
        gpu = db.gpu(offer.name)
        if c.prefer_calibrated and calibrated and offer.name not in calibrated:
            ctx.notes.append(
                f"{gpu.name} left out (constraints.prefer_calibrated): no calibration profile, "
                "its figures are datasheet-only"
            )
            continue
        price = gpu.price_usd_per_hour.value if offer.price_usd_per_hour is None else offer.price_usd_per_hour
        for dtype, tp, dp, ep in _shapes(c, model):
            shape = PoolChoice("colocated", gpu.name, tp, 1, dtype, dp, ep)
            pool = PoolConfig(
                gpu=gpu.name, tp=tp, dp=dp, ep=ep, dtype=dtype, kv_cache_dtype=c.kv_cache_dtype, engine=c.engine
            )
            try:
                dep = deployment_for(pool, model, db)
                mem = plan_memory(dep)
            except (ScenarioError, FitError) as exc:
                reason = str(exc).split(": ", 1)[-1] if isinstance(exc, ScenarioError) else str(exc)
                ctx.misfits.append((shape, price, reason))
                continue
            if shape.gpus > c.max_gpus or (offer.max_gpus is not None and shape.gpus > offer.max_gpus):
                ctx.misfits.append((shape, price, f"{shape.shape()} exceeds the GPU limit of the constraints"))
                continue
            ctx.layouts.append(Layout(gpu.name, tp, dep, mem, build_step_model(dep), price, dtype, dp, ep))
    if not ctx.layouts:
        why = "; ".join(f"{sh.gpu} {sh.shape()}: {r}" for sh, _, r in ctx.misfits[:6])
        raise PlanError(
            f"no (GPU, TP) layout can serve {model.name} within the constraints "
            f"(gpus {[o.name for o in req.gpus]}, tp {list(c.tp)}, max_gpus {c.max_gpus}): {why}. "
            "Fix: allow larger TP (constraints.tp), more GPUs (constraints.max_gpus), GPUs with more "
            "memory, fp8 weights (constraints.dtype), or a smaller engine.max_model_len."
        )
    return ctx


def _shapes(c, model) -> Iterator[tuple[str, int, int, int]]:
    """(dtype, tp, dp, ep) per instance to try.  Data-parallel attention and expert parallelism apply to
    MoE models only (for a dense model DP ranks are independent replicas: more instances); EP, when tried,
    spans every GPU of the instance (vLLM's rule: EP = DP x TP)."""
    moe = model.arch.is_moe
    for dtype in c.dtype:
        for tp in c.tp:
            for dp in c.dp if moe else (1,):
                for ep in dict.fromkeys(tp * dp if on and moe and tp * dp > 1 else 1 for on in c.expert_parallel):
                    yield dtype, tp, dp, ep


def to_scenario(req: PlanRequest, cand: Candidate, rate: float | None = None) -> Scenario:
    """The scenario that simulates ``cand`` under the request's workload (at ``rate`` if given)."""
    c = req.constraints
    pools = [
        {
            "name": "main" if p.role == "colocated" else p.role,
            "role": p.role,
            "gpu": p.gpu,
            "tp": p.tp,
            "dp": p.dp,
            "ep": p.ep,
            "instances": p.instances,
            "dtype": p.dtype if p.role != "encoder" else "bf16",
            "kv_cache_dtype": c.kv_cache_dtype,
            "engine": c.engine.model_dump(exclude_defaults=True),
        }
        for p in cand.pools
    ]
    wl = req.workload.model_dump(mode="json", exclude_none=True)
    if req.search.requests is not None:
        wl["num_requests"] = req.search.requests
        wl.pop("duration_s", None)
    if rate is not None:
        wl["arrival"]["rate"] = rate
        if wl["arrival"]["kind"] == "trace":
            wl["arrival"].pop("time_scale", None)
    data = {
        "name": f"{req.name}:{cand.id}",
        "seed": req.search.seed,
        "model": req.model,
        "hwdb": list(req.hwdb),
        "pools": pools,
        "workload": wl,
        "slo": req.slo.model_dump(exclude_none=True),
    }
    if any(p.role == "prefill" for p in cand.pools):
        data["kv_transfer"] = {"connector": cand.connector or req.fabrics.connector, "fabric": cand.fabric}
    if any(p.role == "encoder" for p in cand.pools):
        data["embedding_transfer"] = {"connector": req.fabrics.connector, "fabric": cand.embedding_fabric}
    return parse_scenario(data, f"candidate {cand.id}")
