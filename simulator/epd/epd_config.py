"""Scenario blocks of encoder-prefill-decode (EPD) serving: images, encoders, embedding transfer.

Pydantic models only (validated, frozen); :mod:`simulator.epd.multimodal` turns
:class:`ImageWorkload` into images, :mod:`simulator.epd.epd` runs the rest.
Units: pixels, bytes, seconds.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from simulator.bounds import MAX_TOKENS, Bytes, Fraction, InstanceRate, Range
from simulator.strict_model import StrictModel

Images = Annotated[int, Range(0, 1024, "images per request", whole=True)]
Weight = Annotated[float, Range(0, 1e6, lo_open=True, fix="give a positive relative weight")]
Pixels = Annotated[int, Range(1, 65536, "pixels", whole=True)]


class FixedCount(StrictModel):
    """Every request carries ``value`` images (0: text only)."""

    kind: Literal["fixed"] = "fixed"
    value: Images


class UniformCount(StrictModel):
    """Image counts uniform on [low, high], both inclusive."""

    kind: Literal["uniform"] = "uniform"
    low: Images
    high: Images

    @model_validator(mode="after")
    def _ordered(self) -> UniformCount:
        if self.low > self.high:
            raise ValueError(f"low={self.low} exceeds high={self.high}; make low <= high")
        return self


class ChoiceCount(StrictModel):
    """Image counts drawn from ``values`` with ``weights`` (default equal)."""

    kind: Literal["choice"] = "choice"
    values: tuple[Images, ...] = Field(min_length=1)
    weights: tuple[Weight, ...] | None = None

    @model_validator(mode="after")
    def _same_length(self) -> ChoiceCount:
        if self.weights is not None and len(self.weights) != len(self.values):
            raise ValueError(
                f"weights has {len(self.weights)} entries but values has {len(self.values)}; give one weight per value"
            )
        return self


class TraceCount(StrictModel):
    """Image counts from the ``NumImages`` column of the replayed Azure multimodal trace."""

    kind: Literal["trace"] = "trace"


ImageCount = Annotated[FixedCount | UniformCount | ChoiceCount | TraceCount, Field(discriminator="kind")]


class Resolution(StrictModel):
    """One image size in pixels, drawn with relative ``weight``."""

    width: Pixels
    height: Pixels
    weight: Weight = 1.0


class ImageWorkload(StrictModel):
    """Images carried by each request.

    ``count``: images per request.  ``resolutions``: sizes drawn per image.
    ``distinct_images``: catalogue size; each image is drawn uniformly from it
    (an image id fixes its resolution), so repeats hit the encoder cache;
    None makes every image unique.  ``trace_tokens_include_images``: with an
    Azure multimodal trace, whether ``ContextTokens`` already counts the
    visual tokens (then the text part is the rest); by default they are added.
    """

    count: ImageCount
    resolutions: tuple[Resolution, ...] = Field((Resolution(width=1920, height=1080),), min_length=1)
    distinct_images: Annotated[int, Range(1, 10**12, "images", whole=True)] | None = None
    trace_tokens_include_images: bool = False


class EncoderConfig(StrictModel):
    """How a pool encodes images: on encoder instances, or inside colocated/prefill steps.

    ``max_batch_images`` and ``max_batch_tokens`` (visual tokens) bound one
    encoder step; None for tokens means the largest image the model allows.
    ``cache_bytes``: embedding cache per instance (LRU, keyed by image id;
    0 disables it).  ``tp_efficiency``: per TP degree, the fraction of linear
    speed-up the encoder reaches (speed-up = tp x efficiency); entries given
    replace the defaults of :data:`simulator.epd.encoder.DEFAULT_TP_EFFICIENCY`.
    ``compute_efficiency``: fraction of the GPU's peak the encoder's GEMMs
    reach at large batches (None: the GPU's calibrated or default curve).
    """

    max_batch_images: Annotated[int, Range(1, 65536, "images", whole=True)] = 64
    max_batch_tokens: Annotated[int, Range(1, MAX_TOKENS, "visual tokens", whole=True)] | None = None
    cache_bytes: Bytes = 4 * 2**30
    tp_efficiency: dict[Annotated[int, Range(1, 72, "GPUs", whole=True)], Fraction] | None = None
    compute_efficiency: Fraction | None = None


class EmbeddingTransferConfig(StrictModel):
    """How visual embeddings move from encoder instances to prefill (or colocated) instances.

    ``connector`` names an hwdb connector (its efficiency and setup apply);
    ``fabric`` a scale-out link (default: the encoder GPU's); ``same_node``
    uses the node's intra link; ``bandwidth_Bps`` overrides both sides.
    """

    connector: str = "nixl"
    fabric: str | None = None
    same_node: bool = False
    bandwidth_Bps: InstanceRate | None = None
