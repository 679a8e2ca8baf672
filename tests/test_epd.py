"""Encoder-prefill-decode: the example pair in both directions, the TTFT split, zero-image requests,
invariants with images (hypothesis), the encoder cache, closed forms, and bad input.  The embedding
transfer over TCP and shared NICs: tests/test_epd_embedding_transfer.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hwdb
from simulator.cli import main
from simulator.epd.encoder import DEFAULT_TP_EFFICIENCY, fit_tp_efficiency, tp_speedup
from simulator.epd.epd import embedding_path, encoder_model
from simulator.epd.epd_config import EmbeddingTransferConfig, EncoderConfig
from simulator.epd.vision import embedding_bytes, encoder_flops, patches, vision_arch, visual_tokens
from simulator.goodput import percentile_slo_met
from simulator.resolved import resolve
from simulator.run import simulate
from simulator.scenario import SLO, ScenarioError, load_scenario, parse_scenario
from tests.conftest import REPO
from tests.test_invariants import check_invariants

SPLIT = ["frontend_s", "encode_queue_s", "encode_s", "embedding_transfer_s", "queue_s", "prefill_s"]
PD_SPLIT = ["transfer_wait_s", "transfer_s", "decode_admission_s"]


def run_example(name):
    return simulate(load_scenario(REPO / "examples" / f"epd_{name}.yaml"))


def mm(pools, images=None, n=60, rate=4.0, model="Qwen2.5-VL-7B", seed=3, **over):
    wl = {
        "arrival": {"kind": "poisson", "rate": rate},
        "input_length": {"kind": "fixed", "value": 200},
        "output_length": {"kind": "fixed", "value": 40},
        "num_requests": n,
    }
    if images is not None:
        wl["images"] = images
    return parse_scenario({"name": "t", "seed": seed, "model": model, "pools": pools, "workload": wl, **over})


COLO = [{"name": "lm", "gpu": "H100", "instances": 1}]
EPD = [{"name": "lm", "gpu": "H100", "instances": 1}, {"name": "enc", "role": "encoder", "gpu": "H100"}]
EPPD = [
    {"name": "p", "role": "prefill", "gpu": "H100"},
    {"name": "d", "role": "decode", "gpu": "H100"},
    {"name": "enc", "role": "encoder", "gpu": "H100", "instances": 2},
]
EP_D = [{"name": "p", "role": "prefill", "gpu": "H100"}, {"name": "d", "role": "decode", "gpu": "H100"}]
FOUR_1080P = {"count": {"kind": "fixed", "value": 4}, "resolutions": [{"width": 1920, "height": 1080}]}


def split_sums_to_ttft(req):
    done = req[req["outcome"] == "completed"]
    cols = SPLIT + [c for c in PD_SPLIT if done[c].notna().any()]
    total = done[cols].fillna(0.0).sum(axis=1).to_numpy()
    np.testing.assert_allclose(total, done["ttft_s"].to_numpy(), rtol=1e-9, atol=1e-9)
    assert (done[SPLIT].to_numpy() >= -1e-9).all()


# ------------------------------------------------------------ must show 1: both directions


def test_image_heavy_epd_beats_colocated_ttft():
    """Six 1080p images per request at 4 req/s on 8 H100s: E+PD's TTFT is several times lower than TP8 colocated."""
    colo, epd = run_example("images_colocated"), run_example("images_epd")
    for r in (colo, epd):
        assert r.summary["completed"] == r.summary["requests"] and r.summary["gpus"] == 8
    assert epd.summary["ttft_s"]["p50"] < 0.5 * colo.summary["ttft_s"]["p50"]
    assert epd.summary["ttft_s"]["p99"] < 0.5 * colo.summary["ttft_s"]["p99"]
    # The colocated instance pays the encoder inside its steps; E+PD in its own tier.
    assert colo.summary["ttft_breakdown_mean_s"]["encode"] > 0 and colo.summary["encoder"]["pool"] == "lm"
    assert epd.summary["encoder"]["utilisation"] > 0 and epd.summary["ttft_breakdown_mean_s"]["embedding_transfer"] > 0
    assert (epd.requests["visual_tokens"] == 6 * 2040).all()


def test_text_only_epd_gives_no_gain():
    """Same GPUs, no images: the encoders idle and the smaller language-model instance is no faster."""
    colo, epd = run_example("text_colocated"), run_example("text_epd")
    assert epd.summary["ttft_s"]["p50"] >= 0.95 * colo.summary["ttft_s"]["p50"]
    assert epd.summary["ttft_s"]["p99"] >= 0.95 * colo.summary["ttft_s"]["p99"]
    assert epd.summary["encoder"]["images_encoded"] == 0 and epd.summary["encoder"]["utilisation"] == 0.0
    assert (epd.requests["encode_s"] == 0).all() and (epd.requests["visual_tokens"] == 0).all()


# ------------------------------------------------------------ must show 4: zero images, invariants


def test_zero_image_requests_flow_through_three_tiers():
    images = {"count": {"kind": "choice", "values": [0, 3]}, "resolutions": [{"width": 1280, "height": 720}]}
    res = simulate(mm(EPPD, images, n=80, kv_transfer={"fabric": "ib-ndr"}, embedding_transfer={"fabric": "ib-ndr"}))
    req = res.requests
    assert (req["outcome"] == "completed").all()
    zero, some = req[req["num_images"] == 0], req[req["num_images"] > 0]
    assert len(zero) > 10 and len(some) > 10
    assert (zero["visual_tokens"] == 0).all() and (zero["input_tokens"] == 200).all()
    assert (zero[["encode_queue_s", "encode_s", "embedding_transfer_s"]] == 0).all().all()
    assert (some["encode_s"] > 0).all() and (some["embedding_transfer_s"] > 0).all()
    # Both kinds go prefill -> KV transfer -> decode; visual tokens make the KV (and its transfer) larger.
    assert (req["transfer_s"] > 0).all()
    assert some["transfer_s"].mean() > zero["transfer_s"].mean()
    assert (req["input_tokens"] == req["text_tokens"] + req["visual_tokens"]).all()
    split_sums_to_ttft(req)
    check_invariants(res)
    assert res.summary["encoder"]["topology"] == "E+P+D"


@pytest.mark.parametrize("pools,topo", [(COLO, "colocated"), (EPD, "E+PD"), (EPPD, "E+P+D"), (EP_D, "EP+D")])
def test_ttft_split_sums_in_every_topology(pools, topo):
    res = simulate(mm(pools, FOUR_1080P, n=40))
    assert res.summary["encoder"]["topology"] == topo
    split_sums_to_ttft(res.requests)
    check_invariants(res)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    topo=st.sampled_from(["colo", "epd", "eppd", "ep_d"]),
    hi=st.integers(0, 5),
    rate=st.floats(0.5, 20.0),
    side=st.sampled_from([(640, 480), (1920, 1080), (3000, 800), (28, 28)]),
    distinct=st.sampled_from([None, 1, 8]),
    enc=st.integers(1, 3),
    batch=st.sampled_from([1, 4, 64]),
    seed=st.integers(0, 2**16),
)
def test_invariants_with_images(topo, hi, rate, side, distinct, enc, batch, seed):
    pools = {"colo": COLO, "epd": EPD, "eppd": EPPD, "ep_d": EP_D}[topo]
    pools = [
        dict(p, instances=enc, encoder={"max_batch_images": batch}) if p.get("role") == "encoder" else p for p in pools
    ]
    images = {
        "count": {"kind": "uniform", "low": 0, "high": hi},
        "distinct_images": distinct,
        "resolutions": [{"width": side[0], "height": side[1]}],
    }
    res = simulate(mm(pools, images, n=50, rate=rate, seed=seed))
    check_invariants(res)
    req = res.requests
    split_sums_to_ttft(req)
    assert (req["input_tokens"] == req["text_tokens"] + req["visual_tokens"]).all()
    e = res.summary["encoder"]
    if topo in ("epd", "eppd"):
        # Every image is encoded exactly once or shares an encode/cached embedding.
        assert e["images_encoded"] + e["cache_hits"] == e["images"]
        if distinct is None:
            assert e["cache_hits"] == 0
    else:
        # Front-pool encoding looks images up at each admission (again after a preemption).
        assert e["images_encoded"] + e["cache_hits"] >= e["images"]
    if distinct is not None:
        assert e["images_encoded"] <= distinct * (len(res.info["pools"]) + 2)
    assert 0.0 <= e["utilisation"] <= 1.0 + 1e-9


def test_same_scenario_same_results():
    a, b = (simulate(mm(EPPD, FOUR_1080P, n=30)) for _ in range(2))
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)


# ------------------------------------------------------------ encoder cache and closed forms


def test_repeated_image_is_encoded_once():
    one = dict(FOUR_1080P, distinct_images=1)
    res = simulate(mm(EPD, one, n=30, rate=1.0))
    e = res.summary["encoder"]
    assert e["images"] == 120 and e["images_encoded"] == 1 and e["cache_hits"] == 119
    assert e["cache_hit_rate"] == pytest.approx(119 / 120)
    colo = simulate(mm(COLO, one, n=30, rate=1.0)).summary["encoder"]
    assert colo["images_encoded"] == 1


def test_shared_encode_starts_no_earlier_than_arrival():
    """Requests arriving while their (shared) image is being encoded wait only for the rest of it."""
    res = simulate(mm(EPD, dict(FOUR_1080P, distinct_images=1), n=40, rate=200.0))
    req = res.requests
    assert res.summary["encoder"]["images_encoded"] == 1
    joined = req[(req["arrival_s"] > 0) & (req["encode_s"] > 0)]
    assert len(joined) > 0
    assert (req["encode_queue_s"] >= 0).all() and (req["encode_s"] >= 0).all()
    split_sums_to_ttft(req)


def test_single_request_closed_form():
    """One request, idle E+PD: encode = the encoder's batch time, transfer = latencies + setup + bytes / bandwidth."""
    scn = mm(EPD, FOUR_1080P, n=1)
    req = simulate(scn).requests.iloc[0]
    db = hwdb.load()
    v = vision_arch(db.model("Qwen2.5-VL-7B"))
    gpu = db.gpu("H100")
    eng = db.engine("vllm-v1")
    model = encoder_model(v, gpu, eng, db.profile_for(gpu.name, eng.engine), 1, EncoderConfig())
    lin, attn = encoder_flops(v, 1920, 1080)
    assert req["encode_queue_s"] == 0.0
    assert req["encode_s"] == pytest.approx(model.batch_time(4 * lin, 4 * attn, 4 * patches(v, 1920, 1080)))
    dep = resolve(scn).pools[0].dep
    path = embedding_path(EmbeddingTransferConfig(), db, scn.pools[1], gpu, 1, scn.pools[0], dep)
    nbytes = embedding_bytes(v, visual_tokens(v, 1920, 1080))
    # Four embeddings share both sides fairly: together they take 4x one's bytes at the narrower side.
    expect = 2 * path.latency_s + path.setup_s + 4 * nbytes / min(path.encoder_side_Bps, path.lm_side_Bps)
    assert req["embedding_transfer_s"] == pytest.approx(expect, rel=1e-6)


def test_tp_efficiency_table_and_fit():
    """Defaults reproduce the SGLang ViT ratios (TP2 492 ms, TP4 466 ms, TP8 524 ms); the fit inverts timings."""
    t = {tp: 1.0 / tp_speedup(tp) for tp in (2, 4, 8)}
    assert t[4] / t[2] == pytest.approx(466 / 492, rel=0.01)
    assert t[8] / t[2] == pytest.approx(524 / 492, rel=0.01)
    assert fit_tp_efficiency({1: 1.0, 2: 0.8, 4: 0.5}) == pytest.approx({1: 1.0, 2: 0.625, 4: 0.5})
    fitted = fit_tp_efficiency({2: 0.492, 4: 0.466, 8: 0.524})
    assert fitted[2] == DEFAULT_TP_EFFICIENCY[2] and fitted[4] == pytest.approx(DEFAULT_TP_EFFICIENCY[4], rel=0.01)
    slow = simulate(mm(EPD, FOUR_1080P, n=1)).requests["encode_s"].iloc[0]
    pools = [EPD[0], dict(EPD[1], encoder={"tp_efficiency": {1: 0.5}})]
    assert simulate(mm(pools, FOUR_1080P, n=1)).requests["encode_s"].iloc[0] > 1.9 * slow * 0.99


def test_percentile_goodput_criterion():
    df = pd.DataFrame(
        {"outcome": ["completed"] * 99 + ["rejected"], "ttft_s": [1.0] * 100, "tpot_s": [0.05] * 99 + [math.nan]}
    )
    assert percentile_slo_met(df, SLO(ttft_s=2.0, tpot_s=0.1, percentile=99))
    assert not percentile_slo_met(df, SLO(ttft_s=2.0, tpot_s=0.1, percentile=99.5))  # the rejected one counts
    assert not percentile_slo_met(df, SLO(ttft_s=0.5, percentile=50))


# ------------------------------------------------------------ must show 5: bad input


@pytest.mark.parametrize(
    "pools,over,words",
    [
        (COLO, {"model": "Llama-3.1-8B"}, ["workload.images", "Llama-3.1-8B has no vision encoder"]),
        (
            [{"name": "lm", "gpu": "H100", "engine": {"max_model_len": 8192}}],
            {},
            ["workload.images.resolutions", "gives 16170 visual tokens", "max_model_len=8192"],
        ),
        (
            [EPD[0], dict(EPD[1], encoder={"max_batch_tokens": 4096})],
            {},
            ["pools[enc].encoder.max_batch_tokens=4096", "16170 visual tokens", "at least 16170"],
        ),
        (
            EPD,
            {"embedding_transfer": {"fabric": "nvlink4"}},
            ["encoder pool 'enc'", "no path", "colocated pool 'lm'", "intra-node link"],
        ),
        (
            [EPD[0], dict(EPD[1], gpu="A100")],
            {"embedding_transfer": {"same_node": True}},
            ["encoder pool 'enc' (A100-SXM-80GB) has no path", "same_node needs one GPU type"],
        ),
        ([EPD[0], dict(EPD[1], dtype="fp8")], {}, ["pools[enc]", "dtype=fp8", "set dtype: bf16"]),
        ([EPD[0], dict(EPD[1], tp=32)], {}, ["pools[enc].tp=32 does not divide", "16 heads"]),
    ],
)
def test_bad_input_is_a_clear_error(pools, over, words):
    images = {"count": {"kind": "fixed", "value": 1}, "resolutions": [{"width": 8000, "height": 6000}]}
    with pytest.raises(ScenarioError) as exc:
        simulate(mm(pools, images, n=5, **over))
    msg = str(exc.value)
    for w in words:
        assert w in msg, msg
    assert "\n" not in msg


def test_aspect_ratio_error_names_the_field():
    images = {"count": {"kind": "fixed", "value": 1}, "resolutions": [{"width": 30000, "height": 100}]}
    with pytest.raises(ScenarioError, match=r"workload.images.resolutions: image 30000x100 .* crop or pad"):
        simulate(mm(COLO, images, n=3))


def test_bad_topology_and_cli_exit_code(tmp_path):
    with pytest.raises(ScenarioError, match="encoder-prefill-decode"):
        mm([EPD[1], dict(EPD[1], name="e2")], FOUR_1080P)
    path = tmp_path / "s.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": "Llama-3.1-8B",
                "pools": COLO,
                "workload": {
                    "arrival": {"kind": "poisson", "rate": 1},
                    "input_length": {"kind": "fixed", "value": 10},
                    "output_length": {"kind": "fixed", "value": 10},
                    "num_requests": 3,
                    "images": FOUR_1080P,
                },
            }
        )
    )
    assert main(["simulate", str(path)]) == 2


def test_vision_command(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich would abbreviate cells in a narrow terminal
    assert main(["vision", "Qwen2.5-VL-7B", "--resolution", "1920x1080", "28x28"]) == 0
    out = capsys.readouterr().out
    assert "2,691" in out and "1932x1092" in out and "56x56" in out
    assert main(["vision", "Llama-3.1-8B"]) == 2
    assert "has no vision encoder" in capsys.readouterr().err
    assert main(["vision", "Qwen3-VL-4B", "--resolution", "640by480"]) == 2
    assert "is not WIDTHxHEIGHT" in capsys.readouterr().err
    assert main(["vision", "Qwen3-VL-4B", "--tp", "16"]) == 2
    assert "no encoder TP efficiency for tp=16" in capsys.readouterr().err
    assert main(["vision", "Qwen3-VL-4B", "--tp-times", "1=1.0", "2=0.8", "4=0.5"]) == 0
    assert "tp_efficiency: {1: 1.000, 2: 0.625, 4: 0.500}" in capsys.readouterr().out
    assert main(["vision", "Qwen3-VL-4B", "--tp-times", "2=fast"]) == 2
    assert "is not TP=SECONDS" in capsys.readouterr().err
