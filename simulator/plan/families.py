"""The deployment families the planner searches and their registry.

A family is a small strategy class (:class:`Family`) with a ``name`` and
``enumerate(ctx)``, which turns a :class:`simulator.plan.candidates.PlanContext`
into candidates: the fitting pool layouts combined with instance counts within
the constraints, and one rejected row per layout that does not fit.
``colocated`` and ``pd`` serve text and multimodal requests (images are then
encoded inside the colocated or prefill steps); ``epd`` adds a pool of
vision-encoder instances in front of a colocated pool (E+PD) or a
prefill/decode pair (E+P+D), and exists only for workloads with images.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from simulator.pd.pd import TransferConfigError, build_transfer_plan
from simulator.pd.pd_config import KVTransferConfig
from simulator.plan.candidates import Candidate, PlanContext, PoolChoice
from simulator.plan.request import PlanError, PlanRequest
from simulator.plan.screen import encode_time
from simulator.registry import Registry


class Family:
    """A deployment family: a name and an enumeration of candidates (strategy class)."""

    name = ""

    def enumerate(self, ctx: PlanContext) -> Iterator[Candidate]:
        raise NotImplementedError


def gpu_ok(ctx: PlanContext, pools: tuple[PoolChoice, ...]) -> bool:
    """Within max_gpus and each GPU type's own limit."""
    if sum(p.gpus for p in pools) > ctx.req.constraints.max_gpus:
        return False
    per: dict[str, int] = {}
    for p in pools:
        per[p.gpu] = per.get(p.gpu, 0) + p.gpus
    return all((lim := ctx.max_count(g)) is None or n <= lim for g, n in per.items())


class Colocated(Family):
    """One pool of instances that prefill and decode (vLLM's default serving)."""

    name = "colocated"

    def enumerate(self, ctx: PlanContext) -> Iterator[Candidate]:
        c = ctx.req.constraints
        for sh, price, reason in ctx.misfits:
            yield Candidate(
                f"colocated-{sh.tag()}-nofit", self.name, (sh,), sh.gpus * price, rejected=f"memory: {reason}"
            )
        for lay in ctx.layouts:
            for n in range(1, c.max_instances_per_pool + 1):
                pools = (lay.choice("colocated", n),)
                if not gpu_ok(ctx, pools):
                    break
                yield Candidate(f"colocated-{lay.tag()}-x{n}", self.name, pools, n * lay.gpus * lay.price)


class PrefillDecode(Family):
    """Prefill and decode pools (vLLM's disaggregated proxy flow), GPU type and TP chosen per pool."""

    name = "pd"

    def enumerate(self, ctx: PlanContext) -> Iterator[Candidate]:
        req, c = ctx.req, ctx.req.constraints
        for fabric in req.fabrics.links:
            for lp in ctx.layouts:
                for ld in ctx.layouts:
                    if (lp.gpu != ld.gpu and not c.heterogeneous) or lp.dtype != ld.dtype:
                        continue  # one checkpoint serves both pools
                    tag = f"pd-{lp.tag()}-{ld.tag()}" + (f"-{fabric}" if fabric else "")
                    cfg = KVTransferConfig(connector=req.fabrics.connector, fabric=fabric)
                    try:
                        plan = build_transfer_plan(cfg, ctx.db, lp.dep, ld.dep)
                    except TransferConfigError as exc:
                        pools = (lp.choice("prefill", 1), ld.choice("decode", 1))
                        yield Candidate(
                            tag + "-invalid",
                            self.name,
                            pools,
                            lp.gpus * lp.price + ld.gpus * ld.price,
                            fabric,
                            req.fabrics.connector,
                            rejected=f"kv-transfer: {exc}",
                        )
                        continue
                    for npf in range(1, c.max_instances_per_pool + 1):
                        if npf * lp.gpus >= c.max_gpus:
                            break
                        for nd in range(1, c.max_instances_per_pool + 1):
                            pools = (lp.choice("prefill", npf), ld.choice("decode", nd))
                            if not gpu_ok(ctx, pools):
                                break
                            yield Candidate(
                                f"{tag}-{npf}p{nd}d",
                                self.name,
                                pools,
                                npf * lp.gpus * lp.price + nd * ld.gpus * ld.price,
                                plan.link_name,
                                req.fabrics.connector,
                            )


def encoder_layouts(ctx: PlanContext) -> list[tuple[str, int, float, str]]:
    """(GPU, TP, $/h per GPU, reason) for every encoder layout; reason is "" when it can run."""
    images = ctx.stats.images
    assert images is not None, "encoder layouts are made for a multimodal workload"
    vision = images.vision
    out = []
    for offer in ctx.req.gpus:
        gpu = ctx.db.gpu(offer.name)
        price = gpu.price_usd_per_hour.value if offer.price_usd_per_hour is None else offer.price_usd_per_hour
        for tp in ctx.req.constraints.tp:
            why = ""
            if vision.num_heads % tp:
                why = f"encoder TP{tp} does not divide the vision encoder's {vision.num_heads} heads"
            elif tp > gpu.gpus_per_node:
                why = f"encoder TP{tp} exceeds a {gpu.name} node"
            elif vision.params * 2.0 / tp > 0.9 * gpu.memory_bytes.value:
                why = f"the vision encoder's weights do not fit {gpu.name} at TP{tp}"
            out.append((gpu.name, tp, price, why))
    return out


class EncoderPrefillDecode(Family):
    """A vision-encoder pool in front of a colocated pool (E+PD) or a homogeneous prefill/decode pair
    (E+P+D).  Encoder instances are sized to the load: the screen's smallest count that keeps each
    encoder below 70% busy at the target rate, and one more."""

    name = "epd"

    def enumerate(self, ctx: PlanContext) -> Iterator[Candidate]:
        if ctx.stats.images is None:
            return
        c = ctx.req.constraints
        lm_parts = [x for x in Colocated().enumerate(ctx) if not x.rejected]
        lm_parts += [
            x
            for x in PrefillDecode().enumerate(ctx)
            if not x.rejected and x.pool("prefill").key == x.pool("decode").key
        ]
        for g, tp, price, why in encoder_layouts(ctx):
            if why:
                yield Candidate(
                    f"epd-enc-{g}-tp{tp}-invalid",
                    self.name,
                    (PoolChoice("encoder", g, tp, 1),),
                    tp * price,
                    rejected=f"encoder: {why}",
                )
                continue
            busy = ctx.req.target_rate * encode_time(ctx, g, tp)
            need = max(1, math.ceil(busy / 0.7))
            for n in (need, need + 1):
                if n > c.max_instances_per_pool:
                    continue
                enc = PoolChoice("encoder", g, tp, n)
                for lm in lm_parts:
                    if not c.heterogeneous and any(p.gpu != g for p in lm.pools):
                        continue
                    pools = (enc, *lm.pools)
                    if not gpu_ok(ctx, pools):
                        continue
                    yield Candidate(
                        f"epd-{g}-tp{tp}-x{n}+{lm.id}",
                        self.name,
                        pools,
                        n * tp * price + lm.cost_usd_per_hour,
                        lm.fabric,
                        lm.connector,
                        embedding_fabric=ctx.req.fabrics.links[0],
                    )


# In the order the planner lists them; constraints.families names some of them.
FAMILIES: Registry[Family] = Registry(
    "deployment family", (Colocated(), PrefillDecode(), EncoderPrefillDecode()), plural="deployment families"
)


def check_families(req: PlanRequest) -> None:
    """Raise :class:`PlanError` for a family in ``constraints.families`` that is not in the registry."""
    for fam in req.constraints.families:
        if fam not in FAMILIES:
            raise PlanError(
                f"constraints.families: {fam!r} is not a deployment family this planner knows; "
                f"choose from {sorted(FAMILIES)}"
            )


def enumerate_candidates(ctx: PlanContext) -> list[Candidate]:
    """All candidates of the allowed families, in a deterministic order."""
    return [cand for fam in ctx.req.constraints.families for cand in FAMILIES[fam].enumerate(ctx)]
