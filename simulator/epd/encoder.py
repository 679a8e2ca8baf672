"""Vision-encoder instances: batched, compute-bound image encoding with an embedding cache.

Step-time model (:class:`EncoderModel`), for a batch of images with ``P``
patches in total, linear FLOPs ``L`` and attention FLOPs ``A``
(:func:`simulator.epd.vision.encoder_flops`)::

    t = max(L / (peak x ceff(P)) + A / (peak x aeff(P)),  W / (bw x meff)) / speedup(tp) + launch

``ceff``/``aeff`` are the GPU's compute and attention efficiency curves
(calibrated profile first), evaluated at the batch's patches as the
language-model step model does at its tokens; ``W`` the encoder's weight
bytes; ``launch`` the engine's eager per-layer launch cost times the depth
(vision towers run without CUDA graphs).  ``speedup(tp) = tp x eff(tp)``:
encoders shard poorly, so ``eff`` is a table, :data:`DEFAULT_TP_EFFICIENCY`,
that scenarios (or :func:`fit_tp_efficiency` from measured timings) replace.

:class:`EncoderInstance` is a SimPy process: it takes queued images FCFS
into a batch while ``max_batch_images`` and ``max_batch_tokens`` (visual
tokens) allow, encodes them in one step, and reports each image to
``on_done``.  Its LRU cache (:class:`EmbeddingCache`) holds embeddings of
recent images by id, so an image already there is not encoded again.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hwdb.schema import EfficiencyCurve

if TYPE_CHECKING:
    from simulator.engine.opsrecord import Life

DEFAULT_TP_EFFICIENCY: dict[int, float] = {1: 1.0, 2: 0.625, 4: 0.33, 8: 0.146}
"""Fraction of linear TP speed-up a vision encoder reaches.  4 and 8 follow the ratios of the SGLang EPD
blog's Qwen2.5-VL-72B ViT timings on H20 (4 images: TP2 492 ms, TP4 466 ms, TP8 524 ms; FACTS.md):
speed-up(4)/speed-up(2) = 492/466 and speed-up(8)/speed-up(2) = 492/524.  TP2 itself (1.25x over TP1) is
an empirical guess: no TP1 timing was published.  Override with ``encoder.tp_efficiency``."""


def tp_speedup(tp: int, table: dict[int, float] | None = None) -> float:
    """Speed-up of a TP-``tp`` encoder over one GPU (``tp x efficiency``)."""
    eff = dict(DEFAULT_TP_EFFICIENCY)
    if table:
        eff.update(table)
    if tp not in eff:
        raise ValueError(f"no encoder TP efficiency for tp={tp}; give encoder.tp_efficiency {{{tp}: ...}}")
    return tp * eff[tp]


def fit_tp_efficiency(times_s: dict[int, float], base: dict[int, float] | None = None) -> dict[int, float]:
    """Per-degree efficiency from measured encode times of one workload at several TP degrees.

    With a TP1 time, ``eff(tp) = t(1) / (tp t(tp))``.  Without one, the
    smallest measured degree keeps its efficiency from ``base`` (default
    :data:`DEFAULT_TP_EFFICIENCY`) and the others follow its time ratios.
    """
    if not times_s or any(t <= 0 for t in times_s.values()):
        raise ValueError("give at least one positive encode time per TP degree, e.g. {2: 0.492, 4: 0.466}")
    base = dict(DEFAULT_TP_EFFICIENCY if base is None else base)
    ref = min(times_s)
    ref_speedup = ref * (1.0 if ref == 1 else base[ref])
    return {tp: min(1.0, ref_speedup * times_s[ref] / t / tp) for tp, t in sorted(times_s.items())}


@dataclass(frozen=True)
class EncoderModel:
    """Precomputed coefficients of one encoder's batch time (SI units)."""

    peak_flops: float
    ceff: EfficiencyCurve
    aeff: EfficiencyCurve
    weight_bytes: float  # whole encoder (split over tp GPUs)
    peak_bw: float
    mem_eff: float
    speedup: float
    launch_s: float
    compute_scale: float = 1.0  # ceff.max_eff replaced: scale applied to the compute curve

    def batch_time(self, lin_flops: float, attn_flops: float, patches: float) -> float:
        """Seconds to encode a batch with these totals (0 for an empty batch)."""
        if patches <= 0:
            return 0.0
        c = self.ceff.at(patches) * self.compute_scale
        a = self.aeff.at(patches) * self.compute_scale
        t_comp = lin_flops / (self.peak_flops * c) + attn_flops / (self.peak_flops * a)
        t_mem = self.weight_bytes / (self.peak_bw * self.mem_eff)
        return (t_comp if t_comp > t_mem else t_mem) / self.speedup + self.launch_s


@dataclass(frozen=True)
class ImageCosts:
    """Per image (index into :class:`simulator.epd.multimodal.Images`): what encoding it costs and yields."""

    tokens: np.ndarray  # visual tokens (int64)
    patches: np.ndarray  # patches through the encoder blocks
    lin_flops: np.ndarray
    attn_flops: np.ndarray
    emb_bytes: np.ndarray  # embedding bytes sent to prefill
    image_id: np.ndarray


class EmbeddingCache:
    """LRU of image ids whose embeddings an instance holds, bounded in bytes."""

    def __init__(self, capacity_bytes: float) -> None:
        self.capacity = capacity_bytes
        self.used = 0.0
        self.items: OrderedDict[int, float] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def lookup(self, image_id: int) -> bool:
        """Whether ``image_id`` is cached (a hit refreshes it); counts hits and misses."""
        if image_id in self.items:
            self.items.move_to_end(image_id)
            self.hits += 1
            return True
        self.misses += 1
        return False

    def __contains__(self, image_id: int) -> bool:
        return image_id in self.items

    def insert(self, image_id: int, nbytes: float) -> None:
        if self.capacity <= 0 or nbytes > self.capacity or image_id in self.items:
            return
        self.items[image_id] = nbytes
        self.used += nbytes
        while self.used > self.capacity:
            _, b = self.items.popitem(last=False)
            self.used -= b


class EncoderInstance:
    """One encoder instance; :meth:`run` is its SimPy process.

    Invariants: every submitted image is reported to ``on_done`` exactly once;
    a step holds at least one image and at most ``max_images`` images, and more
    than one only while their visual tokens fit ``max_tokens``.
    """

    def __init__(
        self,
        index: int,
        pool: str,
        model: EncoderModel,
        costs: ImageCosts,
        max_images: int,
        max_tokens: int,
        cache_bytes: float,
        on_done,
    ) -> None:
        self.index = index
        self.pool = pool
        self.model = model
        self.costs = costs
        self.max_images = max_images
        self.max_tokens = max_tokens
        self.cache = EmbeddingCache(cache_bytes)
        self.on_done = on_done
        self.queue: deque[int] = deque()
        self.outstanding = 0
        self.life: Life | None = None  # its billing record in an operations run
        self.busy_s = 0.0
        self.images_encoded = 0
        self.steps: list[tuple[float, float, int, int]] = []  # (start, duration, images, tokens)
        self.wake = None

    def submit(self, img: int) -> None:
        self.queue.append(img)
        self.outstanding += 1
        if self.wake is not None:
            wake, self.wake = self.wake, None
            wake.succeed()

    def run(self, env):
        c = self.costs
        queue = self.queue
        while True:
            if not queue:
                self.wake = env.event()
                yield self.wake
                continue
            batch = [queue.popleft()]
            tokens = int(c.tokens[batch[0]])
            while queue and len(batch) < self.max_images and tokens + c.tokens[queue[0]] <= self.max_tokens:
                img = queue.popleft()
                batch.append(img)
                tokens += int(c.tokens[img])
            idx = np.asarray(batch)
            dt = self.model.batch_time(
                float(c.lin_flops[idx].sum()), float(c.attn_flops[idx].sum()), float(c.patches[idx].sum())
            )
            t0 = env.now
            yield env.timeout(dt)
            self.busy_s += dt
            self.steps.append((t0, dt, len(batch), tokens))
            now = env.now
            for img in batch:
                self.cache.insert(int(c.image_id[img]), float(c.emb_bytes[img]))
                self.outstanding -= 1
                self.images_encoded += 1
                self.on_done(self, img, t0, now)
