"""Our PD router (calibration/pd/router.py) and the disaggregated pair on CPU (calibration/pd/run.py).

* Fast: the router against in-process fake prefill/decode servers (httpx MockTransport): what it sends
  to each, that it relays the decode stream unchanged, that it records timings and server metrics,
  and that an upstream error becomes an HTTP error for the client.  Protocol doubles only.
* ``@pytest.mark.vllm``: two real vLLM CPU servers (kv_producer + kv_consumer, ExampleConnector
  through files in tmp), ~10 requests through the router; every request completes with the
  requested number of tokens and the decode server loaded KV for each of them (its log).
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from calibration.harness.client import CompletionClient, RequestSpec
from calibration.harness.launch_env import ensure_tiny_model
from calibration.pd.launch import count_injections, launch_pair
from calibration.pd.router import PDRouter, decode_body, prefill_body
from calibration.pd.run import drive
from tests.conftest import VLLM_PY, needs_vllm


def test_prefill_and_decode_bodies():
    body = {
        "model": "m",
        "prompt": [1, 2, 3],
        "max_tokens": 20,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    p = prefill_body(body)
    assert p["max_tokens"] == 1 and p["stream"] is False and "stream_options" not in p
    assert p["kv_transfer_params"]["do_remote_decode"] is True
    assert p["prompt"] == [1, 2, 3] and body["max_tokens"] == 20  # the client's body is not modified
    d = decode_body(body, {"kv_transfer_params": {"remote_block_ids": [7]}})
    assert d["max_tokens"] == 20 and d["stream"] is True and d["kv_transfer_params"] == {"remote_block_ids": [7]}
    assert "kv_transfer_params" not in decode_body(body, {"choices": []})


def _fake_upstreams(seen: dict, decode_status: int = 200):
    def prefill(request: httpx.Request) -> httpx.Response:
        b = json.loads(request.content)
        seen["prefill"] = b
        return httpx.Response(
            200,
            json={
                "choices": [{"text": "x", "token_ids": [5]}],
                "kv_transfer_params": {"handle": "abc"},
                "metrics": {"time_to_first_token_ms": 12.0},
            },
        )

    def decode(request: httpx.Request) -> httpx.Response:
        b = json.loads(request.content)
        seen["decode"] = b
        if decode_status != 200:
            return httpx.Response(decode_status, json={"error": "boom"})
        n = b["max_tokens"]

        async def stream():
            for i in range(n):
                yield f'data: {{"choices":[{{"index":0,"text":"t","token_ids":[{i}]}}]}}\n\n'.encode()
                await asyncio.sleep(0.001)
            yield (
                b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":%d},'
                b'"metrics":{"time_to_first_token_ms":3.0,"mean_itl_ms":1.0}}\n\n' % n
            )
            yield b"data: [DONE]\n\n"

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())

    return prefill, decode


async def _through_router(seen: dict, n_tokens: int, decode_status: int = 200):
    router = PDRouter("http://prefill", "http://decode")
    prefill, decode = _fake_upstreams(seen, decode_status)
    await router._prefill.aclose()
    await router._decode.aclose()
    router._prefill = httpx.AsyncClient(base_url="http://prefill", transport=httpx.MockTransport(prefill))
    router._decode = httpx.AsyncClient(base_url="http://decode", transport=httpx.MockTransport(decode))
    port = await router.start()
    client = CompletionClient(f"http://127.0.0.1:{port}", "m")
    try:
        res = [
            await client.complete(RequestSpec(id=f"r{i}", prompt=[1, 2, 3], max_tokens=n_tokens)) for i in range(2)
        ]  # two requests on one keep-alive connection
    finally:
        await client.aclose()
        await router.close()
    return res, router.records()


def test_router_relays_decode_stream_and_records_timings():
    seen: dict = {}
    res, recs = asyncio.run(_through_router(seen, 6))
    assert seen["prefill"]["max_tokens"] == 1 and seen["prefill"]["stream"] is False
    assert seen["decode"]["max_tokens"] == 6 and seen["decode"]["kv_transfer_params"] == {"handle": "abc"}
    for r in res:
        assert r.ok, r.error
        assert r.output_tokens == 6 and len(r.token_times_s) == 6
        assert r.server_metrics["mean_itl_ms"] == 1.0
    assert len(recs) == 2
    for rec in recs:
        assert rec["prefill_status"] == 200 and rec["decode_status"] == 200 and rec["error"] is None
        assert 0 <= rec["prefill_sent_s"] <= rec["prefill_done_s"] <= rec["decode_sent_s"]
        assert rec["decode_sent_s"] <= rec["decode_first_token_s"] <= rec["finish_s"]
        assert rec["prefill_metrics"]["time_to_first_token_ms"] == 12.0
        assert rec["decode_metrics"]["mean_itl_ms"] == 1.0
        assert rec["prompt_tokens"] == 3


def test_router_decode_error_reaches_the_client():
    seen: dict = {}
    res, recs = asyncio.run(_through_router(seen, 4, decode_status=503))
    assert not res[0].ok and res[0].status == 503
    assert recs[0]["error"].startswith("decode HTTP 503")


# ----------------------------------------------------------------------------- real vLLM
@pytest.mark.vllm
@pytest.mark.slow
@needs_vllm
def test_vllm_pd_pair_through_router(tmp_path):
    t0 = time.monotonic()
    model = ensure_tiny_model(VLLM_PY, tmp_path / "model", lambda s: None)
    kv = tmp_path / "kv"
    kv.mkdir()
    p = d = None
    try:
        p, d = launch_pair(tmp_path, str(model), str(kv), vllm_python=VLLM_PY, ready_timeout=240)
        # prompts of 128 k + 2 tokens: all k blocks move, the decode recomputes two tokens
        summary = asyncio.run(
            drive(
                p.base_url,
                d.base_url,
                dict(n=10, rate=4.0, seed=1, blocks=[1, 2, 3], extra=2, out_min=8, out_max=16),
                tmp_path,
            )
        )
        p.check("after the load")
        d.check("after the load")
    finally:
        for s in (p, d):
            if s is not None:
                s.stop()
    recs = [json.loads(x) for x in (tmp_path / "records" / "load_pd.jsonl").read_text().splitlines()]
    assert summary["ok"] == 10 and len(recs) == 10
    for r in recs:
        assert r["ok"], r["error"]
        assert r["output_tokens"] == r["max_tokens"]
        assert r["prompt_tokens"] % 128 == 2
        assert r["pd"] and r["pd"]["prefill_status"] == 200 and r["pd"]["decode_status"] == 200
        assert r["pd"]["prefill_metrics"] is not None  # prefill ran on the prefill server
    inj = count_injections(d.log_path)
    assert len(inj) == 10, f"decode server loaded KV {len(inj)} times for 10 requests"
    assert sum(inj) == sum(r["prompt_tokens"] - 2 for r in recs)
    assert any(kv.iterdir()), "no KV files were written by the prefill server"
    assert time.monotonic() - t0 < 240
