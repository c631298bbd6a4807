"""The HTTP client of ``shuniu bench``: cheap enough not to be what a benchmark measures.

One process, one event loop (uvloop when installed). Each connection is an
:class:`asyncio.Protocol` that parses responses with ``httptools`` (the C parser uvicorn
uses): no task, future or stream object per request, and keep-alive connections are reused
from a free list. Request bytes are built once per request (a pre-encoded header template,
the JSON body from :mod:`msgspec`).

Streamed responses go through :class:`SseTracker`, which finds event boundaries in the bytes
and decodes each event's JSON with a typed msgspec decoder that only materializes the
fields it reads (``choices[].delta.content``/``text``, ``usage``, ``error``). Times are taken
once per ``data_received`` call (``time.perf_counter``), so events that arrive in one read
share a timestamp, as the client saw them.

Errors are classified into short kinds (see :func:`http_error_kind`): ``"429 queue_full"``,
``"503 queue_timeout"``, ``"timeout"``, ``"connection_refused"``, ``"connection_closed"``
(the server closed the connection before the response ended), ``"stream_error <code>"`` (an
error event inside a 200 stream), ``"stream_incomplete"`` (the stream ended without
``data: [DONE]``), ``"bad_response"`` (not HTTP, or a body that is not the JSON expected).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools
import msgspec

__all__ = [
    "ROUTES",
    "Call",
    "Endpoint",
    "Pool",
    "SseTracker",
    "http_error_kind",
    "parse_endpoint",
    "parse_response",
]

# --------------------------------------------------------------------------- decoding


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    text: str | None = None
    """Anthropic's ``content_block_delta`` (``text_delta``)."""
    thinking: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    message: _Delta | None = None
    text: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    input_tokens: int | None = None
    """Anthropic's names for the prompt and completion tokens."""
    output_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    cache_read_input_tokens: int | None = None
    """Anthropic's name for the prompt tokens its cache served."""

    @property
    def prompt(self) -> int | None:
        return self.prompt_tokens if self.prompt_tokens is not None else self.input_tokens

    @property
    def cached(self) -> int | None:
        """Prompt tokens the server's prefix cache served (when it says)."""
        d = self.prompt_tokens_details
        if d is not None and d.cached_tokens is not None:
            return d.cached_tokens
        return self.cache_read_input_tokens

    @property
    def completion(self) -> int | None:
        return self.completion_tokens if self.completion_tokens is not None else self.output_tokens


class _Part(msgspec.Struct):
    type: str | None = None
    text: str | None = None


class _Error(msgspec.Struct):
    message: str | None = None
    type: str | None = None
    code: str | int | None = None


class _Payload(msgspec.Struct):
    """Every field an event or a response body is read for (others are skipped)."""

    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: _Error | str | None = None
    # vLLM's older error shape: {"object": "error", "message": ..., "type": ..., "code": 400}
    object: str | None = None
    type: str | None = None
    code: str | int | None = None
    message: str | dict[str, Any] | None = None
    """An error's message, or Anthropic's ``message_start`` message."""
    data: list[Any] | None = None
    """Embeddings (one per input) and scores."""
    results: list[Any] | None = None
    """Rerank results."""
    content: list[_Part] | None = None
    """An Anthropic message's content blocks."""
    delta: _Delta | None = None
    """An Anthropic stream event's delta."""


_decode_payload = msgspec.json.Decoder(_Payload).decode
_decode_any = msgspec.json.Decoder().decode


def _text_of(choice: Any) -> str | None:
    d = choice.delta if choice.delta is not None else choice.message
    if d is not None:
        return d.content or d.reasoning_content or d.reasoning
    return choice.text


def _decode(payload: bytes) -> _Payload | None:
    """The payload, or None if it is not JSON at all. A JSON object of an unexpected shape
    (say, ``content`` as a list of parts) is read leniently."""
    try:
        return _decode_payload(payload)
    except msgspec.ValidationError:
        pass
    except msgspec.DecodeError:
        return None
    try:
        raw = _decode_any(payload)
    except msgspec.DecodeError:
        return None
    if not isinstance(raw, dict):
        return None
    out = _Payload()
    err = raw.get("error")
    if isinstance(err, dict):
        out.error = _Error(str(err.get("message")), _str(err.get("type")), _str(err.get("code")))
    elif err:
        out.error = str(err)
    choices = []
    for c in raw.get("choices") or ():
        if not isinstance(c, dict):
            continue
        d = c.get("delta") if isinstance(c.get("delta"), dict) else c.get("message")
        text: Any = c.get("text")
        if isinstance(d, dict):
            text = d.get("content") or d.get("reasoning_content") or d.get("reasoning")
            if isinstance(text, list):  # content parts
                text = "".join(str(p.get("text", "")) for p in text if isinstance(p, dict))
        choices.append(_Choice(text=text if isinstance(text, str) else None))
    out.choices = choices
    usage = raw.get("usage")
    if isinstance(usage, dict):
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        out.usage = _Usage(pt if isinstance(pt, int) else None, ct if isinstance(ct, int) else None)
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        if isinstance(cached, int):
            out.usage.prompt_tokens_details = _PromptDetails(cached)
    return out


def _str(v: Any) -> str | None:
    return None if v is None else str(v)


def _error_label(p: _Payload) -> str | None:
    """The code (or type) of an error payload, '' for an error without either; None when the
    payload is no error."""
    err = p.error
    if isinstance(err, _Error):
        code, type_ = err.code, err.type
    elif isinstance(err, str):
        return err.split()[0][:40] if err.strip() else ""
    elif p.object == "error":
        code, type_ = p.code, p.type
    else:
        return None
    if isinstance(code, str) and code:
        return code
    return type_ or ""


def http_error_kind(status: int, body: bytes) -> str:
    """``"<status> <code>"`` for an error response: the OpenAI-style ``error.code`` (or,
    without one or with a numeric one as vLLM sends, ``error.type``); just the status when
    the body says neither."""
    p = _decode(body) if body else None
    label = _error_label(p) if p is not None else None
    return f"{status} {label}" if label else str(status)


class Response(msgspec.Struct):
    """What a complete (non-streamed) response body says."""

    text: str = ""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    items: int | None = None
    """Vectors (embeddings) or scored documents (rerank, score) the answer holds."""
    cached_tokens: int | None = None
    """Prompt tokens the server's prefix cache served (when ``usage`` says)."""


def parse_response(body: bytes) -> Response | None:
    """A non-streamed answer (a completion, an Anthropic message, embeddings, a ranking);
    None if it is none of them."""
    p = _decode(body)
    if p is None or _error_label(p) is not None:
        return None
    u = p.usage
    cached = u.cached if u else None
    if p.choices is not None:
        text = "".join(t for t in map(_text_of, p.choices) if t)
        return Response(text, u.prompt if u else None, u.completion if u else None, cached_tokens=cached)
    if p.content is not None:
        text = "".join(part.text or "" for part in p.content)
        return Response(text, u.prompt if u else None, u.completion if u else None, cached_tokens=cached)
    items = p.data if p.data is not None else p.results
    if items is None:
        return None
    prompt = None if u is None else u.prompt if u.prompt is not None else u.total_tokens
    return Response("", prompt, 0, len(items))


# --------------------------------------------------------------------------- SSE


class SseTracker:
    """Timing of one streamed response, fed the response body as it arrives.

    ``feed(data, now)`` takes body bytes (HTTP chunked framing already removed) and the time
    they arrived. An event with non-empty ``content`` (chat), ``text`` (completions) or
    reasoning text is a *content chunk*: the first sets ``first``; each later one adds the
    gap since the previous one to ``gaps`` (inter-chunk latency). ``usage`` (from the
    ``include_usage`` event), an error event, and ``data: [DONE]`` are recorded."""

    __slots__ = (
        "bad_events",
        "buf",
        "cached_tokens",
        "chunks",
        "completion_tokens",
        "done",
        "error",
        "first",
        "gaps",
        "last",
        "prompt_tokens",
    )

    def __init__(self) -> None:
        self.buf = b""
        self.first = -1.0
        """Arrival time of the first content chunk (-1: none yet)."""
        self.last = -1.0
        """Arrival time of the latest content chunk."""
        self.chunks = 0
        """Content chunks seen."""
        self.gaps: list[float] = []
        """Seconds between consecutive content chunks."""
        self.done = False
        """``data: [DONE]`` seen."""
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        """Prompt tokens the server's prefix cache served (from ``usage``, when it says)."""
        self.error: str | None = None
        """``"stream_error <code>"`` when the stream carried an error event."""
        self.bad_events = 0
        """Events whose data was not JSON."""

    def feed(self, data: bytes, now: float) -> None:
        buf = self.buf + data if self.buf else data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self.buf = events.pop()  # the part after the last complete event
        decode = _decode_payload
        for event in events:
            # The usual event is one `data: {...}` line; anything else takes the long way.
            if event[:6] == b"data: " and b"\n" not in event:
                payload = event[6:]
            else:
                payload = _data_of(event)
                if not payload:
                    continue
            if payload == b"[DONE]":
                self.done = True
                continue
            try:
                p = decode(payload)
            except (msgspec.ValidationError, msgspec.DecodeError):
                p = _decode(payload)
                if p is None:
                    self.bad_events += 1
                    continue
            choices = p.choices
            if choices:
                c = choices[0]
                d = c.delta
                if d is not None and len(choices) == 1:
                    text = d.content or d.reasoning_content or d.reasoning
                else:
                    text = any(map(_text_of, choices))
            elif p.delta is not None:
                text = p.delta.text or p.delta.thinking
            else:
                text = None
                if p.type == "message_stop":
                    self.done = True  # Anthropic's streams end with it, not with [DONE]
                elif isinstance(p.message, dict):
                    usage = p.message.get("usage")
                    if isinstance(usage, dict):
                        if isinstance(usage.get("input_tokens"), int):
                            self.prompt_tokens = usage["input_tokens"]
                        if isinstance(usage.get("cache_read_input_tokens"), int):
                            self.cached_tokens = usage["cache_read_input_tokens"]
            if text:
                if self.first < 0:
                    self.first = now
                else:
                    self.gaps.append(now - self.last)
                self.last = now
                self.chunks += 1
            if p.usage is not None:
                if p.usage.completion is not None:
                    self.completion_tokens = p.usage.completion
                if p.usage.prompt is not None:
                    self.prompt_tokens = p.usage.prompt
                if p.usage.cached is not None:
                    self.cached_tokens = p.usage.cached
            if p.error is not None or p.object == "error":
                label = _error_label(p)
                if label is not None and self.error is None:
                    self.error = f"stream_error {label}".rstrip()


def _data_of(event: bytes) -> bytes:
    """The data of an SSE event of several lines (comments such as ``: ping``, ``event:``,
    ``id:`` and ``retry:`` fields, multi-line data), b'' when it has none."""
    lines = [ln[5:].strip() for ln in event.split(b"\n") if ln[:5] == b"data:"]
    return b"\n".join(lines)


# --------------------------------------------------------------------------- endpoints


ROUTES = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
    "rerank": "/rerank",
    "messages": "/messages",
}
"""Each API's route under the API root (``chat`` first: ``/completions`` ends it too)."""


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: ``root`` is the API root path (``/v1``); ``api`` is set when the URL
    named an endpoint (``.../chat/completions`` or ``.../completions``)."""

    scheme: str
    host: str
    port: int
    root: str
    api: str | None = None

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"

    def path(self, api: str) -> str:
        return self.root + ROUTES[api]

    @property
    def display(self) -> str:
        return f"{self.scheme}://{self.host_header}{self.root}"


def parse_endpoint(url: str) -> Endpoint:
    """An API root such as ``http://127.0.0.1:8000/v1`` (or a full ``.../chat/completions``
    or ``.../completions`` URL); raises ``ValueError``. User info in the URL is refused
    (credentials belong in ``--api-key``)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"no host in {url!r}")
    if parts.username or parts.password:
        raise ValueError("put credentials in --api-key or --header, not in the URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"bad port in {url!r}") from None
    path = parts.path.rstrip("/")
    api = None
    for kind, suffix in ROUTES.items():
        if path.endswith(suffix):
            path, api = path[: -len(suffix)], kind
            break
    return Endpoint(parts.scheme, parts.hostname, port, path or "", api)


def request_head(endpoint: Endpoint, path: str, headers: list[tuple[str, str]], user_agent: str) -> bytes:
    """The request line and headers up to ``Content-Length: `` (its value and the body are
    appended per request)."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
    return (
        f"POST {path} HTTP/1.1\r\nHost: {endpoint.host_header}\r\nUser-Agent: {user_agent}\r\n"
        f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"{extra}Content-Length: "
    ).encode("latin-1")


# --------------------------------------------------------------------------- calls


class Call:
    """One request and, once ``end`` is set, its outcome. Times are ``perf_counter``
    seconds: ``intended`` (when the schedule wanted it sent), ``issued`` (when the client
    dispatched it: TTFT and end-to-end latency count from here), ``end``."""

    __slots__ = (
        "cached_tokens",
        "chunks",
        "completion_tokens",
        "end",
        "error",
        "first",
        "gaps",
        "index",
        "intended",
        "issued",
        "items",
        "measured",
        "planned_output",
        "planned_prompt",
        "prompt_tokens",
        "request",
        "status",
        "stream",
        "text",
    )

    def __init__(
        self,
        index: int,
        request: bytes,
        stream: bool,
        intended: float,
        measured: bool,
        planned_prompt: int,
        planned_output: int | None,
    ) -> None:
        self.index = index
        self.request = request
        self.stream = stream
        self.intended = intended
        self.measured = measured
        self.planned_prompt = planned_prompt
        self.planned_output = planned_output
        self.issued = 0.0
        self.end = 0.0
        self.first = -1.0
        self.status = 0
        self.error: str | None = None
        self.chunks = 0
        self.gaps: list[float] | None = None
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.cached_tokens: int | None = None
        """Prompt tokens the server's prefix cache served (when its ``usage`` says)."""
        self.text = ""
        """The answer of a non-streamed response without ``usage`` (to count its tokens)."""
        self.items: int | None = None
        """Vectors or scored documents in a pooling answer."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        """Time to the first content chunk (streamed responses only)."""
        return self.first - self.issued if self.first >= 0 else None

    @property
    def e2e(self) -> float:
        return self.end - self.issued


def _connect_error_kind(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection_refused"
    if isinstance(exc, TimeoutError):
        return "connect_timeout"
    if isinstance(exc, ssl.SSLError):
        return "tls_error"
    if isinstance(exc, socket.gaierror):
        return "dns_error"
    if isinstance(exc, OSError) and exc.errno is not None:
        return f"connect_error {errno.errorcode.get(exc.errno, exc.errno)}"
    return "connect_error"


class _Conn(asyncio.Protocol):
    """One keep-alive connection, one request at a time; httptools calls the ``on_*``
    methods while ``data_received`` feeds it."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: Any = None
        self.alive = False
        self.call: Call | None = None
        self.tracker: SseTracker | None = None
        self.sse = False
        self.parts: list[bytes] = []
        self.pending: list[bytes] = []
        self.event_stream = False
        self.now = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.alive = True
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        self.transport = None
        if self.call is not None:
            started = self.tracker is not None and self.tracker.chunks > 0
            self._finish("stream_interrupted" if started else "connection_closed")

    def data_received(self, data: bytes) -> None:
        self.now = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.call is not None:
                self._finish("bad_response")
            self.close()
            return
        if self.pending:
            self._flush()

    def _flush(self) -> None:
        """Hand the stream bytes of this read to the tracker in one piece (HTTP chunks often
        hold one event each: one call per read instead of one per event)."""
        pending = self.pending
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        if self.tracker is not None:
            self.tracker.feed(data, self.now)

    # -- httptools
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 12 and name.lower() == b"content-type":
            self.event_stream = value.startswith(b"text/event-stream")

    def on_headers_complete(self) -> None:
        call = self.call
        if call is None:
            return
        call.status = self.parser.get_status_code()
        self.sse = call.status == 200 and self.event_stream
        if self.sse:
            self.tracker = SseTracker()

    def on_body(self, body: bytes) -> None:
        if self.sse:
            self.pending.append(body)
        elif self.call is not None:
            self.parts.append(body)

    def on_message_complete(self) -> None:
        if self.call is None:
            return
        if self.pending:
            self._flush()
        self._finish(None, self.parser.should_keep_alive())

    # -- requests
    def send(self, call: Call) -> None:
        self.call = call
        self.tracker = None
        self.sse = self.event_stream = False
        self.parts = []
        self.timer = self.pool.loop.call_later(self.pool.timeout, self._timeout)
        self.transport.write(call.request)

    def _timeout(self) -> None:
        self.timer = None
        if self.call is not None:
            self._finish("timeout")
        self.close()

    def close(self) -> None:
        self.alive = False
        if self.transport is not None:
            self.transport.close()

    def _finish(self, error: str | None, reusable: bool = False) -> None:
        """End the call in flight: ``error`` is a transport-level failure (None when the
        response arrived whole, which may still be an error response); ``reusable`` when the
        connection may carry the next request."""
        call = self.call
        assert call is not None
        self.call = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        call.end = self.now if error is None else time.perf_counter()
        tracker = self.tracker
        if tracker is not None:
            call.first = tracker.first
            call.chunks = tracker.chunks
            call.gaps = tracker.gaps
            call.prompt_tokens = tracker.prompt_tokens
            call.completion_tokens = tracker.completion_tokens
            call.cached_tokens = tracker.cached_tokens
            if error is None:
                if tracker.error is not None:
                    error = tracker.error
                elif not tracker.done:
                    error = "stream_incomplete"
                elif tracker.chunks == 0 and tracker.bad_events:
                    error = "bad_response"
        elif error is None:
            body = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
            if call.status != 200:
                error = http_error_kind(call.status, body)
            else:
                resp = parse_response(body)
                if resp is None:
                    error = "bad_response"
                else:
                    call.text = resp.text if resp.completion_tokens is None else ""
                    call.prompt_tokens = resp.prompt_tokens
                    call.completion_tokens = resp.completion_tokens
                    call.cached_tokens = resp.cached_tokens
                    call.items = resp.items
        call.error = error
        self.parts = []
        self.pending.clear()
        self.tracker = None
        if reusable and self.alive:
            self.pool.idle.append(self)  # an HTTP error response leaves the connection usable
        else:
            self.close()
        self.pool.done(call)


class Pool:
    """Keep-alive connections to one endpoint, opened as needed and reused (LIFO).
    ``submit(call)`` sends at once on an idle connection, else opens one; ``on_done(call)`` is
    called once per call, from the event loop, when it has ended either way."""

    def __init__(
        self,
        endpoint: Endpoint,
        on_done: Callable[[Call], None],
        *,
        timeout: float,
        verify_tls: bool = True,
    ) -> None:
        self.endpoint = endpoint
        self.on_done = on_done
        self.timeout = timeout
        self.loop = asyncio.get_running_loop()
        self.idle: list[_Conn] = []
        self.busy = 0
        self.opened = 0
        self._connecting: set[asyncio.Task[None]] = set()
        self._all: list[_Conn] = []
        self.ssl: ssl.SSLContext | None = None
        if endpoint.scheme == "https":
            self.ssl = ssl.create_default_context()
            if not verify_tls:
                self.ssl.check_hostname = False
                self.ssl.verify_mode = ssl.CERT_NONE

    @property
    def in_flight(self) -> int:
        return self.busy

    def submit(self, call: Call) -> None:
        call.issued = time.perf_counter()
        self.busy += 1
        idle = self.idle
        while idle:
            conn = idle.pop()
            if conn.alive:
                conn.send(call)
                return
        task = self.loop.create_task(self._open(call))
        self._connecting.add(task)
        task.add_done_callback(self._connecting.discard)

    async def _open(self, call: Call) -> None:
        ep = self.endpoint
        try:
            async with asyncio.timeout(self.timeout):
                _, conn = await self.loop.create_connection(
                    lambda: _Conn(self),
                    ep.host,
                    ep.port,
                    ssl=self.ssl,
                    server_hostname=ep.host if self.ssl else None,
                )
        except (OSError, TimeoutError) as exc:
            call.end = time.perf_counter()
            call.error = _connect_error_kind(exc)
            self.done(call)
            return
        except asyncio.CancelledError:
            call.end = time.perf_counter()
            call.error = "aborted"
            self.done(call)
            raise
        self.opened += 1
        self._all.append(conn)
        if len(self._all) > 4 * (self.busy + len(self.idle)) + 64:
            self._all = [c for c in self._all if c.alive]
        conn.send(call)

    def done(self, call: Call) -> None:
        self.busy -= 1
        self.on_done(call)

    def abort(self) -> None:
        """End every call in flight now (as ``aborted``) and close every connection."""
        for task in list(self._connecting):
            task.cancel()
        for conn in self._all:
            if conn.call is not None:
                conn._finish("aborted")
            conn.close()
        self.idle.clear()

    def close(self) -> None:
        for conn in self._all:
            conn.close()
        self.idle.clear()
        self._all.clear()
