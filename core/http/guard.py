"""Connections that cannot starve the gateway: slow clients (slowloris) and oversized
headers are cut off while they are read, and open connections are capped.

uvicorn's HTTP protocol arms its keep-alive timer only after a response, so a connection
that trickles a header line every few seconds is held forever, and headers are only
measured once parsed. :func:`guarded_protocol` returns its httptools protocol with:

- a **header timeout**: the request line and headers must arrive within ``header_timeout_s``
  of the connection opening (or of the previous response, on a kept-alive connection);
  otherwise 408 and close;
- a **header size limit** enforced on the bytes as they come: more than
  ``max_header_bytes`` (plus 8 KiB for the request line) before the headers end gets 431
  and close, before any of it is parsed into a request;
- a **body timeout**: a request body that stops arriving for ``body_timeout_s`` (while
  the gateway is ready to read it) closes the connection;
- a **connection cap**: at ``max_connections`` open connections, a new one makes room by
  closing the connection that has waited longest in its headers (a slow client, by
  definition), or, when every connection is past its headers (real work), is answered 503
  and closed, so the process never runs out of file descriptors and normal clients keep
  getting in.

Errors are OpenAI-style JSON bodies, as everywhere else.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from shuniu.core.config import GatewayConfig
from shuniu.core.errors import GatewayError

__all__ = ["guarded_protocol"]

_REQUEST_LINE_ALLOWANCE = 8192
_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


def _error_response(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response carrying the gateway's OpenAI-style error body."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = GatewayError(status, message, type=kind, code=code).body()
    head = (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"connection: close\r\n" % (status, _REASONS[status], len(body))
    )
    if status == 503:
        head += b"retry-after: 1\r\n"
    return head + b"\r\n" + body


class _Guarded(HttpToolsProtocol):
    """uvicorn's httptools protocol with the guards above (limits set by the subclass
    :func:`guarded_protocol` makes)."""

    header_timeout_s = 10.0
    body_timeout_s = 30.0
    max_header_bytes = 32 * 1024
    max_connections = 4096

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_headers = True
        self._idle_since: float | None = None
        """When the last response ended, while the connection waits for its next request."""
        self._header_bytes = 0
        self._tail = b""
        """The last bytes of the previous read (a header terminator may span two reads)."""
        self._waiting_since = 0.0
        self._guard: asyncio.TimerHandle | None = None

    # -- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_guard()
        super().connection_lost(exc)

    def _make_room(self) -> None:
        """Close the connection that has waited longest in its headers; else the one idle
        longest between requests (its client reconnects); else refuse this one."""
        slowest: _Guarded | None = None
        idlest: _Guarded | None = None
        for conn in self.connections:
            if conn is self or not isinstance(conn, _Guarded):
                continue
            if conn._in_headers:
                if slowest is None or conn._waiting_since < slowest._waiting_since:
                    slowest = conn
            elif conn._idle_since is not None:
                if idlest is None or conn._idle_since < (idlest._idle_since or 0.0):
                    idlest = conn
        if slowest is not None:
            slowest._refuse(408, "The request headers did not arrive in time.", "header_timeout")
        elif idlest is not None:
            idlest.transport.close()
        else:
            message = "The gateway has too many open connections; retry shortly."
            self._refuse(503, message, "too_many_connections")

    # -- headers -------------------------------------------------------------------------

    def _await_headers(self) -> None:
        self._in_headers = True
        self._header_bytes = 0
        self._tail = b""
        self._waiting_since = self.loop.time()
        self._arm(self.header_timeout_s, self._header_timeout)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._idle_since = self.loop.time()

    def data_received(self, data: bytes) -> None:
        self._idle_since = None
        if (
            self._in_headers
            and self._header_bytes + len(data) > self.max_header_bytes + _REQUEST_LINE_ALLOWANCE
        ):
            # Only what comes before the blank line that ends the headers counts: a read may
            # hold the end of the headers and the start of a large body.
            end = (self._tail + data).find(b"\r\n\r\n")
            head = self._header_bytes + (end + 4 - len(self._tail) if end >= 0 else len(data))
            if head > self.max_header_bytes + _REQUEST_LINE_ALLOWANCE:
                limit = self.max_header_bytes
                message = f"The request headers are larger than this gateway accepts ({limit} bytes)."
                self._refuse(431, message, "headers_too_large")
                return
        if self._in_headers:
            self._header_bytes += len(data)
            self._tail = data[-3:]
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_headers:  # the next request on a kept-alive connection
            self._await_headers()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._cancel_guard()
        super().on_headers_complete()
        if self._expects_body():
            self._arm(self.body_timeout_s, self._body_timeout)

    def _header_timeout(self) -> None:
        self._guard = None
        if self._in_headers and not self.transport.is_closing():
            self._refuse(408, "The request headers did not arrive in time.", "header_timeout")

    # -- body ----------------------------------------------------------------------------

    def _expects_body(self) -> bool:
        for name, value in self.headers:
            if name == b"content-length":
                return value.strip() not in (b"", b"0")
            if name == b"transfer-encoding":
                return True
        return False

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self._guard is not None:
            self._arm(self.body_timeout_s, self._body_timeout)

    def on_message_complete(self) -> None:
        self._cancel_guard()
        super().on_message_complete()

    def _body_timeout(self) -> None:
        self._guard = None
        if self.transport.is_closing():
            return
        if self.flow is not None and self.flow.read_paused:
            # The gateway stopped reading (it has enough buffered): the client is not late.
            self._arm(self.body_timeout_s, self._body_timeout)
            return
        self.transport.close()

    # -- helpers -------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Any) -> None:
        self._cancel_guard()
        self._guard = self.loop.call_later(delay, callback)

    def _cancel_guard(self) -> None:
        if self._guard is not None:
            self._guard.cancel()
            self._guard = None

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer a connection the application has not seen yet, and close it."""
        self._cancel_guard()
        self._in_headers = False
        if not self.transport.is_closing():
            self.transport.write(_error_response(status, message, code))
            self.transport.close()


def guarded_protocol(cfg: GatewayConfig) -> type[HttpToolsProtocol]:
    """The HTTP protocol class for uvicorn, with ``cfg``'s limits."""
    return type(
        "GuardedHttpToolsProtocol",
        (_Guarded,),
        {
            "header_timeout_s": cfg.header_timeout_s,
            "body_timeout_s": cfg.body_timeout_s,
            "max_header_bytes": cfg.max_header_bytes,
            "max_connections": cfg.max_connections,
        },
    )
