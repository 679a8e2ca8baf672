"""EPD with operations: an encoder tier in front of pools whose instances crash, restart and autoscale.

Conservation (hypothesis): every request ends exactly once (the recorder raises on a second end, and
none is left pending), every token a serving instance emitted reached a client or a discarded attempt,
and no live instance leaks KV blocks, under node failures on the prefill pool, FP8 crashes on the
decode or colocated pool, retries, queue timeouts, and autoscaling of the language-model and encoder pools.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from simulator.engine.opsrun import run_operations
from simulator.engine.results import requests_frame
from simulator.epd.epd import prepare as prepare_epd
from simulator.resolved import resolve
from simulator.run import pool_spec, simulate
from simulator.scenario import ScenarioError
from simulator.workload import generate
from tests.test_epd import EPD, EPPD, FOUR_1080P, mm
from tests.test_faults import check_fault_invariants

STARTUP = {"image_cached": True, "compile_cache": "pod"}


def run_objects(scn):
    """As :func:`simulator.run.simulate` with operations and images, returning the engine's objects."""
    rs = resolve(scn)
    rngs = rs.streams(0)
    reqs = generate(scn.workload, rngs["arrivals"], rngs["lengths"])
    reqs, epd = prepare_epd(scn, rs.db, rs.model, rs.pools, reqs, rngs["images"])
    front, back = (rs.role("prefill"), rs.role("decode")) if scn.is_pd else (rs.role("colocated"), None)
    ops, run, _ = run_operations(scn, reqs, front, back, rs.transfer, None, rngs, pool_spec, epd)
    return ops, run, requests_frame(run, "x", operations=True)


def test_encoder_tier_with_a_prefill_crash_and_an_autoscaled_decode_pool():
    """E+P+D: prefill nodes fail under load, requests are retried (re-encoded: their embeddings went with
    the crashed instance), the decode pool scales; every request completes."""
    scn = mm(
        EPPD,
        FOUR_1080P,
        n=120,
        rate=6.0,
        operations={
            "faults": {"node_failure": {"mtbf_s": 8, "mttr_s": 2, "pools": ["p"]}},
            "retry": {"policy": "retry", "max_retries": 5},
            "startup": STARTUP,
            "autoscale": {
                "d": {"policy": "queue", "target_queue": 2, "min_instances": 1, "max_instances": 3, "interval_s": 2}
            },
        },
    )
    ops, run, req = run_objects(scn)
    assert any(c["pool"] == "p" and c["requests"] > 0 for c in ops.crashes)
    check_fault_invariants(ops, run, req)
    assert (req["retries"] > 0).any()
    res = simulate(scn)
    assert res.summary["completed"] + res.summary["operations"]["failed"] == 120
    assert res.summary["encoder"]["images_encoded"] + res.summary["encoder"]["cache_hits"] >= 4 * 120
    assert "encode_s" in res.requests and (res.requests["num_images"] == 4).all()


def test_an_encoder_pool_autoscales_on_its_image_queue_while_prefill_nodes_fail():
    """One encoder for 8 req/s of four 1080p images is short: the queue policy adds encoders, which
    then take images (busy time on the new ones); prefill crashes meanwhile; every request ends once."""
    pools = [dict(p) for p in EPPD]
    pools[2]["instances"] = 1
    ops = {
        "faults": {"node_failure": {"mtbf_s": 20, "mttr_s": 2, "pools": ["p"]}},
        "retry": {"policy": "retry", "max_retries": 5},
        "startup": STARTUP,
        "autoscale": {
            "enc": {"policy": "queue", "target_queue": 4, "min_instances": 1, "max_instances": 4, "interval_s": 2}
        },
    }
    scn = mm(pools, FOUR_1080P, n=300, rate=8.0, operations=ops)
    ops_, run, req = run_objects(scn)
    check_fault_invariants(ops_, run, req)
    ups = [e for e in ops_.events if e[1] == "enc" and e[2] == "scale-up"]
    assert ups and len(run.epd.made) > 1
    assert sum(e.busy_s > 0 for e in run.epd.made) >= 3  # the first scale-up's encoders served
    assert any(c["pool"] == "p" for c in ops_.crashes)
    res = simulate(scn)
    assert len(res.summary["encoder"]["utilisation_per_instance"]) == len(run.epd.made)
    # Every encoder incarnation is billed: scale-ups from their provisioning, until removal or the end.
    o = res.summary["operations"]
    enc = [i for i in o["instances"] if i["pool"] == "enc"]
    assert len(enc) >= len(run.epd.made) and sum(i["cause"] == "scale-up" for i in enc) >= len(run.epd.made) - 1
    assert o["peak_instances"]["enc"] >= 2
    assert [u["decided_s"] for u in o["scale_ups"] if u["pool"] == "enc"] == [e[0] for e in ups for _ in range(e[3])]
    enc_gpu_s = sum(
        i["gpus"]
        * (min(i["ended_s"] if i["ended_s"] is not None else o["end_s"], o["end_s"]) - min(i["billed_s"], o["end_s"]))
        for i in enc
    )
    assert enc_gpu_s >= o["end_s"] > 0  # the first encoder alone serves the whole run


def test_a_static_encoder_tier_is_billed_for_the_whole_run():
    """With an operations block and nothing that starts or stops instances, GPU-hours are every pool's
    GPUs (the two encoders' too) over the run, and the cost is the static price over the same time."""
    scn = mm(EPPD, FOUR_1080P, n=60, rate=4.0, operations={"queue_timeout_s": 600, "startup": STARTUP})
    res = simulate(scn)
    o = res.summary["operations"]
    assert {i["pool"] for i in o["instances"]} == {"p", "d", "enc"} and o["peak_instances"]["enc"] == 2
    assert o["gpu_hours"] == pytest.approx(4 * o["end_s"] / 3600, rel=1e-12)
    assert o["cost_usd"] == pytest.approx(res.summary["cost_usd_per_hour"] * o["end_s"] / 3600, rel=1e-12)


def test_encoder_pools_scale_on_the_queue_only_and_never_crash():
    with pytest.raises(ScenarioError, match="an encoder pool autoscales on its image queue only"):
        mm(
            EPD,
            FOUR_1080P,
            n=5,
            operations={"autoscale": {"enc": {"policy": "kv", "min_instances": 1, "max_instances": 2}}},
        )
    with pytest.raises(ScenarioError, match="encoder crashes are not modelled yet"):
        mm(EPD, FOUR_1080P, n=5, operations={"faults": {"node_failure": {"mtbf_s": 9, "pools": ["enc"]}}})


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    pd_=st.booleans(),
    images=st.integers(0, 3),
    rate=st.floats(1.0, 12.0),
    mtbf=st.sampled_from([None, 3.0, 20.0]),
    hazard=st.sampled_from([0.0, 1e-5, 1e-4]),
    policy=st.sampled_from(["none", "retry", "reprefill"]),
    max_retries=st.integers(0, 2),
    timeout=st.sampled_from([None, 3.0]),
    autoscale=st.booleans(),
    encoders=st.sampled_from([None, 1, 2]),
    seed=st.integers(0, 2**16),
)
@example(
    pd_=True,
    images=2,
    rate=10.0,
    mtbf=3.0,
    hazard=1e-4,
    policy="reprefill",
    max_retries=2,
    timeout=3.0,
    autoscale=True,
    encoders=1,
    seed=1,
)
@example(
    pd_=False,
    images=3,
    rate=8.0,
    mtbf=3.0,
    hazard=1e-4,
    policy="retry",
    max_retries=1,
    timeout=None,
    autoscale=True,
    encoders=None,
    seed=2,
)
def test_requests_are_conserved_with_an_encoder_tier_under_faults(
    pd_, images, rate, mtbf, hazard, policy, max_retries, timeout, autoscale, encoders, seed
):
    lm = "p" if pd_ else "lm"
    pools = [dict(p) for p in (EPPD if pd_ else EPD)]
    faults = {"fp8_crash": {"rate_per_token_s": hazard, "onset_tokens": 0, "pools": ["d" if pd_ else "lm"]}}
    if mtbf is not None:
        faults["node_failure"] = {"mtbf_s": mtbf, "mttr_s": 2, "pools": [lm]}
    ops = {
        "faults": faults,
        "retry": {"policy": policy, "max_retries": max_retries},
        "startup": STARTUP,
        "queue_timeout_s": timeout,
    }
    if autoscale:
        ops["autoscale"] = {
            lm: {"policy": "queue", "target_queue": 2, "min_instances": 1, "max_instances": 3, "interval_s": 2}
        }
    if encoders is not None:  # the encoder pool starts with that many, scales to 3
        pools[-1]["instances"] = encoders
        ops.setdefault("autoscale", {})["enc"] = {
            "policy": "queue",
            "target_queue": 2,
            "min_instances": 1,
            "max_instances": 3,
            "interval_s": 1,
        }
    imgs = {"count": {"kind": "fixed", "value": images}, "resolutions": [{"width": 1280, "height": 720}]}
    scn = mm(pools, imgs, n=40, rate=rate, seed=seed, operations=ops)
    ops_, run, req = run_objects(scn)
    check_fault_invariants(ops_, run, req)
    assert len(req) == 40 and (req["outcome"].astype(str) != "pending").all()
