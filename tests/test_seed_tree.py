"""Every random draw comes from the scenario's seed tree (simulator.resolved.rng_streams)."""

from __future__ import annotations

import numpy as np

import hwdb
from simulator.epd.epd_config import ImageWorkload
from simulator.epd.multimodal import generate_images
from simulator.plan import parse_plan_request
from simulator.plan.candidates import _sample_stats
from simulator.resolved import resolve, rng_streams
from simulator.run import simulate
from tests.conftest import scenario
from tests.test_faults import PD_POOLS

IMAGES = {
    "count": {"kind": "uniform", "low": 0, "high": 4},
    "resolutions": [{"width": 640, "height": 480}, {"width": 1920, "height": 1080}],
}


def test_streams_are_children_of_seed_and_replication_and_new_ones_leave_the_old_alone():
    s = rng_streams(5, 2)
    kids = np.random.SeedSequence([5, 2]).spawn(len(s))
    for i, g in enumerate(s.values()):
        assert g.random() == np.random.default_rng(kids[i]).random()
    # A purpose added at the end (transfer) leaves the earlier children, hence their draws, as they were.
    before = np.random.SeedSequence([5, 2]).spawn(len(s) - 1)
    assert rng_streams(5, 2)["images"].random() == np.random.default_rng(before[4]).random()
    assert rng_streams(5, 2)["faults"].random() != rng_streams(5, 3)["faults"].random()


def test_the_resolved_scenario_carries_the_seed_tree_and_the_transfer_plan():
    """resolve() is the one place a scenario's seed and KV transfer plan are fixed: fresh streams per
    replication, equal to rng_streams of the scenario's seed; a transfer plan for PD only."""
    pd = resolve(scenario(seed=7, pools=PD_POOLS, kv_transfer={"fabric": "roce-200"}))
    a, b = pd.streams(3), pd.streams(3)
    assert a["arrivals"].random() == b["arrivals"].random() == rng_streams(7, 3)["arrivals"].random()
    assert pd.streams(0)["lengths"].random() != pd.streams(1)["lengths"].random()
    assert pd.transfer is not None and pd.transfer.kv_bytes_per_token > 0
    assert resolve(scenario()).transfer is None


def test_fault_draws_come_from_the_faults_stream_and_ignore_transfer_jitter():
    """A node failure's time is the faults stream's first draw; KV jitter (the transfer stream) moves
    transfers, not the failures."""
    ops = {"faults": {"node_failure": {"mtbf_s": 20.0}}, "startup": {"image_cached": True, "compile_cache": "pod"}}
    one = simulate(scenario(operations=ops)).summary["operations"]["crash_log"]
    assert one[0]["time_s"] == rng_streams(1, 0)["faults"].exponential(20.0)
    runs = [
        simulate(scenario(pools=PD_POOLS, operations=ops, kv_transfer={"fabric": "roce-200", "jitter_mean_s": j}))
        for j in (0.0, 0.002)
    ]
    times = [[c["time_s"] for c in r.summary["operations"]["crash_log"]] for r in runs]
    assert times[0] and times[0] == times[1]
    assert not runs[0].requests["transfer_s"].equals(runs[1].requests["transfer_s"])


def test_planner_samples_images_from_the_stream_simulate_uses():
    """The planner's screen and the simulation see the same images for the same seed."""
    req = parse_plan_request(
        {
            "model": "Qwen3-VL-4B",
            "slo": {"ttft_s": 2.0, "tpot_s": 0.1},
            "gpus": [{"name": "H100"}],
            "search": {"seed": 4},
            "workload": {
                "arrival": {"kind": "poisson", "rate": 1.0},
                "num_requests": 100,
                "input_length": {"kind": "fixed", "value": 100},
                "output_length": {"kind": "fixed", "value": 8},
                "images": IMAGES,
            },
        }
    )
    stats = _sample_stats(req, hwdb.load().model("Qwen3-VL-4B"))
    n = stats.n
    cfg = ImageWorkload.model_validate(IMAGES)
    assert stats.images.images == generate_images(cfg, n, rng_streams(4, 0)["images"]).total / n
    # ... and simulate draws a run's images from that same stream
    scn = scenario(
        model="Qwen3-VL-4B",
        seed=4,
        workload={
            "arrival": {"kind": "poisson", "rate": 2.0},
            "input_length": {"kind": "fixed", "value": 100},
            "output_length": {"kind": "fixed", "value": 8},
            "num_requests": 40,
            "images": IMAGES,
        },
    )
    drawn = generate_images(cfg, 40, rng_streams(4, 0)["images"])
    assert simulate(scn).requests["num_images"].tolist() == np.diff(drawn.offsets).tolist()


def test_catalogue_resolutions_come_from_the_seed_tree():
    """A catalogue image's resolution is fixed by its id within a run, reproducible for a seed, and
    drawn from the images stream's child (so it varies with the seed like every other draw)."""
    cfg = ImageWorkload.model_validate({**IMAGES, "count": {"kind": "fixed", "value": 3}, "distinct_images": 64})

    def catalogue(seed: int) -> dict[int, int]:
        im = generate_images(cfg, 400, rng_streams(seed, 0)["images"])
        by_id: dict[int, set] = {}
        for i, w in zip(im.image_id.tolist(), im.width.tolist(), strict=True):
            by_id.setdefault(i, set()).add(w)
        assert all(len(v) == 1 for v in by_id.values())  # one resolution per id
        return {i: v.pop() for i, v in by_id.items()}

    assert catalogue(1) == catalogue(1)
    a, b = catalogue(1), catalogue(2)
    shared = set(a) & set(b)
    assert len(shared) > 40 and any(a[i] != b[i] for i in shared)
