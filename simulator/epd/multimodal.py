"""Multimodal requests: images per request, their sizes and ids, and the Azure multimodal trace.

:func:`generate_images` draws, for ``n`` requests, how many images each
carries and which catalogue image each is (an id fixes the resolution, so a
repeated id is the same image and can hit an encoder cache).  Draws use only
the ``images`` random stream, so adding images never moves arrivals or
lengths.  :func:`read_azure_multimodal` reads the ``NumImages`` column of an
Azure multimodal trace (``TIMESTAMP,NumImages,ContextTokens,GeneratedTokens``),
in the same order as :func:`simulator.traces.read_trace` returns its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.epd.epd_config import ChoiceCount, FixedCount, ImageWorkload, TraceCount, UniformCount
from simulator.trace_files import TraceError, numbers_of, read_csv_rows

AZURE_MM_COLUMNS = ("TIMESTAMP", "NumImages", "ContextTokens", "GeneratedTokens")


@dataclass(frozen=True, eq=False)
class Images:
    """Images of ``n`` requests as flat arrays: request r owns ``offsets[r]:offsets[r+1]``.

    Invariants: ``offsets`` is int64, non-decreasing, starts at 0 and ends at
    the number of images; ``width``, ``height`` (pixels, >= 1) and ``image_id``
    (>= 0) have one entry per image.
    """

    offsets: np.ndarray
    width: np.ndarray
    height: np.ndarray
    image_id: np.ndarray

    def count(self, rid: int) -> int:
        return int(self.offsets[rid + 1] - self.offsets[rid])

    def of(self, rid: int) -> range:
        return range(int(self.offsets[rid]), int(self.offsets[rid + 1]))

    @property
    def total(self) -> int:
        return int(self.offsets[-1])


def _counts(cfg: ImageWorkload, n: int, rng: np.random.Generator, trace_counts: np.ndarray | None) -> np.ndarray:
    c = cfg.count
    if isinstance(c, FixedCount):
        return np.full(n, c.value, dtype=np.int64)
    if isinstance(c, UniformCount):
        return rng.integers(c.low, c.high, size=n, endpoint=True, dtype=np.int64)
    if isinstance(c, ChoiceCount):
        w = np.asarray(c.weights if c.weights is not None else [1.0] * len(c.values), dtype=float)
        return np.asarray(c.values, dtype=np.int64)[rng.choice(len(c.values), size=n, p=w / w.sum())]
    assert isinstance(c, TraceCount)
    if trace_counts is None:
        raise TraceError(
            "workload.images.count: kind 'trace' reads NumImages from an Azure multimodal trace; "
            "replay one with arrival {kind: trace, path: ...}, or give a fixed/uniform/choice count"
        )
    return np.asarray(trace_counts[:n], dtype=np.int64)


def generate_images(
    cfg: ImageWorkload, n: int, rng: np.random.Generator, trace_counts: np.ndarray | None = None
) -> Images:
    """Images of ``n`` requests (counts first, then catalogue ids, then resolutions)."""
    counts = _counts(cfg, n, rng, trace_counts)
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    total = int(offsets[-1])
    weights = np.asarray([r.weight for r in cfg.resolutions], dtype=float)
    p = weights / weights.sum()
    if cfg.distinct_images is None:
        ids = np.arange(total, dtype=np.int64)
        which = rng.choice(len(p), size=total, p=p)
    else:
        ids = rng.integers(0, cfg.distinct_images, size=total, dtype=np.int64)
        # A catalogue image's resolution is a function of its id (drawn once per id), from a child of the
        # images stream: part of the seed tree, and independent of how many draws the requests took.
        per_id = rng.spawn(1)[0].choice(len(p), size=cfg.distinct_images, p=p)
        which = per_id[ids]
    w = np.asarray([r.width for r in cfg.resolutions], dtype=np.int64)[which]
    h = np.asarray([r.height for r in cfg.resolutions], dtype=np.int64)[which]
    return Images(offsets, w, h, ids)


def read_azure_multimodal(path: str | Path, limit: int | None = None) -> np.ndarray:
    """``NumImages`` per request of an Azure multimodal trace, in arrival order (ties in file order).

    Raises :class:`TraceError` naming the line of the first bad value.
    """
    expected = (
        "each row must be TIMESTAMP,NumImages,ContextTokens,GeneratedTokens, e.g. "
        "'2024-05-10 00:00:00.011000,2,1043,132' (the Azure multimodal trace)"
    )
    import pandas as pd  # noqa: PLC0415 - the CLI starts without pandas

    t = read_csv_rows(Path(path), AZURE_MM_COLUMNS, (), expected, limit)
    x = numbers_of(t.df["NumImages"])
    bad = ~np.isfinite(x) | (x != np.floor(x)) | (x < 0) | (x > 1024)
    if bad.any():
        raise t.fail(int(np.argmax(bad)), "NumImages", "an image count (an integer from 0 to 1024)")
    stamps = pd.to_datetime(t.df["TIMESTAMP"], format="ISO8601", errors="coerce")
    if stamps.isna().any():
        raise t.fail(
            int(np.argmax(stamps.isna().to_numpy())), "TIMESTAMP", "a timestamp like 2024-05-10 00:00:00.011000"
        )
    arrival = ((stamps - stamps.iloc[0]) / pd.Timedelta(seconds=1)).to_numpy(dtype=np.float64)
    order = np.argsort(arrival, kind="stable") if (np.diff(arrival) < 0).any() else np.arange(len(x))
    return x.astype(np.int64)[order]
