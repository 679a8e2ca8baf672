"""The fake vLLM server (tests/fixtures/calibration/fake_vllm_server.py) counts a request in /metrics
before it writes the request's ``[DONE]``.

The harness takes a request as finished when it reads ``[DONE]`` and scrapes /metrics as soon as the
last request of a phase finishes; a server that counted after writing ``[DONE]`` left a window in which
that scrape missed the request (the kill-and-resume test's ``12.0 == 13``, seen only under load).
Both steps run on the handler's own thread, so their order is checked here directly, without timing.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import threading

from tests.conftest import REPO

_SPEC = importlib.util.spec_from_file_location(
    "fake_vllm_server", REPO / "tests" / "fixtures" / "calibration" / "fake_vllm_server.py"
)
fake = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fake)


class _Counted(list):
    """The server's TTFT list, noting in ``events`` when a request is counted."""

    def __init__(self, events: list[str]):
        super().__init__()
        self.events = events

    def append(self, x) -> None:
        self.events.append("counted")
        super().append(x)


class _Writes:
    """A handler's ``wfile`` that notes in ``events`` when ``[DONE]`` is written."""

    def __init__(self, real, events: list[str]):
        self._real, self._events = real, events

    def write(self, data: bytes):
        if b"[DONE]" in data:
            self._events.append("done written")
        return self._real.write(data)

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_a_request_is_counted_before_its_done_is_written():
    events: list[str] = []
    args = argparse.Namespace(
        model="fake-model",
        root="/nonexistent",
        token_delay=0.0,
        prefill_delay=0.0,
        tokens_per_chunk=1,
        die_after=0,
        no_token_ids=False,
        no_tokenize=False,
    )
    state = fake.State(args)
    state.ttft = _Counted(events)
    base = fake.make_handler(state)

    class Handler(base):
        def setup(self):
            super().setup()
            self.wfile = _Writes(self.wfile, events)

    server = fake.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request(
            "POST",
            "/v1/completions",
            json.dumps(
                {
                    "model": "fake-model",
                    "prompt": [1, 2, 3],
                    "max_tokens": 3,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
            ),
            {"Content-Type": "application/json"},
        )
        body = conn.getresponse().read()
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)
    assert body.rstrip().endswith(b"data: [DONE]"), body[-200:]
    assert events == ["counted", "done written"], events
    assert len(state.ttft) == 1 and state.generation_tokens == 3
