"""The front end (simulator/engine/frontend.py): a delay on the way in, the API server's event loop on
the way out, and its fit from client and server timestamps (calibration/fit/frontend.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

import hwdb
from calibration.fit.frontend import FrontEndFit, fit_frontend
from calibration.fit.predict import calibrated_engine
from calibration.harness.bundle import Bundle
from simulator.engine.frontend import FrontEnd, WayIn, _outputs, api_server, seen_times
from tests.synthetic_bundle import CPU_TRUTH, TINY_CONFIG, _simulate, make_bundle, write_truth_hwdb


def test_api_server_by_hand():
    """Two requests, costs 1 ms per output, 2 ms per chunk, 4 ms more per first chunk.  A step at 0
    gives r0 and r1 their first tokens: processed by 2 ms, r0's chunk sent at 8, r1's at 14.  Steps at
    3, 6, 9 and 12 ms (each r0 and r1) arrived meanwhile: all eight processed by 22, then one chunk each
    carries four tokens (24, 26).  The loop sent 4 chunks for 10 tokens; a per-token queue would send 10."""
    ready = np.array([0, 0, 3, 3, 6, 6, 9, 9, 12, 12], float) * 1e-3
    owner = np.array([0, 1] * 5)
    got = api_server(
        ready, owner, FrontEnd(stream_s_per_output=1e-3, stream_s_per_chunk=2e-3, stream_s_per_request=4e-3)
    )
    assert got.tolist() == pytest.approx(np.array([8, 14] + [24, 26] * 4, float) * 1e-3)
    assert api_server(ready, owner, FrontEnd()).tolist() == ready.tolist()  # no costs: as emitted


@given(
    st.lists(st.tuples(st.floats(0.0, 0.01), st.integers(0, 7)), min_size=1, max_size=200),
    st.floats(1e-4, 5e-3),
    st.floats(0.0, 5e-3),
)
def test_the_loop_does_not_back_up(outputs, per_chunk, first):
    """However fast outputs come, with no per-output cost a token waits at most two rounds of the loop
    (the one running when it arrives, and the one that sends it), each at most one chunk per request;
    every token waits at least its own chunk; a request's tokens arrive in order."""
    ready = np.cumsum([g for g, _ in outputs])
    owner = np.array([r for _, r in outputs])
    got = api_server(ready, owner, FrontEnd(stream_s_per_chunk=per_chunk, stream_s_per_request=first))
    rounds = 2 * len(set(owner.tolist())) * (per_chunk + first)
    assert (got - ready <= rounds + 1e-12).all()
    assert (got - ready >= per_chunk - 1e-12).all()
    for r in set(owner.tolist()):
        mine = got[owner == r]
        assert (np.diff(mine) >= 0).all()


def test_outputs_are_one_per_step_from_the_first_token():
    """A request's outputs: its first token, then one per step of its instance up to its last, at most
    output - 1 of them (a request that joined later is not in the earlier steps)."""
    ends = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    first, last, out = np.array([1.0, 2.5, np.nan]), np.array([4.0, 5.0, np.nan]), np.array([4, 2, 3])
    ready, owner, is_first, is_last = _outputs(first, last, out, ends)
    assert list(zip(ready.tolist(), owner.tolist(), strict=True)) == [
        (1.0, 0),
        (2.0, 0),
        (2.5, 1),
        (3.0, 0),
        (4.0, 0),
        (5.0, 1),
    ]
    assert is_first.tolist() == [True, False, True, False, False, False]
    assert is_last.tolist() == [False, False, False, False, True, True]


def test_the_serial_way_in_keeps_the_order_requests_were_sent_in():
    """A short prompt sent 1 ms after a long one waits for it at the serial part (the API server's one
    tokenizer); as a side-by-side delay of the same size per token it would overtake it."""
    arrival, prompt = [0.0, 0.001, 0.5], [1000, 10, 10]
    serial = seen_times(arrival, prompt, FrontEnd(frontend_s=0.002, serial_s_per_token=1e-5))
    assert serial == pytest.approx([0.012, 0.0121 + 0.0, 0.5021])  # 10 ms + 0.1 ms behind it, then 2 ms each
    side = seen_times(arrival, prompt, FrontEnd(frontend_s=0.002, frontend_s_per_token=1e-5))
    assert side == pytest.approx([0.012, 0.0031, 0.5021])
    assert seen_times(arrival, prompt, FrontEnd(stream_s_per_chunk=1e-3)) is None  # no way in at all
    # two API servers (two instances): the second request takes the free one
    two = seen_times(arrival, prompt, FrontEnd(serial_s_per_token=1e-5, servers=2))
    assert two == pytest.approx([0.01, 0.0011, 0.5001])


@given(
    st.lists(st.tuples(st.floats(0.0, 0.05), st.integers(1, 4000)), min_size=1, max_size=30),
    st.integers(1, 3),
    st.floats(0.0, 0.01),
    st.floats(0.0, 1e-4),
)
def test_way_in_is_a_k_server_fifo(jobs, servers, fixed, per_token):
    """Against a direct k-server FCFS: each request starts its serial part when it was sent or when the
    first server frees, whichever is later; seen = that end + the fixed delay; with one server, the
    engine sees requests in the order they were sent."""
    arrival = np.cumsum([g for g, _ in jobs]).tolist()
    prompt = [p for _, p in jobs]
    got = seen_times(arrival, prompt, FrontEnd(frontend_s=fixed, serial_s_per_token=per_token, servers=servers))
    if not fixed and not per_token:
        assert got is None  # no way in: the engine sees each request at its arrival
        return
    free = [0.0] * servers
    for a, p, g in zip(arrival, prompt, got, strict=True):
        k = int(np.argmin(free))
        end = max(a, free[k]) + per_token * p
        free[k] = end
        assert g == pytest.approx(end + fixed, abs=1e-12)
        assert g >= a + fixed + per_token * p - 1e-12
    if servers == 1:
        assert all(x <= y + 1e-12 for x, y in zip(got, got[1:], strict=False))


def test_closed_loop_users_share_one_way_in():
    """Closed-loop users call the same WayIn as they send: a request sent while another's prompt is
    being served waits for it."""
    way = WayIn(FrontEnd(serial_s_per_token=1e-5))
    assert way.seen(0.0, 1000) == pytest.approx(0.01)
    assert way.seen(0.002, 100) == pytest.approx(0.011)
    assert way.seen(0.05, 100) == pytest.approx(0.051)


def test_a_closed_loop_burst_queues_at_the_serial_way_in(tmp_path, tiny):
    """Eight users send at once (no ramp-up) through a serial way in of 20 us per prompt token: their
    256-token prompts are served one after another, 5.12 ms each, so the k-th reaches the engine k x
    5.12 ms after it was sent; the recorded arrival stays the send time."""
    hw = _truth_with_front_end(tmp_path, tiny, FrontEndFit(frontend_s=0.0, serial_s_per_token=2e-5))
    load = {
        "arrival": {"kind": "closed", "concurrency": 8, "think_time_s": 0.0},
        "num_requests": 16,
        "input_length": {"kind": "fixed", "value": 256},
        "output_length": {"kind": "fixed", "value": 4},
    }
    req = _simulate(hw, tiny, load, "truth").requests.sort_values("request_id")
    first = req.head(8)
    assert (first["arrival_s"] == 0).all()
    assert sorted(first["frontend_s"]) == pytest.approx([k * 256 * 2e-5 for k in range(1, 9)])
    assert (req["frontend_s"] >= 256 * 2e-5 - 1e-12).all()


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
    eng = calibrated_engine(
        db.engine("vllm-v1"), CPU_TRUTH["step_overhead_s"], 0.0, name="truth", source="test truth", frontend=fe
    )
    (hw / "engines").mkdir(exist_ok=True)
    (hw / "engines" / "truth.yaml").write_text(yaml.safe_dump(eng.model_dump(exclude_none=True)))
    return hw


def test_the_api_server_loop_moves_client_times_only(tmp_path, tiny):
    """Server-side times (the engine's) are the same with and without the API server's loop; the
    client's first token comes later, and later still under load than alone."""
    hw = _truth_with_front_end(
        tmp_path,
        tiny,
        FrontEndFit(frontend_s=0.002, stream_s_per_output=2e-4, stream_s_per_chunk=1e-3, stream_s_per_request=2e-3),
    )
    load = {
        "arrival": {"kind": "poisson", "rate": 25.0},
        "num_requests": 60,
        "input_length": {"kind": "fixed", "value": 128},
        "output_length": {"kind": "fixed", "value": 32},
    }
    with_q = _simulate(hw, tiny, load, "truth").requests
    without = _simulate(hw, tiny, load).requests  # the base engine: the harness profile keeps it out
    assert "frontend_out_s" in with_q and "frontend_out_s" not in without
    assert np.allclose(with_q["frontend_s"], 0.002) and (without["frontend_s"] == 0).all()
    # the way in shifts the engine by 2 ms; the engine's own durations are unchanged
    assert np.allclose(
        with_q["first_token_s"] - with_q["scheduled_s"], without["first_token_s"] - without["scheduled_s"], rtol=0.2
    )
    out = with_q["frontend_out_s"].to_numpy()
    assert (out >= 3.2e-3 - 1e-12).all()  # at least its own output and first chunk
    assert np.percentile(out, 90) > 2 * 3.2e-3  # and it waits for other streams under load
    assert np.allclose(with_q["ttft_s"], with_q["first_token_s"] - with_q["arrival_s"] + out)


def test_fit_recovers_the_front_end_from_timestamps(tmp_path, tiny):
    """A bundle measured on a simulated server whose front end is known (2 ms in after a serial 4 us per
    prompt token; a loop of 0.2 ms per output, 1 ms per chunk and 3 ms more per first chunk; the
    synthetic client adds 4 ms): the fit finds the loop from the load test's client vs server times,
    and the way in from the lone requests."""
    hw = _truth_with_front_end(
        tmp_path,
        tiny,
        FrontEndFit(
            frontend_s=0.002,
            serial_s_per_token=4e-6,
            stream_s_per_output=2e-4,
            stream_s_per_chunk=1e-3,
            stream_s_per_request=3e-3,
        ),
    )
    b = Bundle.open(make_bundle(tmp_path / "b", hw, tiny, engine="truth", load_rate=10.0))
    fe = fit_frontend(b)
    assert fe.serial_s_per_token == pytest.approx(4e-6, rel=0.15)  # the lone requests' slope
    assert fe.phases == ["load_poisson_r10"] and not fe.stream_why
    print(fe.as_dict())
    assert fe.stream_s_per_output == 0.0  # not fitted: told from the chunk cost only under bursts
    assert fe.stream_s_per_chunk == pytest.approx(1.2e-3, rel=0.3)
    assert 1e-3 < fe.stream_s_per_request < 5e-3  # the split per request is looser
    # lone requests: 2 ms in + 4 ms of the synthetic client, the loop's own costs taken off
    assert fe.frontend_s == pytest.approx(0.006, abs=1.5e-3)
    assert fe.error_with_queue < fe.error_without_queue


def test_no_queue_when_the_client_sees_a_constant(tmp_path, tiny):
    """Without a front end in the truth, the client is the server plus 4 ms: the fit keeps the delay and
    says why there is no API server loop."""
    hw = write_truth_hwdb(tmp_path / "truth", tiny, CPU_TRUTH, hwdb.load())
    fe = fit_frontend(Bundle.open(make_bundle(tmp_path / "b", hw, tiny)))
    assert fe.frontend_s == pytest.approx(0.004, abs=1e-3)
    assert fe.stream_s_per_output + fe.stream_s_per_chunk < 2e-4 and fe.stream_s_per_request < 1e-3
