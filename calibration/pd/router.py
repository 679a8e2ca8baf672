"""A minimal prefill/decode (PD) router for two vLLM servers: our own, for the calibration harness.

Each ``POST /v1/completions`` is served in two steps:

1. the prompt goes to the *prefill* server as a non-streamed completion with ``max_tokens=1``
   (and ``kv_transfer_params={"do_remote_decode": true}``, which pull-based connectors such as
   NIXL read; file-based ``ExampleConnector`` ignores it and keys the KV files by the prompt's
   token ids);
2. the client's original request goes to the *decode* server, with the ``kv_transfer_params``
   the prefill answer returned (if any), and the decode server's stream is relayed to the
   client unchanged.

The router records, per request, its own monotonic timestamps (received, prefill sent, prefill
returned, decode sent, first decode byte, finish) and the server-side ``metrics`` of both
answers where vLLM runs with ``--enable-per-request-metrics``; :meth:`PDRouter.records` returns
them and ``--records FILE`` appends them as JSON lines.

Other paths (``/health``, ``/v1/models``, ``/tokenize``, ``/metrics``) are forwarded to the
decode server.  The HTTP server is a small HTTP/1.1 implementation on asyncio streams (keep-alive,
``Content-Length`` request bodies, chunked responses) so that the router needs only ``httpx``.

Run::

    python -m calibration.pd.router --prefill http://127.0.0.1:8100 \
        --decode http://127.0.0.1:8200 --port 8000 [--records pd_router.jsonl]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

FORWARDED_GETS = ("/health", "/v1/models", "/metrics", "/version")
FORWARDED_POSTS = ("/tokenize", "/detokenize")


@dataclass
class RouteRecord:
    """What the router saw of one request (monotonic seconds, relative to ``t_received``)."""

    id: str
    t_received_wall: float
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    prefill_sent_s: float | None = None
    prefill_done_s: float | None = None
    decode_sent_s: float | None = None
    decode_first_byte_s: float | None = None
    decode_first_token_s: float | None = None
    finish_s: float | None = None
    prefill_status: int | None = None
    decode_status: int | None = None
    prefill_metrics: dict | None = None
    decode_metrics: dict | None = None
    kv_transfer_params: dict | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_record(self) -> dict:
        d = asdict(self)
        d["kind"] = "pd_route"
        return d


def prompt_hash(prompt) -> str:
    """A short key of a prompt (to join the router's records with the client's)."""
    return hashlib.sha1(json.dumps(prompt).encode()).hexdigest()[:16]


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


def prefill_body(body: dict) -> dict:
    """The request sent to the prefill server: same prompt, one token, not streamed."""
    b = dict(body)
    b["max_tokens"] = 1
    b.pop("max_completion_tokens", None)
    b["stream"] = False
    b.pop("stream_options", None)
    b["min_tokens"] = 0
    kv = dict(b.get("kv_transfer_params") or {})
    kv.setdefault("do_remote_decode", True)
    kv.setdefault("do_remote_prefill", False)
    b["kv_transfer_params"] = kv
    return b


def decode_body(body: dict, prefill_answer: dict | None) -> dict:
    """The request sent to the decode server: the client's, plus the prefill's kv_transfer_params."""
    b = dict(body)
    kv = (prefill_answer or {}).get("kv_transfer_params")
    if kv:
        b["kv_transfer_params"] = kv
    return b


class PDRouter:
    def __init__(self, prefill_url: str, decode_url: str, *, timeout: float = 600.0, records_path: str | None = None):
        self.prefill_url = prefill_url.rstrip("/")
        self.decode_url = decode_url.rstrip("/")
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
        to = httpx.Timeout(timeout, connect=10.0)
        self._prefill = httpx.AsyncClient(base_url=self.prefill_url, limits=limits, timeout=to)
        self._decode = httpx.AsyncClient(base_url=self.decode_url, limits=limits, timeout=to)
        self._records: list[RouteRecord] = []
        self._records_path = records_path
        self._server: asyncio.base_events.Server | None = None
        self.port: int | None = None

    def records(self) -> list[dict]:
        return [r.to_record() for r in self._records]

    # ------------------------------------------------------------------ server life cycle
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        self._server = await asyncio.start_server(self._handle_conn, host, port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await self._prefill.aclose()
        await self._decode.aclose()

    # ------------------------------------------------------------------ HTTP/1.1 plumbing
    async def _handle_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                req = await self._read_request(reader)
                if req is None:
                    break
                method, path, headers, body = req
                keep = headers.get("connection", "").lower() != "close"
                try:
                    await self._dispatch(method, path, body, writer)
                except HTTPError as exc:
                    await self._send_simple(writer, exc.status, json.dumps({"error": str(exc)}).encode())
                except (ConnectionError, asyncio.IncompleteReadError):
                    break
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            try:
                writer.close()
            except Exception:  # pragma: no cover  # noqa: BLE001 - the socket is already gone: nothing to close
                pass

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader):
        line = await reader.readline()
        if not line:
            return None
        parts = line.decode("latin-1").strip().split()
        if len(parts) < 2:
            return None
        method, path = parts[0].upper(), parts[1].split("?", 1)[0]
        headers: dict[str, str] = {}
        while True:
            h = await reader.readline()
            if h in (b"\r\n", b"\n", b""):
                break
            k, _, v = h.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            chunks = []
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await reader.readline()
                    break
                chunks.append(await reader.readexactly(size))
                await reader.readline()
            body = b"".join(chunks)
        else:
            n = int(headers.get("content-length", "0") or 0)
            body = await reader.readexactly(n) if n else b""
        return method, path, headers, body

    @staticmethod
    async def _send_simple(writer, status: int, body: bytes, ctype: str = "application/json") -> None:
        head = (
            f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        writer.write(head + body)
        await writer.drain()

    @staticmethod
    async def _start_chunked(writer, status: int, ctype: str) -> None:
        writer.write(
            (
                f"HTTP/1.1 {status} {REASONS.get(status, 'Status')}\r\nContent-Type: {ctype}\r\n"
                f"Transfer-Encoding: chunked\r\nCache-Control: no-cache\r\n\r\n"
            ).encode()
        )
        await writer.drain()

    @staticmethod
    async def _chunk(writer, data: bytes) -> None:
        if data:
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()

    @staticmethod
    async def _end_chunked(writer) -> None:
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    # ------------------------------------------------------------------ routing
    async def _dispatch(self, method: str, path: str, body: bytes, writer) -> None:
        if method == "GET" and path in FORWARDED_GETS:
            try:
                r = await self._decode.get(path)
            except httpx.HTTPError as exc:
                raise HTTPError(503, f"decode server unreachable: {exc}") from None
            if path == "/health" and r.status_code == 200:
                try:
                    p = await self._prefill.get("/health")
                except httpx.HTTPError as exc:
                    raise HTTPError(503, f"prefill server unreachable: {exc}") from None
                if p.status_code != 200:
                    raise HTTPError(503, "prefill server not healthy")
            await self._send_simple(writer, r.status_code, r.content, r.headers.get("content-type", "application/json"))
            return
        if method == "POST" and path in FORWARDED_POSTS:
            try:
                r = await self._decode.post(path, content=body, headers={"content-type": "application/json"})
            except httpx.HTTPError as exc:
                raise HTTPError(503, f"decode server unreachable: {exc}") from None
            await self._send_simple(writer, r.status_code, r.content)
            return
        if path == "/v1/completions":
            if method != "POST":
                raise HTTPError(405, "use POST")
            try:
                req = json.loads(body or b"{}")
            except json.JSONDecodeError as exc:
                raise HTTPError(400, f"bad JSON: {exc}") from None
            await self._completion(req, writer)
            return
        raise HTTPError(404, f"no route for {method} {path}")

    async def _completion(self, req: dict, writer) -> None:
        t0 = time.monotonic()
        prompt = req.get("prompt")
        rec = RouteRecord(
            id=str(req.get("request_id") or uuid.uuid4().hex),
            t_received_wall=time.time(),
            prompt_tokens=len(prompt) if isinstance(prompt, list) else None,
            max_tokens=req.get("max_tokens"),
            extra={"prompt_hash": prompt_hash(prompt)},
        )
        self._records.append(rec)
        try:
            # 1. prefill: one token, not streamed
            rec.prefill_sent_s = time.monotonic() - t0
            try:
                p = await self._prefill.post("/v1/completions", json=prefill_body(req))
            except httpx.HTTPError as exc:
                rec.error = f"prefill: {type(exc).__name__}: {exc}"
                raise HTTPError(502, rec.error) from None
            rec.prefill_done_s = time.monotonic() - t0
            rec.prefill_status = p.status_code
            if p.status_code != 200:
                rec.error = f"prefill HTTP {p.status_code}: {p.text[:300]}"
                raise HTTPError(p.status_code, rec.error)
            ans = p.json()
            rec.prefill_metrics = ans.get("metrics")
            rec.kv_transfer_params = ans.get("kv_transfer_params")
            # 2. decode: the client's request, streamed back as it comes
            dreq = decode_body(req, ans)
            stream = bool(dreq.get("stream"))
            rec.decode_sent_s = time.monotonic() - t0
            try:
                async with self._decode.stream("POST", "/v1/completions", json=dreq) as r:
                    rec.decode_status = r.status_code
                    if r.status_code != 200:
                        text = (await r.aread()).decode("utf-8", "replace")
                        rec.error = f"decode HTTP {r.status_code}: {text[:300]}"
                        raise HTTPError(r.status_code, rec.error)
                    if not stream:
                        data = await r.aread()
                        rec.decode_first_byte_s = time.monotonic() - t0
                        try:
                            rec.decode_metrics = json.loads(data).get("metrics")
                        except (json.JSONDecodeError, AttributeError):
                            pass
                        await self._send_simple(writer, 200, data)
                        return
                    await self._start_chunked(writer, 200, r.headers.get("content-type", "text/event-stream"))
                    buf = b""
                    async for piece in r.aiter_bytes():
                        now = time.monotonic() - t0
                        if rec.decode_first_byte_s is None:
                            rec.decode_first_byte_s = now
                        await self._chunk(writer, piece)
                        buf += piece
                        # watch the SSE events for the first token and the metrics chunk
                        while b"\n\n" in buf:
                            event, buf = buf.split(b"\n\n", 1)
                            self._inspect_event(rec, event, now)
                    await self._end_chunked(writer)
            except httpx.HTTPError as exc:
                rec.error = f"decode: {type(exc).__name__}: {exc}"
                raise HTTPError(502, rec.error) from None
        finally:
            rec.finish_s = time.monotonic() - t0
            if self._records_path:
                with open(self._records_path, "a") as fh:
                    fh.write(json.dumps(rec.to_record()) + "\n")

    @staticmethod
    def _inspect_event(rec: RouteRecord, event: bytes, now: float) -> None:
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if not data or data == b"[DONE]":
                continue
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                continue
            if chunk.get("metrics"):
                rec.decode_metrics = chunk["metrics"]
            if rec.decode_first_token_s is None:
                for ch in chunk.get("choices") or []:
                    if ch.get("token_ids") or ch.get("text"):
                        rec.decode_first_token_s = now
                        break


async def serve(prefill: str, decode: str, host: str, port: int, records: str | None) -> None:
    router = PDRouter(prefill, decode, records_path=records)
    p = await router.start(host, port)
    print(f"pd_router listening on http://{host}:{p} (prefill {prefill}, decode {decode})", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await router.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m calibration.pd.router", description=__doc__.splitlines()[0])
    ap.add_argument("--prefill", required=True, help="base URL of the prefill (kv_producer) server")
    ap.add_argument("--decode", required=True, help="base URL of the decode (kv_consumer) server")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--records", default=None, help="append one JSON line per routed request to this file")
    a = ap.parse_args(argv)
    try:
        asyncio.run(serve(a.prefill, a.decode, a.host, a.port, a.records))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
