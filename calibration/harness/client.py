"""Async streaming client for the OpenAI completions API of vLLM, and the prompts it sends.

Each request is streamed (server-sent events) and timed on the client's monotonic clock: send
time, arrival of every chunk (every token of a chunk gets the chunk's arrival time), finish
time.  Token counts come from ``usage`` (``stream_options.include_usage``) and, per chunk, from
``token_ids`` (vLLM's ``return_token_ids``); without them each non-empty chunk counts as one
token.  ``ignore_eos`` with ``max_tokens`` fixes the output length.  If the server runs with
``--enable-per-request-metrics`` the final chunk carries ``metrics`` (server-side TTFT, queue
time, decode time, mean ITL), which is stored as ``server_metrics``.

Prompts are lists of token ids (the completions API accepts them), built from the server's own
tokenizer through ``/tokenize``, so their lengths are exact whatever the model.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

import httpx

CONNECTION_ERRORS = (
    httpx.ConnectError,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
)


def as_interrupt(exc: BaseException) -> BaseException:
    """``exc``, or the ``KeyboardInterrupt`` inside it when Ctrl-C or SIGTERM (which the CLI turns into
    one) landed inside a task group (httpx's connect runs one) and came out wrapped in an exception
    group: an interrupt is still an interrupt, so the run is marked interrupted and exits 130."""
    if isinstance(exc, BaseExceptionGroup):
        inner: BaseException | None = exc.subgroup(KeyboardInterrupt)
        if inner is not None:
            while isinstance(inner, BaseExceptionGroup):
                inner = inner.exceptions[0]
            return inner
    return exc


@dataclass
class RequestSpec:
    id: str
    prompt: list[int] | str
    max_tokens: int
    arrival_s: float | None = None  # open loop: offset from the phase start
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_len(self) -> int | None:
        return len(self.prompt) if isinstance(self.prompt, list) else None


@dataclass
class RequestResult:
    id: str
    ok: bool
    error: str | None = None
    error_kind: str | None = None  # "connection" | "http" | "protocol" | "timeout"
    status: int | None = None
    t_send: float = math.nan  # wall clock (s since epoch) of the send
    scheduled_s: float | None = None  # open loop: planned offset from the phase start
    sent_s: float | None = None  # actual offset from the phase start
    ttft_s: float | None = None  # first token, seconds after send
    token_times_s: list[float] = field(default_factory=list)  # each output token, s after send
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    expected_prompt_tokens: int | None = None
    max_tokens: int | None = None
    chunks: int = 0
    token_count_source: str = "chunks"  # "token_ids" when the server returned them
    finish_reason: str | None = None
    server_metrics: dict | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def itl_s(self) -> list[float]:
        t = self.token_times_s
        return [b - a for a, b in pairwise(t)]

    def to_record(self) -> dict:
        d = asdict(self)
        d["kind"] = "request"
        d["token_times_s"] = [round(x, 6) for x in self.token_times_s]
        for k in ("ttft_s", "e2e_s", "sent_s"):
            if d[k] is not None:
                d[k] = round(d[k], 6)
        return d


class SSEDecoder:
    """Server-sent events from a stream of text lines: yields the ``data`` payload of each event."""

    def __init__(self):
        self._data: list[str] = []

    def feed_line(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        if line == "":
            if not self._data:
                return None
            data, self._data = "\n".join(self._data), []
            return data
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        return None

    def flush(self) -> str | None:
        return self.feed_line("")


class CompletionClient:
    """One HTTP/1.1 connection pool to a vLLM (OpenAI-compatible) server."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        request_timeout: float = 600.0,
        max_connections: int = 1024,
        extra_body: dict | None = None,
        return_token_ids: bool = True,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.extra_body = dict(extra_body or {})
        self.return_token_ids = return_token_ids
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, limits=limits, timeout=httpx.Timeout(request_timeout, connect=10.0)
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

    # -- small endpoints
    async def get_json(self, path: str) -> Any:
        r = await self._http.get(path)
        r.raise_for_status()
        return r.json()

    async def metrics_text(self) -> str:
        r = await self._http.get("/metrics")
        r.raise_for_status()
        return r.text

    async def tokenize(self, text: str) -> list[int]:
        r = await self._http.post("/tokenize", json={"model": self.model, "prompt": text, "add_special_tokens": False})
        r.raise_for_status()
        return list(r.json()["tokens"])

    # -- the streamed completion
    def body(self, spec: RequestSpec) -> dict:
        b = {
            "model": self.model,
            "prompt": spec.prompt,
            "max_tokens": spec.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "temperature": 0.0,
        }
        if self.return_token_ids:
            b["return_token_ids"] = True
        b.update(self.extra_body)
        return b

    async def complete(self, spec: RequestSpec, phase_t0: float | None = None) -> RequestResult:
        res = RequestResult(
            id=spec.id,
            ok=False,
            scheduled_s=spec.arrival_s,
            max_tokens=spec.max_tokens,
            expected_prompt_tokens=spec.prompt_len,
            meta=dict(spec.meta),
        )
        dec = SSEDecoder()
        t_send = time.monotonic()
        res.t_send = time.time()
        if phase_t0 is not None:
            res.sent_s = t_send - phase_t0
        counted = 0
        try:
            async with self._http.stream("POST", "/v1/completions", json=self.body(spec)) as r:
                res.status = r.status_code
                if r.status_code != 200:
                    text = (await r.aread()).decode("utf-8", "replace")
                    res.error, res.error_kind = f"HTTP {r.status_code}: {text[:500]}", "http"
                    return res
                done = False
                async for line in r.aiter_lines():
                    data = dec.feed_line(line)
                    if data is None:
                        continue
                    if data.strip() == "[DONE]":
                        done = True
                        break
                    counted += self._on_chunk(res, json.loads(data), time.monotonic() - t_send)
                if not done:
                    tail = dec.flush()
                    if tail and tail.strip() != "[DONE]":
                        counted += self._on_chunk(res, json.loads(tail), time.monotonic() - t_send)
                    res.error, res.error_kind = "stream ended without [DONE]", "protocol"
        except CONNECTION_ERRORS as exc:
            res.error, res.error_kind = f"{type(exc).__name__}: {exc}", "connection"
            return res
        except httpx.TimeoutException as exc:
            res.error, res.error_kind = f"{type(exc).__name__}: {exc}", "timeout"
            return res
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            res.error, res.error_kind = f"bad chunk: {exc}", "protocol"
            return res
        res.e2e_s = time.monotonic() - t_send
        if res.output_tokens is None:
            res.output_tokens = counted
        if res.error is None:
            res.ok = True
        return res

    @staticmethod
    def _on_chunk(res: RequestResult, chunk: dict, t: float) -> int:
        """Record one chunk; return the number of output tokens it carried."""
        if "error" in chunk and not chunk.get("choices"):
            err = chunk["error"]
            raise KeyError(err.get("message", str(err)) if isinstance(err, dict) else str(err))
        usage = chunk.get("usage")
        if usage:
            res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
            res.output_tokens = usage.get("completion_tokens", res.output_tokens)
        if chunk.get("metrics"):
            res.server_metrics = chunk["metrics"]
        n = 0
        for ch in chunk.get("choices") or []:
            ids = ch.get("token_ids")
            if ids is not None:
                n += len(ids)
                res.token_count_source = "token_ids"
            elif ch.get("text"):
                n += 1
            if ch.get("finish_reason"):
                res.finish_reason = ch["finish_reason"]
        if n:
            res.chunks += 1
            if res.ttft_s is None:
                res.ttft_s = t
            res.token_times_s.extend([t] * n)
        return n


# ---------------------------------------------------------------------------- prompts
_WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case "
    "point government company number group problem fact be have do say get make go know take see "
    "come think look want give use find tell ask seem feel try leave call good new first last long "
    "great little own other old right big high different small large next early young important few "
    "public bad same able to of in for on with at by from up about into over after beneath under "
    "above the and a that I it not he as you this but his they her she or an will my one all would "
    "there their 0 1 2 3 4 5 6 7 8 9 , . ; : ! ? ( ) - \" '"
).split()


def sample_text(seed: int = 0, n_words: int = 800) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


class PromptFactory:
    """Prompts of an exact token length as token-id lists.

    The pool of ids is the server tokenizer's encoding of a sample text (so every id is an
    ordinary token of that model); each prompt draws its ids from the pool with a generator
    seeded by the request id, so a prompt is the same in a resumed run and prompts do not share
    prefixes (no prefix-cache hits between requests)."""

    def __init__(self, pool: Sequence[int], seed: int = 0):
        pool = sorted({int(i) for i in pool})
        if len(pool) < 16:
            raise ValueError(f"token pool too small ({len(pool)} ids)")
        self.pool = pool
        self.seed = seed
        self.source = "given"

    #: ids used when the server has no ``/tokenize`` (not vLLM): ordinary tokens of any large vocabulary
    FALLBACK_POOL = range(1000, 2000)

    @classmethod
    async def from_server(cls, client: CompletionClient, seed: int = 0) -> PromptFactory:
        """Pool from the server's tokenizer; without ``/tokenize``, ids 1000-1999 (``source`` says which)."""
        try:
            pf = cls(await client.tokenize(sample_text(seed)), seed)
            pf.source = "tokenize"
        except (httpx.HTTPError, KeyError, ValueError):
            pf = cls(cls.FALLBACK_POOL, seed)
            pf.source = "fallback ids 1000-1999 (no /tokenize)"
        return pf

    def prompt(self, request_id: str, length: int) -> list[int]:
        rng = random.Random(f"{self.seed}:{request_id}")
        return [rng.choice(self.pool) for _ in range(length)]
