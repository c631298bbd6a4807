"""How engine failures become the gateway's errors, the same for every HTTP backend.

Before the first byte: 503 when the backend is not started, 504 when the engine timed out,
502 when it cannot be reached or answered a 5xx, and the engine's own 4xx passed on as the
client's error (:func:`openai_error` for OpenAI-style bodies). After the first byte
(:data:`STREAM_BREAKS`): 504 for a timeout, 502 for a broken stream. Probe failures are
:class:`ProbeError` with a one-line detail (:func:`describe_error`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import msgspec

from shuniu.backends.http.h1 import H1Pool, H1Response
from shuniu.backends.http.sse import OversizedEvent
from shuniu.core.errors import GatewayError, protocol_error, upstream_error

__all__ = [
    "PROBE_ERRORS",
    "STREAM_BREAKS",
    "ProbeError",
    "describe_error",
    "openai_error",
    "post_or_raise",
    "read_whole",
    "stream_broken",
]


class ProbeError(RuntimeError):
    """A health, metadata or metrics probe got an answer it cannot use (a non-200 status,
    a body of the wrong shape)."""


PROBE_ERRORS = (aiohttp.ClientError, TimeoutError, OSError, msgspec.DecodeError)
"""What a probe's transport and decoding can raise (besides :class:`ProbeError`)."""


def describe_error(exc: BaseException) -> str:
    """An exception as a health detail: its type, and its message when it has one (a
    TimeoutError has none)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


STREAM_BREAKS = (
    aiohttp.ClientPayloadError,
    aiohttp.ClientConnectionError,
    asyncio.IncompleteReadError,
    TimeoutError,
)
"""What reading an engine's stream can raise when the engine or the network fails mid-way."""


def stream_broken(name: str, exc: BaseException) -> GatewayError:
    """One of :data:`STREAM_BREAKS` as the gateway's error. A timeout is checked first:
    aiohttp's read timeouts are connection errors too, and a timeout is a 504."""
    if isinstance(exc, TimeoutError):
        return upstream_error(f"The engine endpoint {name} timed out mid-stream.", 504)
    if isinstance(exc, OversizedEvent):
        return protocol_error(f"The engine endpoint {name} sent {exc}.")
    return upstream_error(f"The engine endpoint {name} broke off the stream ({type(exc).__name__}).")


async def post_or_raise(
    session: aiohttp.ClientSession | H1Pool | None,
    url: str,
    payload: bytes,
    headers: dict[str, str],
    name: str,
    error: Callable[[int, bytes], GatewayError],
) -> aiohttp.ClientResponse | H1Response:
    """POST to an engine and return its 200 response (the caller reads and releases it), or
    raise the gateway's error: 503 not started, 504 timeout, 502 unreachable, and
    ``error(status, body)`` for any other status."""
    if session is None:
        raise upstream_error(f"The engine endpoint {name} is not started.", 503)
    try:
        resp = await session.post(url, data=payload, headers=headers)
    except TimeoutError:
        # Before OSError: on 3.11 TimeoutError is an OSError, and a timeout is not "unreachable".
        raise upstream_error(f"The engine endpoint {name} timed out.", 504) from None
    except (aiohttp.ClientConnectionError, OSError) as exc:
        raise upstream_error(f"Cannot reach the engine endpoint {name} ({type(exc).__name__}).") from None
    if resp.status != 200:
        try:
            raw = await resp.read()
        finally:
            resp.release()
        raise error(resp.status, raw)
    return resp


async def read_whole(resp: aiohttp.ClientResponse | H1Response, name: str) -> bytes:
    """The rest of a non-streamed answer (the connection goes back to the pool), or 504 /
    502 when the engine fails while sending it."""
    try:
        return await resp.read()
    except TimeoutError:
        raise upstream_error(f"The engine endpoint {name} timed out.", 504) from None
    except aiohttp.ClientError as exc:
        raise upstream_error(
            f"The engine endpoint {name} failed mid-response ({type(exc).__name__})."
        ) from None
    finally:
        resp.release()


class _ErrorBody(msgspec.Struct):
    error: dict[str, Any] | str | None = None
    message: str | None = None


_decode_error = msgspec.json.Decoder(_ErrorBody).decode


def openai_error(name: str, status: int, raw: bytes) -> GatewayError:
    """A non-200 answer of an OpenAI-compatible server as the gateway's error: the client's
    own mistake as the engine saw it (a 4xx, e.g. context too long) keeps its status, type,
    param and code; anything else is a 502 naming the endpoint."""
    message = raw[:500].decode("utf-8", "replace")
    err: dict[str, Any] = {}
    try:
        parsed = _decode_error(raw)
        if isinstance(parsed.error, dict):
            err = parsed.error
            message = str(err.get("message", message))
        elif isinstance(parsed.error, str):
            message = parsed.error
        elif parsed.message:
            message = parsed.message
    except msgspec.DecodeError:
        pass
    if 400 <= status < 500 and status not in (401, 403, 408, 429):
        return GatewayError(
            status,
            message,
            type=str(err.get("type") or "invalid_request_error"),
            param=err.get("param") if isinstance(err.get("param"), str) else None,
            code=str(err["code"]) if err.get("code") is not None else None,
        )
    return upstream_error(f"The engine endpoint {name} answered HTTP {status}: {message}")
