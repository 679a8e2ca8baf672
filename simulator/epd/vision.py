"""Vision encoders: image -> visual tokens, encoder FLOPs, weights and embedding bytes.

Pure functions over a :class:`VisionArch` read from a model's sidecar
(``hwdb/data/models/<name>/epdsim.yaml``, key ``vision``).  Units: pixels,
tokens, FLOPs, bytes.

Resize rules (``processor`` in the sidecar):

``smart_resize`` (Qwen2-VL, Qwen2.5-VL, Qwen3-VL image processors)
    Each side is rounded to a multiple of ``factor = patch_size x
    spatial_merge_size`` (28 for Qwen2.5-VL, 32 for Qwen3-VL).  If the
    rounded area exceeds ``max_pixels`` both sides are scaled down by
    ``beta = sqrt(h w / max_pixels)`` and floored to the factor; if it is below
    ``min_pixels`` they are scaled up and ceiled.  An aspect ratio above 200
    is refused, as the Hugging Face processor does.  Patches = (h/patch) x
    (w/patch); visual tokens = patches / merge^2 = (h/factor) x (w/factor).
``fixed`` (LLaVA-1.5)
    Every image is resized to ``image_size`` square; the CLIP tower sees
    (image_size/patch)^2 patches plus a CLS token and the language model gets
    the patch features: 576 tokens at 336 px with patch 14.

Encoder FLOPs (per image, forward only, 2 FLOPs per multiply-add):
patch embedding ``2 N (C T P^2) d``; per block QKV and output projections
``8 N d^2``, MLP ``2 N m d i`` (m = 3 matrices for SwiGLU, 2 for GELU);
attention ``4 N K d`` with K the keys each query sees (N for full attention,
the window's patches for windowed blocks); the patch merger
``2 (N/merge^2) (D^2 + D o)`` with D = d merge^2 and o the language model's
hidden size, once per merger (Qwen3-VL adds one per DeepStack layer).
Embedding bytes = visual tokens x o x (1 + DeepStack layers) x dtype bytes:
DeepStack features travel with the final embeddings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

IN_CHANNELS = 3


class VisionError(ValueError):
    """An image or a vision configuration the model cannot take; the message names the fix."""


@dataclass(frozen=True)
class VisionArch:
    """A vision encoder's shape and its image processor's rules (see the module docstring)."""

    model: str
    processor: str  # "smart_resize" | "fixed"
    depth: int  # transformer blocks run (LLaVA: up to the feature layer)
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    spatial_merge_size: int  # 1 when no merge
    temporal_patch_size: int  # images are repeated to fill the temporal patch
    out_hidden_size: int  # language model hidden size the merger projects to
    mlp_matrices: int  # 3: SwiGLU, 2: GELU
    window_patches: int = 0  # keys per query in windowed blocks; 0: all blocks full attention
    full_attention_blocks: tuple[int, ...] = ()
    deepstack_layers: int = 0
    min_pixels: int = 0
    max_pixels: int = 0
    image_size: int = 0  # fixed processor: square side in pixels
    cls_token: bool = False
    projector_layers: int = 2  # LLaVA projector: Linear(d, o) + Linear(o, o)

    @property
    def factor(self) -> int:
        return self.patch_size * self.spatial_merge_size

    @property
    def max_tokens_per_image(self) -> int:
        if self.processor == "fixed":
            return (self.image_size // self.patch_size) ** 2
        return self.max_pixels // (self.factor * self.factor)

    # ------------------------------------------------------------ parameters
    @property
    def block_params(self) -> int:
        d = self.hidden_size
        return 4 * d * d + self.mlp_matrices * d * self.intermediate_size

    @property
    def merger_params(self) -> int:
        if self.processor == "fixed":
            d, o = self.hidden_size, self.out_hidden_size
            return d * o + (self.projector_layers - 1) * o * o
        big = self.hidden_size * self.spatial_merge_size**2
        return (1 + self.deepstack_layers) * (big * big + big * self.out_hidden_size)

    @property
    def patch_embed_params(self) -> int:
        return IN_CHANNELS * self.temporal_patch_size * self.patch_size**2 * self.hidden_size

    @property
    def params(self) -> int:
        """Encoder + merger/projector parameters (biases and norms omitted: < 0.5%)."""
        return self.depth * self.block_params + self.merger_params + self.patch_embed_params


def vision_arch(entry) -> VisionArch:
    """The :class:`VisionArch` of an hwdb model entry; :class:`VisionError` for a text-only model."""
    v = entry.sidecar.vision
    if not v:
        raise VisionError(
            f"model {entry.name} has no vision encoder (its sidecar has no 'vision' block); "
            "requests with images need a vision-language model such as Qwen2.5-VL-7B, "
            "Qwen3-VL-4B or LLaVA-1.5-7B, or set the workload's images to none"
        )
    try:
        processor = v.get("processor", "smart_resize")
        full = tuple(int(i) for i in v.get("fullatt_block_indexes", ()) or ())
        window = int(v.get("window_size", 0) or 0)
        # Qwen2.5-VL windows are window_size pixels square: (window/patch)^2 patches per window.
        window_patches = (window // int(v["patch_size"])) ** 2 if window and full else 0
        depth = int(v["depth"])
        if processor == "fixed":
            # Features are taken from vision_feature_layer (-2: the second-to-last block).
            layer = int(v.get("feature_layer", -1))
            depth = depth + 1 + layer if layer < 0 else layer
        mlp = v.get("mlp", "swiglu")
        arch = VisionArch(
            model=entry.name,
            processor=processor,
            depth=depth,
            hidden_size=int(v["hidden_size"]),
            intermediate_size=int(v["intermediate_size"]),
            num_heads=int(v["num_heads"]),
            patch_size=int(v["patch_size"]),
            spatial_merge_size=int(v.get("spatial_merge_size", 1)),
            temporal_patch_size=int(v.get("temporal_patch_size", 1)),
            out_hidden_size=int(v.get("out_hidden_size") or entry.arch.hidden_size),
            mlp_matrices={"swiglu": 3, "gelu": 2}[mlp],
            window_patches=window_patches,
            full_attention_blocks=full,
            deepstack_layers=len(v.get("deepstack_visual_indexes", ()) or ()),
            min_pixels=int(v.get("min_pixels", 0)),
            max_pixels=int(v.get("max_pixels", 0)),
            image_size=int(v.get("image_size", 0)),
            cls_token=bool(v.get("cls_token", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise VisionError(
            f"model {entry.name}: the sidecar's vision block is incomplete or malformed ({exc!r}); "
            "it needs depth, hidden_size, intermediate_size, num_heads, patch_size and, for "
            "smart_resize, min_pixels and max_pixels"
        ) from None
    if processor not in ("smart_resize", "fixed"):
        raise VisionError(f"model {entry.name}: vision.processor={processor!r} is unknown; use smart_resize or fixed")
    if processor == "smart_resize" and not 0 < arch.min_pixels <= arch.max_pixels:
        raise VisionError(f"model {entry.name}: vision needs 0 < min_pixels <= max_pixels for smart_resize")
    if processor == "fixed" and arch.image_size <= 0:
        raise VisionError(f"model {entry.name}: a fixed-size vision processor needs image_size > 0")
    return arch


# ---------------------------------------------------------------- resize rules


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width) in pixels after the Qwen-VL processors' resize; both multiples of ``factor``."""
    if height <= 0 or width <= 0:
        raise VisionError(f"image size {width}x{height} must be positive in both dimensions")
    if max(height, width) / min(height, width) > 200:
        raise VisionError(
            f"image {width}x{height} has an aspect ratio of "
            f"{max(height, width) / min(height, width):.0f}; the Qwen-VL processors refuse "
            "ratios above 200: crop or pad the image"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resized(v: VisionArch, width: int, height: int) -> tuple[int, int]:
    """(width, height) the encoder sees for a ``width`` x ``height`` image."""
    if v.processor == "fixed":
        if width <= 0 or height <= 0:
            raise VisionError(f"image size {width}x{height} must be positive in both dimensions")
        return v.image_size, v.image_size
    h, w = smart_resize(height, width, v.factor, v.min_pixels, v.max_pixels)
    return w, h


def patches(v: VisionArch, width: int, height: int) -> int:
    """Patches the encoder's transformer blocks process for one image (CLS included)."""
    w, h = resized(v, width, height)
    return (w // v.patch_size) * (h // v.patch_size) + (1 if v.cls_token else 0)


def visual_tokens(v: VisionArch, width: int, height: int) -> int:
    """Placeholder tokens one image adds to the prompt."""
    w, h = resized(v, width, height)
    if v.processor == "fixed":
        return (w // v.patch_size) * (h // v.patch_size)
    return (w // v.factor) * (h // v.factor)


def encoder_flops(v: VisionArch, width: int, height: int) -> tuple[float, float]:
    """(linear FLOPs, attention FLOPs) of encoding one image."""
    n = patches(v, width, height)
    d = v.hidden_size
    lin = 2.0 * n * v.patch_embed_params + v.depth * 2.0 * n * v.block_params
    if v.window_patches:
        n_full = sum(1 for b in v.full_attention_blocks if b < v.depth)
        keys = n_full * n + (v.depth - n_full) * min(n, v.window_patches)
    else:
        keys = v.depth * n
    attn = 4.0 * n * keys * d
    if v.processor == "fixed":
        lin += 2.0 * (n - (1 if v.cls_token else 0)) * v.merger_params
    else:
        lin += 2.0 * (n / v.spatial_merge_size**2) * v.merger_params
    return lin, attn


def embedding_bytes(v: VisionArch, tokens: int, dtype_bytes: float = 2.0) -> float:
    """Bytes of one image's embeddings as they travel from encoder to prefill."""
    return tokens * v.out_hidden_size * (1 + v.deepstack_layers) * dtype_bytes
