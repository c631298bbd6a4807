"""An "instant" OpenAI-compatible upstream for measuring gateway overhead.

It answers as fast as a Python process can, so that what a benchmark sees is the cost of
whatever sits in front of it. It is a raw :class:`asyncio.Protocol` on uvloop with
``httptools`` parsing, HTTP/1.1 keep-alive (and pipelining), and responses built from
cached byte templates: a repeated request body costs one dict lookup, one counter and a few
byte concatenations, with no JSON work at all.

Routes:

* ``POST /v1/chat/completions`` and ``POST /v1/completions``: non-streamed, a complete
  OpenAI JSON body with ``usage``; streamed (``"stream": true``), ``Transfer-Encoding:
  chunked`` SSE exactly as OpenAI sends it: a role chunk (chat only), one content chunk per
  token, a finish chunk, a usage chunk when ``stream_options.include_usage`` is set (every
  other chunk then carries ``"usage":null``), and ``data: [DONE]``. The number of tokens is
  the request's ``max_completion_tokens`` / ``max_tokens`` (finish reason ``length``), else
  ``--tokens`` (default 16, finish reason ``stop``), capped at 4096.
* ``POST /v1/embeddings``: one vector of ``--dim`` floats (default 1024) per input, as
  floats or, with ``"encoding_format": "base64"``, packed; ``usage.prompt_tokens`` as below.
* ``GET /v1/models``: the model list; ``GET /health``: ``{"status":"ok"}``.

``--hold-s S`` holds every stream open: its head and first two events (the role chunk and
one token) go out at once, the rest ``S`` seconds later (for ``benchmarks/open_streams.py``).

``prompt_tokens`` is an estimate (a quarter of the prompt's characters, at least 1): the
upstream does no tokenizing. Every event of a stream is written with one ``write`` call, as
an engine that had all tokens ready would send them.

Run it: ``python benchmarks/instant_upstream.py --port 9000`` (``--port 0`` picks a free
port). It prints ``instant-upstream serving on http://HOST:PORT`` when it listens.
Import it: ``await start_server(host, port)`` returns the :class:`asyncio.Server`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import struct
import sys
import time
from typing import Any

import httptools
import msgspec
from harness import set_nodelay

__all__ = ["DEFAULT_TOKENS", "MAX_TOKENS", "UpstreamProtocol", "build_response", "main", "start_server"]

DEFAULT_TOKENS = 16
MAX_TOKENS = 4096
DIM = 1024
"""Floats per embedding vector (``--dim``)."""
HOLD_S = 0.0
"""Seconds a stream is held open after its first two events (``--hold-s``); 0: none."""
_CACHE_LIMIT = 512
_ID_DIGITS = 16  # the response id's counter part; fixed width, so templates keep their lengths
_ID_PLACEHOLDER = b"@" * _ID_DIGITS
_TOKEN = "tok"  # every token's text; one token = one streamed content chunk

_encode = msgspec.json.Encoder().encode


class _StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _Message(msgspec.Struct):
    content: Any = None


class _Body(msgspec.Struct):
    model: str = "instant"
    stream: bool = False
    stream_options: _StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    messages: list[_Message] | None = None
    prompt: Any = None
    input: Any = None
    encoding_format: str | None = None


_decode_body = msgspec.json.Decoder(_Body).decode


def _http(status: str, ctype: bytes, body: bytes, *, close: bool = False) -> bytes:
    head = b"HTTP/1.1 " + status.encode() + b"\r\ncontent-type: " + ctype
    head += b"\r\ncontent-length: " + str(len(body)).encode()
    if close:
        head += b"\r\nconnection: close"
    return head + b"\r\n\r\n" + body


def _error(status: str, message: str, type_: str, code: str, *, close: bool = False) -> bytes:
    body = _encode({"error": {"message": message, "type": type_, "param": None, "code": code}})
    return _http(status, b"application/json", body, close=close)


_STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)


def _chunked(event: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk."""
    return b"%x\r\n%b\r\n" % (len(event), event)


def _prompt_tokens(body: _Body) -> int:
    chars = 0
    if body.messages:
        for m in body.messages:
            c = m.content
            if isinstance(c, str):
                chars += len(c)
            elif isinstance(c, list):
                for part in c:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        chars += len(part["text"])
    elif isinstance(body.prompt, str):
        chars = len(body.prompt)
    elif isinstance(body.prompt, list):
        return max(1, len(body.prompt))
    return max(1, chars // 4)


def build_response(api: str, raw: bytes, created: int | None = None) -> tuple[bytes, bool]:
    """The whole HTTP response (with ``_ID_PLACEHOLDER`` where the id goes) for one request
    body, and whether the id must be filled in. Raises ``ValueError`` on a bad body."""
    try:
        body = _decode_body(raw)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(str(exc)) from None
    if api == "embeddings":
        return _embeddings(body), False
    if api == "chat" and not body.messages:
        raise ValueError("'messages' must be a non-empty list")
    if api == "completions" and body.prompt is None:
        raise ValueError("'prompt' is required")
    wanted = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    n = min(MAX_TOKENS, max(1, wanted)) if wanted is not None else DEFAULT_TOKENS
    finish = "length" if wanted is not None else "stop"
    prompt = _prompt_tokens(body)
    usage = b'{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (prompt, n, prompt + n)
    created = int(time.time()) if created is None else created
    chat = api == "chat"
    rid = (b"chatcmpl-" if chat else b"cmpl-") + _ID_PLACEHOLDER
    model = _encode(body.model)
    if not body.stream:
        text = _encode(_TOKEN * n)
        if chat:
            choice = (
                b'{"index":0,"message":{"role":"assistant","content":' + text + b',"refusal":null},'
                b'"logprobs":null,"finish_reason":"' + finish.encode() + b'"}'
            )
            obj = b"chat.completion"
        else:
            choice = b'{"index":0,"text":' + text + b',"logprobs":null,"finish_reason":"'
            choice += finish.encode() + b'"}'
            obj = b"text_completion"
        payload = b'{"id":"' + rid + b'","object":"' + obj + b'","created":%d,"model":' % created + model
        payload += b',"system_fingerprint":null,"choices":[' + choice + b'],"usage":' + usage + b"}"
        return _http("200 OK", b"application/json", payload), True

    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    usage_null = b',"usage":null' if include_usage else b""
    obj = b"chat.completion.chunk" if chat else b"text_completion"
    base = b'data: {"id":"' + rid + b'","object":"' + obj + b'","created":%d,"model":' % created + model
    if chat:
        base += b',"system_fingerprint":null'
    events = []
    if chat:
        events.append(
            base + b',"choices":[{"index":0,"delta":{"role":"assistant","content":"","refusal":null},'
            b'"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"
        )
        content = (
            base + b',"choices":[{"index":0,"delta":{"content":"' + _TOKEN.encode() + b'"},'
            b'"logprobs":null,"finish_reason":null}]' + usage_null + b"}\n\n"
        )
        last = (
            base
            + b',"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"'
            + finish.encode()
            + b'"}]'
            + usage_null
            + b"}\n\n"
        )
    else:
        content = (
            base + b',"choices":[{"index":0,"text":"' + _TOKEN.encode() + b'","logprobs":null,'
            b'"finish_reason":null}]' + usage_null + b"}\n\n"
        )
        last = (
            base
            + b',"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"'
            + finish.encode()
            + b'"}]'
            + usage_null
            + b"}\n\n"
        )
    events.extend([content] * n)
    events.append(last)
    if include_usage:
        events.append(base + b',"choices":[],"usage":' + usage + b"}\n\n")
    events.append(b"data: [DONE]\n\n")
    return _STREAM_HEAD + b"".join(map(_chunked, events)) + b"0\r\n\r\n", True


def _embeddings(body: _Body) -> bytes:
    inputs = body.input if isinstance(body.input, list) else [body.input]
    if not inputs or inputs[0] is None:
        raise ValueError("'input' is required")
    if isinstance(inputs[0], int):
        inputs = [inputs]
    if body.encoding_format == "base64":
        vector = b'"' + base64.b64encode(struct.pack(f"<{DIM}f", *([0.03125] * DIM))) + b'"'
    else:
        vector = b"[" + b",".join([b"0.03125"] * DIM) + b"]"
    items = b",".join(
        b'{"object":"embedding","index":%d,"embedding":' % i + vector + b"}" for i in range(len(inputs))
    )
    chars = sum(len(t) if isinstance(t, str) else 4 * len(t) for t in inputs)
    tokens = max(1, chars // 4)
    payload = b'{"object":"list","data":[' + items + b'],"model":' + _encode(body.model)
    payload += b',"usage":{"prompt_tokens":%d,"total_tokens":%d}}' % (tokens, tokens)
    return _http("200 OK", b"application/json", payload)


_ROUTES = {
    b"/v1/chat/completions": "chat",
    b"/v1/completions": "completions",
    b"/v1/embeddings": "embeddings",
}
_counter = itertools.count(1)
_cache: dict[tuple[str, bytes], tuple[bytes, bool]] = {}
_HEALTH = _http("200 OK", b"application/json", b'{"status":"ok"}')


def _models_response() -> bytes:
    body = _encode(
        {
            "object": "list",
            "data": [{"id": "bench", "object": "model", "created": int(time.time()), "owned_by": "instant"}],
        }
    )
    return _http("200 OK", b"application/json", body)


_MODELS = _models_response()


class UpstreamProtocol(asyncio.Protocol):
    """One client connection."""

    __slots__ = ("_body", "_parser", "_transport", "_url")

    def __init__(self) -> None:
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        set_nodelay(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reply(
                _error(
                    "400 Bad Request",
                    "Upgrades are not supported.",
                    "invalid_request_error",
                    "bad_request",
                    close=True,
                ),
                close=True,
            )
        except httptools.HttpParserError:
            self._reply(
                _error(
                    "400 Bad Request",
                    "Malformed HTTP request.",
                    "invalid_request_error",
                    "bad_request",
                    close=True,
                ),
                close=True,
            )

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._url = b""
        self._body.clear()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        close = not self._parser.should_keep_alive()
        url = self._url
        q = url.find(b"?")
        path = url if q < 0 else url[:q]
        method = self._parser.get_method()
        api = _ROUTES.get(path)
        if api is not None:
            if method != b"POST":
                self._reply(
                    _error(
                        "405 Method Not Allowed", "Use POST.", "invalid_request_error", "method_not_allowed"
                    ),
                    close,
                )
                return
            raw = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            key = (api, raw)
            hit = _cache.get(key)
            if hit is None:
                try:
                    hit = build_response(api, raw)
                except ValueError as exc:
                    self._reply(
                        _error(
                            "400 Bad Request",
                            f"Bad request body: {exc}",
                            "invalid_request_error",
                            "invalid_value",
                        ),
                        close,
                    )
                    return
                if len(_cache) >= _CACHE_LIMIT:
                    _cache.clear()
                _cache[key] = hit
            response, has_id = hit
            if has_id:
                response = response.replace(_ID_PLACEHOLDER, b"%016x" % next(_counter))
            if HOLD_S and response.startswith(_STREAM_HEAD):
                self._hold(response, close)
                return
            self._reply(response, close)
        elif path == b"/v1/models" and method == b"GET":
            self._reply(_MODELS, close)
        elif path == b"/health" and method == b"GET":
            self._reply(_HEALTH, close)
        else:
            self._reply(
                _error(
                    "404 Not Found",
                    f"Unknown route {method.decode()} {path.decode('latin-1')}",
                    "invalid_request_error",
                    "not_found",
                ),
                close,
            )

    def _hold(self, response: bytes, close: bool) -> None:
        """Send the head and the first two events now, the rest after ``HOLD_S``."""
        cut = len(_STREAM_HEAD)
        for _ in range(2):
            end = response.find(b"\n\n\r\n", cut)
            if end < 0:
                break
            cut = end + 4
        t = self._transport
        if t is None:
            return
        t.write(response[:cut])
        asyncio.get_running_loop().call_later(HOLD_S, self._reply, response[cut:], close)

    def _reply(self, data: bytes, close: bool) -> None:
        t = self._transport
        if t is None:
            return
        t.write(data)
        if close:
            t.close()
            self._transport = None


async def start_server(host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    """Listen on ``host:port`` (0: a free port) and return the server."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(UpstreamProtocol, host, port, backlog=2048, reuse_address=True)


def main(argv: list[str] | None = None) -> None:
    global DEFAULT_TOKENS, DIM, HOLD_S
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000, help="0 picks a free port (default 9000)")
    parser.add_argument(
        "--tokens", type=int, default=DEFAULT_TOKENS, help="tokens when a request sets no max_tokens"
    )
    parser.add_argument("--dim", type=int, default=DIM, help="floats per embedding vector")
    parser.add_argument("--hold-s", type=float, default=0.0, help="hold each stream open this long")
    args = parser.parse_args(argv)
    HOLD_S = max(0.0, args.hold_s)
    DEFAULT_TOKENS = max(1, min(MAX_TOKENS, args.tokens))
    DIM = max(1, args.dim)

    async def run() -> None:
        server = await start_server(args.host, args.port)
        port = server.sockets[0].getsockname()[1]
        shown = f"[{args.host}]" if ":" in args.host else args.host
        print(f"instant-upstream serving on http://{shown}:{port}", flush=True)
        async with server:
            await server.serve_forever()

    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency of shuniu
        runner = asyncio.run
    else:
        runner = uvloop.run
    try:
        runner(run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    sys.exit(main())
