"""Multimodal workloads: image counts and catalogue ids, and the Azure multimodal trace reader."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.epd.epd_config import ImageWorkload
from simulator.epd.multimodal import generate_images, read_azure_multimodal
from simulator.plan import parse_plan_request
from simulator.plan.candidates import build_context
from simulator.run import simulate
from simulator.scenario import ScenarioError, parse_scenario
from simulator.traces import TraceError, read_trace

ROWS = [
    "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens",
    "2024-05-10 00:00:00.000000,2,300,20",
    "2024-05-10 00:00:01.500000,0,120,10",
    "2024-05-10 00:00:01.000000,5,80,30",  # out of order: sorted after line 2
    "2024-05-10 00:00:03.250000,1,50,5",
]


def write(tmp_path, rows=ROWS):
    p = tmp_path / "mm.csv"
    p.write_text("\n".join(rows) + "\n")
    return p


def test_reader_keeps_counts_aligned_with_sorted_rows(tmp_path):
    p = write(tmp_path)
    with pytest.warns(UserWarning, match="sorted"):
        trace = read_trace(p, "azure")
    counts = read_azure_multimodal(p)
    np.testing.assert_array_equal(counts, [2, 5, 0, 1])
    np.testing.assert_array_equal(trace.input_tokens, [300, 80, 120, 50])
    np.testing.assert_allclose(trace.arrival_s, [0.0, 1.0, 1.5, 3.25])


@pytest.mark.parametrize("bad,what", [("-1", "NumImages='-1'"), ("two", "NumImages='two'"), ("1.5", "NumImages='1.5'")])
def test_bad_image_count_names_line_and_column(tmp_path, bad, what):
    rows = list(ROWS)
    rows[3] = f"2024-05-10 00:00:01.000000,{bad},80,30"
    with pytest.raises(TraceError, match=rf"line 4: {what} is not an image count"):
        read_azure_multimodal(write(tmp_path, rows))


def test_missing_column_is_named(tmp_path):
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens", "2024-05-10 00:00:00.000000,300,20"]
    with pytest.raises(TraceError, match="header lacks column\\(s\\) NumImages"):
        read_azure_multimodal(write(tmp_path, rows))


def scenario_from_trace(path, **images):
    return parse_scenario(
        {
            "name": "mm",
            "seed": 2,
            "model": "Qwen2.5-VL-7B",
            "pools": [{"name": "lm", "gpu": "H100"}, {"name": "enc", "role": "encoder", "gpu": "H100"}],
            "workload": {
                "arrival": {"kind": "trace", "path": str(path), "format": "azure"},
                "images": {"count": {"kind": "trace"}, "resolutions": [{"width": 640, "height": 480}], **images},
            },
        }
    )


def test_trace_replay_carries_images_into_prompts(tmp_path):
    p = write(tmp_path)
    with pytest.warns(UserWarning):
        req = simulate(scenario_from_trace(p)).requests
    np.testing.assert_array_equal(req["num_images"], [2, 5, 0, 1])
    # 640x480 on Qwen2.5-VL: 17 x 23 = 391 visual tokens per image, added to ContextTokens.
    np.testing.assert_array_equal(req["input_tokens"], [300 + 2 * 391, 80 + 5 * 391, 120, 50 + 391])
    with pytest.warns(UserWarning):
        req = simulate(scenario_from_trace(p, trace_tokens_include_images=True)).requests
    # ContextTokens already count the images: the text part is the rest (at least one token).
    np.testing.assert_array_equal(req["input_tokens"], [2 * 391 + 1, 5 * 391 + 1, 120, 391 + 1])


def test_trace_count_needs_a_trace():
    with pytest.raises(ScenarioError, match="kind 'trace' reads NumImages"):
        simulate(
            parse_scenario(
                {
                    "model": "Qwen2.5-VL-7B",
                    "pools": [{"gpu": "H100"}],
                    "workload": {
                        "arrival": {"kind": "poisson", "rate": 1},
                        "num_requests": 3,
                        "input_length": {"kind": "fixed", "value": 10},
                        "output_length": {"kind": "fixed", "value": 5},
                        "images": {"count": {"kind": "trace"}},
                    },
                }
            )
        )


def test_generation_is_deterministic_and_catalogue_fixes_resolution():
    cfg = ImageWorkload(
        count={"kind": "uniform", "low": 0, "high": 4},
        distinct_images=5,
        resolutions=[{"width": 640, "height": 480}, {"width": 1920, "height": 1080, "weight": 3}],
    )
    a = generate_images(cfg, 400, np.random.default_rng(1))
    b = generate_images(cfg, 400, np.random.default_rng(1))
    for x, y in ((a.offsets, b.offsets), (a.width, b.width), (a.image_id, b.image_id)):
        np.testing.assert_array_equal(x, y)
    assert a.offsets[0] == 0 and a.offsets[-1] == a.total == len(a.width)
    assert set(np.diff(a.offsets)) == {0, 1, 2, 3, 4}
    assert set(a.image_id) <= set(range(5))
    for iid in set(a.image_id):  # one resolution per catalogue image
        assert len(set(zip(a.width[a.image_id == iid], a.height[a.image_id == iid], strict=True))) == 1
    fresh = generate_images(cfg.model_copy(update={"distinct_images": None}), 400, np.random.default_rng(1))
    assert len(set(fresh.image_id)) == fresh.total
    share = (fresh.width == 1920).mean()
    assert 0.68 < share < 0.82  # weight 3 of 4


def test_images_do_not_move_arrivals_or_lengths():
    base = {
        "model": "Qwen2.5-VL-7B",
        "seed": 4,
        "pools": [{"gpu": "H100"}],
        "workload": {
            "arrival": {"kind": "poisson", "rate": 3},
            "num_requests": 20,
            "input_length": {"kind": "uniform", "low": 10, "high": 90},
            "output_length": {"kind": "fixed", "value": 4},
        },
    }
    text = simulate(parse_scenario(base)).requests
    base["workload"]["images"] = {"count": {"kind": "fixed", "value": 1}}
    img = simulate(parse_scenario(base)).requests
    np.testing.assert_array_equal(text["arrival_s"], img["arrival_s"])
    np.testing.assert_array_equal(text["input_tokens"] + 2691, img["input_tokens"])


def test_planner_screen_samples_trace_image_counts_as_the_simulation_does(tmp_path):
    """Issue 16: the screen's workload sample draws images like simulate (simulator.epd.epd.draw_images,
    the images stream), NumImages of a replayed Azure trace included (it used to screen them as text)."""
    rows = [ROWS[0], ROWS[1], ROWS[3], ROWS[2], ROWS[4]]  # in time order
    p = write(tmp_path, rows)
    req = parse_plan_request(
        {
            "name": "t",
            "model": "Qwen3-VL-30B-A3B",
            "workload": {
                "arrival": {"kind": "trace", "path": str(p), "format": "azure", "rate": 1.0},
                "images": {"count": {"kind": "trace"}, "resolutions": [{"width": 640, "height": 480}]},
            },
            "slo": {"ttft_s": 2.0, "tpot_s": 0.06, "attainment": 0.9},
            "gpus": [{"name": "H100"}],
            "constraints": {"max_gpus": 2, "tp": [2]},
        }
    )
    stats = build_context(req).stats
    assert stats.images is not None and stats.images.images == pytest.approx(2.0)  # (2 + 5 + 0 + 1) / 4
