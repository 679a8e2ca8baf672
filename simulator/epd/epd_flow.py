"""The EPD request flow in SimPy, and the per-request and summary metrics it adds.

Flow with an encoder tier (vLLM's EPD proxy): on arrival each image of a
request goes to an encoder instance (one that already holds its embedding,
else the one with the fewest outstanding images), so a request's images are
encoded in parallel across encoders; when the last one is done the proxy
picks the language-model instance (its router), every image's embedding
moves from its encoder over the fabric (max-min fair sharing,
:mod:`simulator.pd.fabric`; instances behind one NIC share it; a host-staged
path first pays its copies and CPU cost), and once all have arrived the request enters that
instance's queue.  A request without images skips the encoders.

Without an encoder tier the front pool encodes: the engine step that admits
a request also runs the encoder over its images not in that instance's
embedding cache, which lengthens that step for every request in the batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from simulator.epd.encoder import EmbeddingCache, EncoderInstance, EncoderModel
from simulator.epd.epd import EmbeddingPath, EPDSetup
from simulator.pd.fabric import Fabric, LinkState
from simulator.summary_types import EncoderSummary

if TYPE_CHECKING:  # the scenario imports the epd package (epd_config)
    from simulator.scenario import PoolConfig


class EPDCoordinator:
    """Routes images to encoders, moves embeddings, and submits requests to the front pool."""

    def __init__(self, env, setup: EPDSetup, front: list, route, choose, rng=None) -> None:
        self.env = env
        self.setup = setup
        self.route = route  # route(rid, instance or None): submit to the front pool
        self.choose = choose  # choose(rid) -> front instance index (the front router), or None
        self.images = setup.images
        self.costs = setup.costs
        n = len(setup.text_tokens)
        nan = math.nan
        self.t_enc_start = [nan] * n  # first image of the request starts encoding (or hits cache)
        self.t_encoded = [nan] * n  # last image encoded
        self.t_lm_submit = [nan] * n  # embeddings arrived: request enters the front pool's queue
        self.inline_encode_s = [0.0] * n  # front pool: encoder time added to the admitting step
        self.encoder_hits = 0
        self.bytes_moved = 0.0
        self.encoders: list[EncoderInstance] = []  # serving encoders: images go to these
        self.made: list[EncoderInstance] = []  # every encoder instance made, by index
        self.fabric: Fabric | None = None
        self.inline_caches: list[EmbeddingCache] = []
        self.inline_busy: list[float] = []  # per front instance: inline encoder seconds
        self.inline_lookups = 0  # images looked up at admissions (re-admissions included)
        self.front: list = []  # front instances by index (add_front)
        self.egress: list = []
        self.ingress: list = []
        self._pending: dict[int, int] = {}
        self._where: dict[int, EncoderInstance] = {}
        self._inflight: dict[int, list[int]] = {}  # image id -> images waiting on its one encode
        self._arrived_at: dict[int, float] = {}
        if setup.encoder_pool is not None:
            self.fabric = Fabric(env, rng)
            # Instances behind one NIC (a TCP node NIC, a layout's GPUs per NIC) share one link state.
            self._nics: dict[str, LinkState] = {}
            for _ in range(setup.encoder_pool.instances):
                self.encoders.append(self.add_encoder())
        for inst in front:
            self.add_front(inst)

    def _tier(self) -> tuple[PoolConfig, EncoderModel, EmbeddingPath]:
        """The encoder tier's pool, encoder model and embedding path (:func:`simulator.epd.epd.prepare` sets
        the three together); only called with an encoder tier."""
        s = self.setup
        assert s.encoder_pool is not None and s.encoder_model is not None and s.path is not None, "no encoder tier"
        return s.encoder_pool, s.encoder_model, s.path

    def _nic(self, name: str, cap: float) -> LinkState:
        """The link state of NIC ``name``: instances behind one NIC share one."""
        if name not in self._nics:
            self._nics[name] = LinkState(name, cap, self._tier()[2].latency_s)
        return self._nics[name]

    def add_encoder(self) -> EncoderInstance:
        """A new encoder instance (the next index) with its egress NIC; images go to it once the caller
        puts it in :attr:`encoders`, and its process (:meth:`EncoderInstance.run`) is the caller's to start."""
        (ep, model, p), i = self._tier(), len(self.made)
        enc = EncoderInstance(
            i,
            ep.name,
            model,
            self.costs,
            ep.encoder.max_batch_images,
            self.setup.max_batch_tokens,
            ep.encoder.cache_bytes,
            self._encoder_done,
        )
        self.made.append(enc)
        self.egress.append(
            self._nic(
                f"{p.link_name}:encoder{i}:out"
                if p.encoder_share == 1
                else f"{p.link_name}:encoder-nic{i // p.encoder_share}:out",
                p.encoder_side_Bps,
            )
        )
        return enc

    @property
    def encodes_inline(self) -> bool:
        """Whether the front pool encodes its own images (no encoder tier): its instances' ``encode_cost`` is
        :meth:`inline_cost`."""
        return self.setup.encoder_pool is None

    def add_front(self, inst) -> None:
        """A front-pool instance (index ``len(self.front)``): its embedding ingress, or its inline encoder."""
        assert inst.index == len(self.front)
        self.front.append(inst)
        if self.setup.encoder_pool is not None:
            p = self._tier()[2]
            self.ingress.append(
                self._nic(
                    f"{p.link_name}:{inst.pool}{inst.index}:embeddings-in"
                    if p.lm_share == 1
                    else f"{p.link_name}:{inst.pool}-nic{inst.index // p.lm_share}:embeddings-in",
                    p.lm_side_Bps,
                )
            )
        else:
            self.inline_caches.append(EmbeddingCache(self.setup.inline_cache_bytes))
            self.inline_busy.append(0.0)

    # ------------------------------------------------------------ encoder tier
    def handles(self, rid: int) -> bool:
        """Whether ``rid`` goes through the encoder tier (it has images and there is one)."""
        return self.setup.encoder_pool is not None and self.images.count(rid) > 0

    def dispatch(self, rid: int) -> None:
        imgs = self.images.of(rid)
        self._pending[rid] = len(imgs)
        self._arrived_at[rid] = self.env.now
        ids = self.costs.image_id
        for img in imgs:
            iid = int(ids[img])
            holder = next((e for e in self.encoders if iid in e.cache), None)
            if holder is not None:
                holder.cache.lookup(iid)
                self.encoder_hits += 1
                self._encoded(holder, img, self.env.now, self.env.now)
                continue
            if iid in self._inflight:  # the same image is being encoded: share that encode
                self._inflight[iid].append(img)
                self.encoder_hits += 1
                continue
            self._inflight[iid] = [img]
            enc = min(self.encoders, key=lambda e: (e.outstanding, e.index))
            enc.cache.misses += 1
            enc.submit(img)

    def _encoder_done(self, enc: EncoderInstance, img: int, started: float, now: float) -> None:
        for waiter in self._inflight.pop(int(self.costs.image_id[img])):
            self._encoded(enc, waiter, started, now)

    def _owner(self, img: int) -> int:
        return int(np.searchsorted(self.images.offsets, img, side="right") - 1)

    def _encoded(self, enc: EncoderInstance, img: int, started: float, now: float) -> None:
        rid = self._owner(img)
        # An image that joined another request's encode already under way starts when it arrived.
        started = max(started, self._arrived_at[rid])
        if not self.t_enc_start[rid] <= started:
            self.t_enc_start[rid] = started
        self._where[img] = enc
        self._pending[rid] -= 1
        if self._pending[rid]:
            return
        self.t_encoded[rid] = now
        del self._arrived_at[rid]
        inst = self.choose(rid)
        imgs = self.images.of(rid)
        if inst is None:
            # No front instance serves (operations: all crashed or still starting): the request waits at
            # the gateway for one, and the move of its embeddings to that one is not modelled.
            for i in imgs:
                del self._where[i]
            self.t_lm_submit[rid] = self.env.now
            self.route(rid, None)
            return
        self._pending[rid] = len(imgs)
        p, fabric = self._tier()[2], self.fabric
        assert fabric is not None, "an encoder tier has its fabric"

        def arrived(_event: object) -> None:  # one embedding of the request arrived at ``inst``
            self._arrived(rid, inst)

        for i in imgs:
            nbytes = float(self.costs.emb_bytes[i])
            self.bytes_moved += nbytes
            # Host staging (a connector without GPU-direct, or in its TCP mode) is paid in series before the bytes flow.
            ev = fabric.transfer(
                (self.egress[self._where.pop(i).index], self.ingress[inst]),
                nbytes,
                p.setup_s + nbytes * p.staged_s_per_byte,
            )
            ev.callbacks.append(arrived)

    def _arrived(self, rid: int, inst: int) -> None:
        self._pending[rid] -= 1
        if self._pending[rid] == 0:
            del self._pending[rid]
            self.t_lm_submit[rid] = self.env.now
            self.route(rid, inst)

    # ------------------------------------------------------------ inline encoder
    def inline_cost(self, inst, rid: int, now: float) -> float:
        """Encoder seconds the front instance ``inst`` adds to the step that admits ``rid``."""
        imgs = self.images.of(rid)
        if not imgs:
            return 0.0
        self.inline_lookups += len(imgs)
        cache = self.inline_caches[inst.index]
        c = self.costs
        todo, seen = [], set()
        for i in imgs:
            iid = int(c.image_id[i])
            if iid in seen or cache.lookup(iid):
                continue
            seen.add(iid)
            todo.append(i)
        if not todo:
            return 0.0
        idx = np.asarray(todo)
        model = self.setup.inline_model
        assert model is not None, "a front pool that encodes has its inline encoder model"
        dt = model.batch_time(
            float(c.lin_flops[idx].sum()), float(c.attn_flops[idx].sum()), float(c.patches[idx].sum())
        )
        for i in todo:
            cache.insert(int(c.image_id[i]), float(c.emb_bytes[i]))
        if math.isnan(self.t_enc_start[rid]):
            self.t_enc_start[rid] = now
        self.inline_encode_s[rid] += dt
        self.inline_busy[inst.index] += dt
        return dt


def add_columns(req: pd.DataFrame, coord: EPDCoordinator) -> pd.DataFrame:
    """Per-request image columns and the EPD split of TTFT (seconds); the split sums to ``ttft_s``.

    Encoder tier: ``encode_queue_s`` (arrival to the first image's encode
    start), ``encode_s`` (to the last image encoded), ``embedding_transfer_s``
    (to the last embedding arrived), then ``queue_s`` counts from that moment.
    Front-pool encoding: ``encode_s`` is the encoder time in the admitting
    step, taken out of ``prefill_s``.
    """
    s = coord.setup
    arrival = req["arrival_s"].to_numpy() + (req["frontend_s"].to_numpy() if "frontend_s" in req else 0.0)
    counts = np.diff(s.images.offsets)
    tokens = np.zeros(len(req), dtype=np.int64)
    if s.images.total:
        np.add.at(tokens, np.repeat(np.arange(len(req)), counts), s.costs.tokens)
    start, enc, sub = (np.asarray(x, dtype=float) for x in (coord.t_enc_start, coord.t_encoded, coord.t_lm_submit))
    tier = ~np.isnan(sub)
    out = req.copy()
    out["num_images"] = counts.astype(np.int64)
    out["visual_tokens"] = tokens
    out["text_tokens"] = np.asarray(s.text_tokens, dtype=np.int64)
    # The engine reached ``start`` through its own sum of arrival and front end: an ulp apart at most.
    out["encode_queue_s"] = np.where(tier, np.maximum(start - arrival, 0.0), 0.0)
    inline = np.asarray(coord.inline_encode_s, dtype=float)
    out["encode_s"] = np.where(tier, enc - start, inline)
    out["embedding_transfer_s"] = np.where(tier, sub - enc, 0.0)
    out["queue_s"] = np.where(tier, req["scheduled_s"].to_numpy() - sub, req["queue_s"].to_numpy())
    out["prefill_s"] = req["prefill_s"].to_numpy() - np.where(tier, 0.0, inline)
    return out


def encoder_summary(coord: EPDCoordinator, span: float) -> EncoderSummary:
    """Encoder utilisation (busy time / run span, per instance and mean), images encoded, cache hits."""
    s = coord.setup
    span = max(span, 1e-12)
    if coord.made:
        busy = [e.busy_s / span for e in coord.made]
        encoded = sum(e.images_encoded for e in coord.made)
        hits = coord.encoder_hits
        assert s.encoder_pool is not None, "encoder instances exist only with an encoder tier"
        where = s.encoder_pool.name
    else:
        busy = [b / span for b in coord.inline_busy]
        encoded = int(sum(c.misses for c in coord.inline_caches))
        hits = coord.inline_lookups - encoded
        where = coord.front[0].pool if coord.front else ""
    total = hits + encoded
    return {
        "topology": s.topology,
        "pool": where,
        "images": int(s.images.total),
        "images_encoded": int(encoded),
        "cache_hits": int(hits),
        "cache_hit_rate": hits / total if total else 0.0,
        "utilisation": float(np.mean(busy)) if busy else 0.0,
        "utilisation_per_instance": busy,
        "embedding_bytes_moved": coord.bytes_moved,
        "links": coord.fabric.link_stats() if coord.fabric is not None else [],
    }
