"""Image -> visual tokens follows each model's documented resize rule; encoder sizes and bytes.

Expected token counts are worked by hand from the processors' rules (see
simulator/epd/vision.py): Qwen2.5-VL smart_resize with factor 28 (patch 14 x
merge 2), min 3136 and max 12845056 pixels; Qwen3-VL factor 32 (patch 16 x
merge 2), min 65536 and max 16777216 pixels; LLaVA-1.5 a fixed 336 px square,
(336/14)^2 = 576 tokens.
"""

from __future__ import annotations

import pytest

import hwdb
from simulator.epd.vision import (
    VisionError,
    embedding_bytes,
    encoder_flops,
    patches,
    resized,
    vision_arch,
    visual_tokens,
)

DB = hwdb.load()


def arch(name):
    return vision_arch(DB.model(name))


# (model, width, height, expected visual tokens, why)
TABLE = [
    ("Qwen2.5-VL-7B", 1920, 1080, 39 * 69, "1080->39x28=1092, 1920->69x28=1932 (round)"),
    ("Qwen2.5-VL-7B", 640, 480, 17 * 23, "480/28=17.1->17, 640/28=22.9->23"),
    ("Qwen2.5-VL-7B", 224, 224, 8 * 8, "exact multiples of 28"),
    ("Qwen2.5-VL-7B", 28, 28, 2 * 2, "784 px < min 3136: scaled by 2 and ceiled to 56x56"),
    ("Qwen2.5-VL-7B", 4000, 3000, 107 * 143, "11,995,984 px after rounding, under the max"),
    ("Qwen2.5-VL-7B", 8000, 6000, 110 * 147, "48 MP > max: beta=1.9331, floor(110.85), floor(147.80)"),
    ("Qwen2.5-VL-72B", 1920, 1080, 39 * 69, "same processor as the 7B"),
    ("Qwen3-VL-4B", 640, 640, 400, "FACTS.md: ~400 tokens for 640x640 (vLLM EPD blog)"),
    ("Qwen3-VL-4B", 1920, 1080, 34 * 60, "1080/32=33.75->34, 1920/32=60"),
    ("Qwen3-VL-4B", 300, 200, 7 * 10, "55,296 px < min 65536: beta=1.0451, ceil(6.53), ceil(9.80)"),
    ("Qwen3-VL-4B", 4096, 4096, 128 * 128, "exactly max_pixels: kept"),
    ("Qwen3-VL-4B", 6000, 4000, 104 * 156, "24 MP > max: beta=1.1960, floor(104.5), floor(156.8)"),
    ("Qwen3-VL-30B-A3B", 640, 640, 400, "same processor as the 4B"),
    ("Qwen3-VL-235B-A22B", 1920, 1080, 34 * 60, "same processor as the 4B"),
    ("LLaVA-1.5-7B", 1920, 1080, 576, "fixed 336 px square"),
    ("LLaVA-1.5-7B", 100, 5000, 576, "any size"),
]


@pytest.mark.parametrize("model,w,h,tokens,why", TABLE, ids=[f"{m}-{w}x{h}" for m, w, h, *_ in TABLE])
def test_visual_tokens_follow_the_resize_rule(model, w, h, tokens, why):
    v = arch(model)
    assert visual_tokens(v, w, h) == tokens, why
    rw, rh = resized(v, w, h)
    if v.processor == "smart_resize":
        assert rw % v.factor == 0 and rh % v.factor == 0
        assert v.min_pixels <= rw * rh <= v.max_pixels
        # Patches are the merge^2 patches behind each token.
        assert patches(v, w, h) == tokens * v.spatial_merge_size**2
    else:
        assert patches(v, w, h) == tokens + 1  # the CLS token is encoded too


def test_aspect_ratio_over_200_is_refused():
    with pytest.raises(VisionError, match="aspect ratio of 201.*crop or pad"):
        visual_tokens(arch("Qwen2.5-VL-7B"), 20100, 100)


def test_text_only_model_has_no_vision():
    with pytest.raises(VisionError, match="Llama-3.1-8B has no vision encoder"):
        vision_arch(DB.model("Llama-3.1-8B"))


@pytest.mark.parametrize(
    "model,total,rel",
    [("Qwen2.5-VL-7B", 8.29e9, 0.015), ("Qwen3-VL-4B", 4.44e9, 0.015), ("Qwen3-VL-235B-A22B", 235_670_022_896, 0.001)],
)
def test_language_model_plus_encoder_matches_published_size(model, total, rel):
    """Hugging Face lists Qwen2.5-VL-7B-Instruct at 8.29B and Qwen3-VL-4B-Instruct at 4.44B parameters; the
    235B's weight listing (its sidecar's source) sums to 235,670,022,896 (norms and biases included)."""
    e = DB.model(model)
    assert e.arch.total_params + vision_arch(e).params == pytest.approx(total, rel=rel)


def test_encoder_flops_closed_form_full_attention():
    """Qwen3-VL (full attention everywhere): 2 x patches x params for the blocks, 4 N^2 d per block."""
    v = arch("Qwen3-VL-4B")
    n = patches(v, 640, 640)
    lin, attn = encoder_flops(v, 640, 640)
    assert attn == pytest.approx(4.0 * n * n * v.hidden_size * v.depth)
    blocks = 2.0 * n * v.depth * v.block_params
    assert blocks < lin < blocks * 1.2  # + patch embedding and the four mergers


def test_windowed_attention_grows_slower_than_quadratic():
    """Qwen2.5-VL: 28 of 32 blocks attend within 64-patch windows, so 4x the pixels costs < 5x attention."""
    v = arch("Qwen2.5-VL-7B")
    a1 = encoder_flops(v, 896, 896)[1]
    a4 = encoder_flops(v, 1792, 1792)[1]
    assert 4.0 < a4 / a1 < 16.0
    full_only = 4 * (4.0 * (64 * 64 * 4) ** 2 * v.hidden_size)
    window = 28 * 4.0 * (64 * 64 * 4) * 64 * v.hidden_size
    assert a4 == pytest.approx(full_only + window)


def test_embedding_bytes_include_deepstack():
    """Qwen3-VL sends 1 + 3 DeepStack feature sets per token; Qwen2.5-VL one; bf16 = 2 bytes."""
    assert embedding_bytes(arch("Qwen3-VL-4B"), 400) == 400 * 2560 * 4 * 2
    assert embedding_bytes(arch("Qwen2.5-VL-7B"), 400) == 400 * 3584 * 2
