"""Encoder-prefill-decode (EPD) disaggregation: topology checks and the set-up of a multimodal run.

Topologies (pool roles of a scenario):

``colocated``                one pool encodes, prefills and decodes (vLLM runs the encoder
                             inside the engine step that schedules the image's tokens)
``encoder + colocated``      E + PD: encoder instances, a colocated language model
``encoder + prefill + decode``  E + P + D: three tiers
``prefill + decode``         EP + D when requests carry images: prefill instances encode

:func:`prepare` checks the topology (vision model, the encoder's path to the
prefill pool, image limits), adds each request's visual tokens to its prompt
(they count toward prompt length, KV and KV transfer), and returns an
:class:`EPDSetup` that :class:`simulator.epd.epd_flow.EPDCoordinator` runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

import hwdb
from hwdb.schema import DTYPE_BYTES
from simulator.epd.encoder import EncoderModel, ImageCosts, tp_speedup
from simulator.epd.epd_config import FixedCount
from simulator.epd.multimodal import Images, generate_images, read_azure_multimodal
from simulator.epd.vision import (
    VisionArch,
    VisionError,
    embedding_bytes,
    encoder_flops,
    patches,
    vision_arch,
    visual_tokens,
)
from simulator.traces import TraceError

if TYPE_CHECKING:  # the scenario imports the epd package (epd_config)
    from simulator.scenario import PoolConfig


class EPDError(ValueError):
    """A multimodal scenario that cannot run; the message names the field, the value and the fix."""


@dataclass(frozen=True)
class EmbeddingPath:
    """How embeddings move from one encoder instance to one language-model instance (SI units).

    ``encoder_side_Bps`` / ``lm_side_Bps``: the NIC group an instance sends or receives through (one NIC per
    GPU on RDMA rails, one per node on TCP/VPC, or the network layout's GPUs per NIC); ``encoder_share`` /
    ``lm_share`` instances sit behind one such group and share it.  ``staged_s_per_byte``: host staging of a
    connector without GPU-direct (or of one in its TCP mode): GPU->host and host->GPU copies over PCIe and
    the link's per-byte CPU cost on both ends, paid in series before the bytes flow, as on the KV path.
    """

    link_name: str
    encoder_side_Bps: float
    lm_side_Bps: float
    latency_s: float
    setup_s: float
    staged_s_per_byte: float = 0.0
    encoder_share: int = 1
    lm_share: int = 1
    host_staged: bool = False

    def idle_time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` on an idle path."""
        return (
            2 * self.latency_s
            + self.setup_s
            + nbytes * self.staged_s_per_byte
            + nbytes / min(self.encoder_side_Bps, self.lm_side_Bps)
        )

    def per_instance_Bps(self) -> float:
        """An instance's fair share of the narrower side when every instance behind a NIC sends at once."""
        return min(self.encoder_side_Bps / self.encoder_share, self.lm_side_Bps / self.lm_share)


@dataclass(frozen=True)
class EPDSetup:
    """Everything the EPD coordinator needs; ``encoder_pool`` is None when the front pool encodes."""

    topology: str
    vision: VisionArch
    images: Images
    costs: ImageCosts
    text_tokens: np.ndarray
    encoder_pool: PoolConfig | None = None  # the encoder tier's pool
    encoder_model: EncoderModel | None = None
    inline_model: EncoderModel | None = None  # encoder run inside the front (colocated/prefill) pool
    inline_cache_bytes: float = 0.0
    path: EmbeddingPath | None = None
    max_batch_tokens: int = 0
    gpus: int = 0
    price_usd_per_hour: float = 0.0
    encoder_gpu: str = ""


def topology(roles: list[str], has_images: bool) -> str:
    r = sorted(roles)
    if r == ["colocated"]:
        return "colocated"
    if r == ["colocated", "encoder"]:
        return "E+PD"
    if r == ["decode", "encoder", "prefill"]:
        return "E+P+D"
    return "EP+D" if has_images else "P+D"


def encoder_model(vision: VisionArch, gpu, engine, profile, tp: int, cfg) -> EncoderModel:
    """Batch-time coefficients of ``vision`` on ``tp`` GPUs of type ``gpu`` (see :mod:`simulator.epd.encoder`)."""
    ceff = profile.compute_efficiency if profile and profile.compute_efficiency else gpu.compute_efficiency
    aeff = profile.attention_prefill_efficiency if profile and profile.attention_prefill_efficiency else ceff
    meff = profile.memory_efficiency if profile and profile.memory_efficiency else gpu.memory_efficiency
    scale = cfg.compute_efficiency / ceff.max_eff if cfg.compute_efficiency else 1.0
    return EncoderModel(
        peak_flops=gpu.peak_flops["bf16"].value,
        ceff=ceff,
        aeff=aeff,
        weight_bytes=vision.params * DTYPE_BYTES["bf16"],
        peak_bw=gpu.memory_bandwidth_Bps.value,
        mem_eff=meff.max_eff,
        speedup=tp_speedup(tp, cfg.tp_efficiency),
        launch_s=engine.eager_launch_s_per_layer.value * vision.depth,
        compute_scale=scale,
    )


def image_costs(vision: VisionArch, images: Images, where: str) -> ImageCosts:
    """Per-image tokens, patches, FLOPs and embedding bytes (computed once per distinct resolution)."""
    n = images.total
    out = {k: np.zeros(n) for k in ("tokens", "patches", "lin", "attn", "bytes")}
    memo: dict[tuple[int, int], tuple] = {}
    for i in range(n):
        key = (int(images.width[i]), int(images.height[i]))
        if key not in memo:
            try:
                tok = visual_tokens(vision, *key)
                memo[key] = (tok, patches(vision, *key), *encoder_flops(vision, *key), embedding_bytes(vision, tok))
            except VisionError as exc:
                raise EPDError(f"{where}: {exc}") from None
        for k, v in zip(out, memo[key], strict=True):
            out[k][i] = v
    return ImageCosts(
        out["tokens"].astype(np.int64), out["patches"], out["lin"], out["attn"], out["bytes"], images.image_id
    )


def embedding_path(cfg, db: hwdb.HardwareDB, enc_pool, enc_gpu, enc_gpus: int, lm_pool, lm_dep) -> EmbeddingPath:
    """The path from an encoder instance to a language-model instance, or :class:`EPDError` if there is none.

    Resolved as the KV path is (:func:`simulator.pd.pd.build_transfer_plan`): ``fabric`` names a link or a node
    type's network layout (its GPUs per NIC and NIC rate); RDMA NICs come one per GPU, a TCP/VPC NIC one per
    node, shared by the instances on it.  A connector that needs GPU-direct RDMA runs over a TCP fabric in its
    TCP mode (``tcp_mode_efficiency``), staged through host memory; one without a TCP mode is refused."""
    where = (
        f"embedding_transfer: encoder pool '{enc_pool.name}' ({enc_gpu.name}) has no path to "
        f"{lm_pool.role} pool '{lm_pool.name}' ({lm_dep.gpu.name})"
    )
    try:
        conn = db.connector(cfg.connector)
    except hwdb.HwdbError as exc:
        raise EPDError(f"embedding_transfer.connector: {exc}") from None
    share_e = share_l = 1
    if cfg.same_node:
        if enc_gpu.name != lm_dep.gpu.name:
            raise EPDError(f"{where}: same_node needs one GPU type in the node; set same_node: false and name a fabric")
        if enc_gpus + lm_dep.gpus > enc_gpu.gpus_per_node:
            raise EPDError(
                f"{where}: one encoder ({enc_gpus} GPUs) and one {lm_pool.role} instance "
                f"({lm_dep.gpus} GPUs) do not fit in a {enc_gpu.gpus_per_node}-GPU node; set same_node: "
                "false"
            )
        link, lay = lm_dep.intra_link, None
        side_e = side_l = link.effective_Bps
    else:
        name = cfg.fabric or enc_gpu.scale_out_link or lm_dep.gpu.scale_out_link
        if name is None:
            raise EPDError(
                f"{where}: neither GPU has a scale-out link; name embedding_transfer.fabric (e.g. "
                "roce-200, tcp-25gbe) or set same_node: true"
            )
        try:
            link, lay = db.fabric(name)
        except hwdb.HwdbError as exc:
            raise EPDError(f"embedding_transfer.fabric: {exc}") from None
        if link.kind in ("nvlink", "xgmi", "pcie"):
            raise EPDError(
                f"{where}: embedding_transfer.fabric={link.name} is an intra-node link and cannot "
                "connect instances on different nodes; use an InfiniBand/RoCE/TCP fabric, or same_node: "
                "true"
            )
        if lay is not None:
            for gpu, role in ((enc_gpu, "encoder"), (lm_dep.gpu, lm_pool.role)):
                if gpu.name not in lay.gpus:
                    raise EPDError(
                        f"{where}: embedding_transfer.fabric={lay.name} is the network of {lay.provider} "
                        f"{lay.instance} ({lay.gpus_per_node}x {'/'.join(lay.gpus)}) but the {role} pool "
                        f"runs on {gpu.name}; use a link (ib-ndr, roce-400, tcp-25gbe, ...) or that GPU"
                    )
        shared_nic = link.kind in ("tcp", "vpc")
        nic = lay.per_nic_Bps * link.efficiency.value if lay is not None else link.effective_Bps

        def side(gpu, gpus: int) -> tuple[float, int]:
            g = lay.gpus_per_nic if lay is not None else gpu.gpus_per_node if shared_nic else 1
            return nic * max(1, gpus // g), max(1, g // gpus)  # NICs it spans x rate, instances per NIC

        (side_e, share_e), (side_l, share_l) = side(enc_gpu, enc_gpus), side(lm_dep.gpu, lm_dep.gpus)
    host_staged, eff = conn.host_staged, conn.efficiency.value
    if conn.gpu_direct_required and not link.gpu_direct:
        if conn.tcp_mode_efficiency is None:
            raise EPDError(
                f"{where}: connector {conn.name} needs GPU-direct RDMA but {link.name} has none and no "
                "TCP mode; set embedding_transfer.connector: tcp (or nixl, mooncake: they run over TCP), "
                "or use an RDMA fabric (ib-*, roce-*)"
            )
        host_staged, eff = True, conn.tcp_mode_efficiency.value  # its TCP mode: staged through host memory
    if cfg.bandwidth_Bps is not None:
        side_e = side_l = cfg.bandwidth_Bps
        share_e = share_l = 1
    staged = 0.0
    if host_staged:
        # Each rank copies its part GPU->host and serialises it; the receiver does the reverse.
        pcie = db.link("pcie-gen5-x16")
        staged = (2.0 / pcie.effective_Bps + 2.0 * link.cpu_cost_s_per_byte.value) / min(enc_gpus, lm_dep.tp)
    return EmbeddingPath(
        lay.name if lay is not None else link.name,
        side_e * eff,
        side_l * eff,
        link.latency_s.value,
        conn.setup_s.value,
        staged,
        share_e,
        share_l,
        host_staged,
    )


def _has_images(wl) -> bool:
    im = wl.images
    return im is not None and not (isinstance(im.count, FixedCount) and im.count.value == 0)


def draw_images(wl, n: int, rng) -> Images:
    """The images of ``n`` requests of workload ``wl`` (which has ``images``), drawn from ``rng`` (the
    seed tree's images stream); a ``trace`` count reads NumImages from the replayed Azure trace.  The
    planner's screen samples its workload through this too, so it sees the simulation's inputs."""
    counts = None
    if wl.images.count.kind == "trace":
        arrival = wl.arrival
        if arrival.kind != "trace":
            raise EPDError(
                "workload.images.count: kind 'trace' reads NumImages from an Azure multimodal trace; "
                "replay one with arrival {kind: trace, path: ...}, or give a fixed/uniform/choice count"
            )
        try:
            counts = read_azure_multimodal(arrival.path, arrival.limit)
        except TraceError as exc:
            raise EPDError(f"workload.images: {exc}") from None
    return generate_images(wl.images, n, rng, counts)


def prepare(scn, db: hwdb.HardwareDB, model: hwdb.ModelEntry, pools: Sequence, reqs, rng):
    """Check a multimodal scenario and build its :class:`EPDSetup` (None for a text-only, encoder-less run).

    ``pools``: the resolved language-model pools (:class:`simulator.resolved.ResolvedPool`).
    Returns ``(requests with visual tokens in their prompts, setup)``.  Raises :class:`EPDError`.
    """
    wl = scn.workload
    enc_pools = [p for p in scn.pools if p.role == "encoder"]
    images_on = _has_images(wl)
    if not images_on and not enc_pools:
        return reqs, None
    try:
        vision = vision_arch(model)
    except VisionError as exc:
        field = "workload.images" if images_on else f"pools[{enc_pools[0].name}]"
        raise EPDError(f"{field}: {exc}") from None
    by_role = {r.role: (r.pool, r.dep) for r in pools}
    front_pool, front_dep = by_role.get("colocated") or by_role["prefill"]
    n = len(reqs)
    if wl.images is not None:
        images = draw_images(wl, n, rng)
    else:
        images = Images(np.zeros(n + 1, dtype=np.int64), *(np.zeros(0, dtype=np.int64),) * 3)
    costs = image_costs(vision, images, "workload.images.resolutions")
    per_req = np.add.reduceat(np.append(costs.tokens, 0), images.offsets[:-1]) if images.total else np.zeros(n)
    per_req = np.where(np.diff(images.offsets) > 0, per_req, 0).astype(np.int64)
    text = np.asarray(reqs.input_tokens, dtype=np.int64)
    if wl.images is not None and wl.images.trace_tokens_include_images:
        text = np.maximum(1, text - per_req)
    biggest = int(costs.tokens.max()) if images.total else 0
    max_len = min(r.dep.knobs.max_model_len for r in pools)
    if biggest >= max_len:
        i = int(np.argmax(costs.tokens))
        raise EPDError(
            f"workload.images.resolutions: a {images.width[i]}x{images.height[i]} image gives {biggest} "
            f"visual tokens, more than max_model_len={max_len} allows in one prompt; use smaller "
            "images or raise engine.max_model_len"
        )
    new_reqs = dataclasses.replace(reqs, input_tokens=text + per_req)
    eng = front_dep.engine
    setup = partial(
        EPDSetup,
        topology=topology([p.role for p in scn.pools], images_on),
        vision=vision,
        images=images,
        costs=costs,
        text_tokens=text,
    )
    if not enc_pools:
        cfg = front_pool.encoder
        inline = encoder_model(vision, front_dep.gpu, eng, front_dep.profile, front_dep.tp, cfg)
        return new_reqs, setup(inline_model=inline, inline_cache_bytes=cfg.cache_bytes)
    ep = enc_pools[0]
    if ep.model is not None and db.model(ep.model).name != model.name:
        raise EPDError(
            f"pools[{ep.name}].model: the encoder pool serves {ep.model} but the language model is "
            f"{model.name}; embeddings only fit the model whose encoder made them: use one model"
        )
    try:
        gpu = db.gpu(ep.gpu)
    except hwdb.HwdbError as exc:
        raise EPDError(f"pools[{ep.name}].gpu: {exc}") from None
    if vision.num_heads % ep.tp:
        raise EPDError(
            f"pools[{ep.name}].tp={ep.tp} does not divide the vision encoder's {vision.num_heads} heads; "
            "choose a divisor"
        )
    if ep.pp != 1 or ep.dtype == "fp8":
        raise EPDError(
            f"pools[{ep.name}]: an encoder pool runs the vision encoder in bf16/fp16 without pipeline "
            f"stages (got dtype={ep.dtype}, pp={ep.pp}); set dtype: bf16 and pp: 1"
        )
    if ep.tp > gpu.gpus_per_node:
        raise EPDError(f"pools[{ep.name}].tp={ep.tp} exceeds the {gpu.gpus_per_node} GPUs of a {gpu.name} node")
    wbytes = vision.params * DTYPE_BYTES["bf16"] / ep.tp
    if wbytes > 0.9 * gpu.memory_bytes.value:
        raise EPDError(
            f"pools[{ep.name}]: the encoder's {wbytes / 2**30:.1f} GiB of weights per GPU do not fit a "
            f"{gpu.name}; raise tp or choose a larger GPU"
        )
    cfg = ep.encoder
    budget = cfg.max_batch_tokens or max(vision.max_tokens_per_image, 8192)
    if biggest > budget:
        raise EPDError(
            f"pools[{ep.name}].encoder.max_batch_tokens={budget}: an image of {biggest} visual tokens "
            f"(workload.images.resolutions) exceeds one encoder step's budget; raise max_batch_tokens "
            f"to at least {biggest} or use smaller images"
        )
    try:
        engine = db.engine(ep.engine.engine)
        path = embedding_path(scn.embedding_transfer, db, ep, gpu, ep.tp, front_pool, front_dep)
        model_e = encoder_model(
            vision, gpu, engine, db.profile_for(gpu.name, engine.engine, engine.version), ep.tp, cfg
        )
    except (hwdb.HwdbError, ValueError) as exc:
        if isinstance(exc, EPDError):
            raise
        raise EPDError(f"pools[{ep.name}]: {exc}") from None
    return new_reqs, setup(
        encoder_pool=ep,
        encoder_model=model_e,
        path=path,
        max_batch_tokens=budget,
        gpus=ep.instances * ep.tp,
        price_usd_per_hour=ep.instances * ep.tp * gpu.price_usd_per_hour.value,
        encoder_gpu=gpu.name,
    )
