"""Small raw-ASGI helpers for the hot path: headers, body reading, JSON responses."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

from shuniu.core.errors import GatewayError, bad_request, payload_too_large

__all__ = [
    "LENGTH_KEY",
    "Receive",
    "Scope",
    "Send",
    "header",
    "header_map",
    "header_value",
    "new_request_id",
    "read_body",
    "request_id_from",
    "send_error",
    "send_json",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = (b"content-type", b"application/json")
_MAX_ID = 128

LENGTH_KEY = "shuniu.length"
"""Key of an ``http.response.start`` message by which the gateway vouches for its headers:
every name lowercase, none ``transfer-encoding`` or ``connection``, no CR or LF in any name
or value; its value is the body's length in bytes (its ``content-length`` header says the
same), or ``-1`` for a body of unknown length (sent chunked). The head is then written as it
is, without the scans that guard other applications' headers. Other servers ignore the key;
a message without it is checked in full."""


def header_value(text: str) -> bytes:
    """``text`` as the value of a response header that the request path writes from names it
    was given (a model's, a tenant's), with any CR and LF left out: the path vouches that its
    headers hold none (:data:`LENGTH_KEY`)."""
    if "\r" in text or "\n" in text:  # (on the str: ``b"\r" in value`` first tries an int, and raises)
        text = text.replace("\r", "").replace("\n", "")
    return text.encode()


def header(scope: Scope, name: bytes) -> bytes | None:
    """First value of a (lower-case) request header."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def header_map(headers: Sequence[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """Each header's first value by its (lower-case) name: made once per request, so that
    each later look-up is one dict access instead of a walk over every header (an SDK
    sends a dozen or more)."""
    return dict(reversed(headers))


_prefix = os.urandom(4).hex()
_counter = 0


def new_request_id(scope: Scope) -> str:
    """The client's ``x-request-id`` when it is sane, else a fresh process-unique id."""
    return request_id_from(header(scope, b"x-request-id"))


def request_id_from(given: bytes | None) -> str:
    """:func:`new_request_id` from the client's ``x-request-id`` value (``None``: none)."""
    if given is not None and 0 < len(given) <= _MAX_ID and given.isascii():
        text = given.decode("ascii")
        if text.isprintable() and " " not in text:
            return text
    global _counter
    _counter += 1
    # str(), not an f-string with a format spec, which compiled code runs as str.format.
    return _prefix + str(_counter)


async def read_body(
    scope: Scope, receive: Receive, limit: int, headers: Mapping[bytes, bytes] | None = None
) -> bytes:
    """The whole request body, or a 413 as soon as it is known to exceed ``limit``.
    ``headers``: the request's :func:`header_map`, when the caller has made it."""
    length = header(scope, b"content-length") if headers is None else headers.get(b"content-length")
    if length is not None:
        try:
            declared = int(length)
        except ValueError:
            raise bad_request("Invalid Content-Length header.") from None
        if declared > limit:
            raise payload_too_large(limit)
    message = await receive()
    body = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise payload_too_large(limit)
        return body
    parts = [body]
    size = len(body)
    while message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            raise bad_request("The client closed the connection before sending the whole body.")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise payload_too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


async def send_json(
    send: Send,
    status: int,
    body: bytes,
    request_id: str,
    extra_headers: dict[str, str] | None = None,
    raw_headers: list[tuple[bytes, bytes]] | None = None,
    own: bool = False,
) -> None:
    """A whole JSON response. ``raw_headers`` are added as they are (already encoded).
    ``own``: every header is the gateway's own (constants, numbers, the request id; not a
    plugin's error headers), so the start message vouches for them (``shuniu.length``:
    shuniu's HTTP protocol then writes them without scanning them)."""
    headers = [
        _JSON,
        (b"content-length", str(len(body)).encode()),
        (b"x-request-id", request_id.encode()),
    ]
    if extra_headers:
        headers.extend((k.encode(), v.encode()) for k, v in extra_headers.items())
    if raw_headers:
        headers.extend(raw_headers)
    start: dict[str, object] = {"type": "http.response.start", "status": status, "headers": headers}
    if own and not extra_headers:
        start[LENGTH_KEY] = len(body)
    await send(start)
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_error(
    send: Send,
    err: GatewayError,
    request_id: str,
    raw_headers: list[tuple[bytes, bytes]] | None = None,
    render: Callable[[GatewayError], bytes] | None = None,
) -> None:
    """An error response: OpenAI's shape, or what ``render`` writes (another API's wire
    format); ``raw_headers`` are added unless the error sets the same name."""
    if raw_headers and err.headers:
        raw_headers = [(k, v) for k, v in raw_headers if k.decode() not in err.headers]
    body = err.body() if render is None else render(err)
    await send_json(send, err.status, body, request_id, err.headers, raw_headers)
