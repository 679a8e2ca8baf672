"""The front end (simulator/engine/frontend.py): a delay on the way in, an output queue on the way out,
and its fit from client and server timestamps (calibration/fit_frontend.py)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

import hwdb
from calibration.fit_frontend import FrontEndFit, fit_frontend
from calibration.fit_predict import calibrated_engine
from calibration.harness.bundle import Bundle
from simulator.engine.frontend import FrontEnd, fifo, stream_delivery
from tests.synthetic_bundle import CPU_GPU, CPU_SETUP, CPU_TRUTH, TINY_CONFIG, _simulate, make_bundle, write_truth_hwdb


def test_fifo_is_lindleys_recursion():
    begin, end = fifo(np.array([0.0, 0.1, 0.15, 1.0]), np.array([0.2, 0.2, 0.2, 0.1]))
    assert begin.tolist() == pytest.approx([0.0, 0.2, 0.4, 1.0])
    assert end.tolist() == pytest.approx([0.2, 0.4, 0.6, 1.1])


def test_a_step_tokens_arrive_halfway_through_their_share():
    # two steps of 3 tokens, 1 ms each, the second step ending while the first is still streamed
    got = stream_delivery(np.array([0.0, 0.001]), np.array([3.0, 3.0]), np.array([0.0, 1.0]),
                          FrontEnd(stream_s_per_token=1e-3, stream_s_per_request=2e-3))
    # first: tokens at 1, 2, 3 ms (mean 2); second begins at 3 ms, 5 ms of work, tokens ~ every 5/3 ms
    assert got.tolist() == pytest.approx([2e-3, 3e-3 + (5e-3 + 5e-3 / 3) / 2])


@pytest.fixture
def tiny(tmp_path):
    t = tmp_path / "tiny-llama"
    t.mkdir()
    (t / "config.json").write_text(json.dumps(TINY_CONFIG))
    (t / "epdsim.yaml").write_text(yaml.safe_dump({"name": "tiny-llama", "source": "test copy"}))
    return t


def _truth_with_front_end(tmp_path, tiny, fe: FrontEndFit):
    """The synthetic truth (CPU_TRUTH) with an engine "truth" that carries front end ``fe``."""
    db = hwdb.load()
    hw = write_truth_hwdb(tmp_path / "truth", tiny, CPU_TRUTH, db)
    eng = calibrated_engine(db.engine("vllm-v1"), CPU_TRUTH["step_overhead_s"], 0.0, name="truth",
                            source="test truth", frontend=fe)
    (hw / "engines").mkdir(exist_ok=True)
    (hw / "engines" / "truth.yaml").write_text(yaml.safe_dump(eng.model_dump(exclude_none=True)))
    return hw


def test_the_output_queue_moves_client_times_only(tmp_path, tiny):
    """Server-side times (the engine's) are the same with and without the output queue; the client's
    first token comes later, and later still under load than alone."""
    hw = _truth_with_front_end(tmp_path, tiny, FrontEndFit(frontend_s=0.002, stream_s_per_token=1e-3,
                                                          stream_s_per_request=2e-3))
    load = {"arrival": {"kind": "poisson", "rate": 25.0}, "num_requests": 60,
            "input_length": {"kind": "fixed", "value": 128}, "output_length": {"kind": "fixed", "value": 32}}
    with_q = _simulate(hw, tiny, load, "truth").requests
    without = _simulate(hw, tiny, load).requests            # the base engine: the harness profile keeps it out
    assert "frontend_out_s" in with_q and "frontend_out_s" not in without
    assert np.allclose(with_q["frontend_s"], 0.002) and (without["frontend_s"] == 0).all()
    # the way in shifts the engine by 2 ms; the engine's own durations are unchanged
    assert np.allclose(with_q["first_token_s"] - with_q["scheduled_s"], without["first_token_s"] - without["scheduled_s"],
                       rtol=0.2)
    out = with_q["frontend_out_s"].to_numpy()
    assert (out >= 3e-3 - 1e-12).all()                      # at least its own first token's service
    assert np.percentile(out, 90) > 2 * 3e-3                # and it queues behind other streams under load
    assert np.allclose(with_q["ttft_s"], with_q["first_token_s"] - with_q["arrival_s"] + out)


def test_fit_recovers_the_front_end_from_timestamps(tmp_path, tiny):
    """A bundle measured on a simulated server whose front end is known (2 ms in, an output queue of
    1 ms per token and 3 ms more per first token; the synthetic client adds 4 ms): the fit finds the
    queue from the load test's client vs server times, and the way in from the lone requests."""
    hw = _truth_with_front_end(tmp_path, tiny, FrontEndFit(frontend_s=0.002, stream_s_per_token=1e-3,
                                                          stream_s_per_request=3e-3))
    b = Bundle.open(make_bundle(tmp_path / "b", hw, tiny, engine="truth", load_rate=10.0))
    fe = fit_frontend(b)
    assert fe.phases == ["load_poisson_r10"] and not fe.stream_why
    assert fe.stream_s_per_token == pytest.approx(1e-3, rel=0.3)
    assert 1e-3 < fe.stream_s_per_request < 5e-3        # the split per request is looser than per token
    # lone requests: 2 ms in + 4 ms of the synthetic client, the queue's own service taken off
    assert fe.frontend_s == pytest.approx(0.006, abs=1.5e-3)
    assert fe.error_with_queue < fe.error_without_queue


def test_no_queue_when_the_client_sees_a_constant(tmp_path, tiny):
    """Without a front end in the truth, the client is the server plus 4 ms: the fit keeps the delay and
    says why there is no queue."""
    hw = write_truth_hwdb(tmp_path / "truth", tiny, CPU_TRUTH, hwdb.load())
    fe = fit_frontend(Bundle.open(make_bundle(tmp_path / "b", hw, tiny)))
    assert fe.frontend_s == pytest.approx(0.004, abs=1e-3)
    assert fe.stream_s_per_token < 2e-4 and fe.stream_s_per_request < 1e-3
