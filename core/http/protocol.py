"""The gateway's HTTP/1.1 connections: httptools parsing, ASGI 3 to the app, and guards
against slow and oversized clients, in one lean protocol that uvicorn's server runs.

Why not uvicorn's own httptools protocol: per request it armed and cancelled a keep-alive
timer (and the guards two more), created an ``asyncio.Event``, checked every response
header with two regular expressions and wrote the head and the body of a response in two
system calls; and an application could only learn that its client went away by keeping a
second task blocked in ``receive()``, cancelled at the end of every request. Here:

- **one write per response** when the body is known at once (the head is held until the
  first body message; a stream's head goes out with its first event), and a chunked
  stream's framing joins its data in the same write;
- **no timer per request**: the guards are checked by one sweep per server, every quarter
  of the shortest timeout (at most once a second), over the connections' phase and the
  time it started;
- ``receive()`` returns at once when the body is already here (the usual case: a small
  request body arrives with its headers);
- **a vouched head**: the gateway's own responses (their headers are constants, numbers and
  the sanitised request id) say so, with their body's length, in the start message
  (:data:`LENGTH_KEY`), and their head is written without the scans that guard an
  application's headers (a CR or LF inside a value, the framing headers found by name);
- **a disconnect callback** (ASGI extension ``shuniu.disconnect`` in the scope: a function
  that takes a callable and returns one that cancels the registration), so the request
  path watches its client without a task.

The guards (OWASP API4; ``gateway.*`` in the deployment):

- **header timeout**: the request line and headers must arrive within ``header_timeout_s``
  of the connection opening, or of the first byte of the next request on a kept-alive
  connection; otherwise 408 and close;
- **header size limit** on the bytes as they come: more than ``max_header_bytes`` (plus
  8 KiB for the request line) before the headers end gets 431 and close, before any of it
  is parsed into a request;
- **body timeout**: a request body that stops arriving for ``body_timeout_s`` while the
  gateway is ready to read it closes the connection;
- **keep-alive**: a connection idle between requests for ``keep_alive_s`` is closed;
- **connection cap**: at ``max_connections`` a new connection makes room by closing the
  connection that has waited longest in its headers (a slow client, by definition), else
  the longest idle one; when every connection is busy with real work it is answered 503.

Errors are OpenAI-style JSON bodies, as everywhere else.
"""

from __future__ import annotations

import asyncio
import http
import logging
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import unquote

import httptools
from uvicorn.protocols.utils import get_local_addr, get_remote_addr

from shuniu.core.config import GatewayConfig
from shuniu.core.errors import GatewayError
from shuniu.core.http.asgi import LENGTH_KEY

__all__ = ["DISCONNECT_EXTENSION", "GatewayProtocol", "gateway_protocol"]

log = logging.getLogger("shuniu.http")

DISCONNECT_EXTENSION = "shuniu.disconnect"
"""Scope extension: ``scope["extensions"][DISCONNECT_EXTENSION](callback)`` calls
``callback()`` once if the client goes away before the response is complete, and returns a
function that cancels the registration."""

_REQUEST_LINE_ALLOWANCE = 8192
_HIGH_WATER = 65536
"""Request body bytes buffered before reading pauses until the application takes them."""
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_STATUS_LINES = {s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in http.HTTPStatus}
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_TASK_NAME = "shuniu-request"
"""Each request's task's name: given, Python 3.11 does not format a ``Task-<n>`` for it."""
_JOIN_HEADER = b": ".join
"""``name: value`` of one header (mapped over a response's headers: no comprehension's frame
and no method look-up per header)."""
_DISCONNECT = {"type": "http.disconnect"}
# The ends of a vouched head (after its last header's value).
_END_HEAD = b"\r\n\r\n"
_CLOSE_HEAD = b"\r\nconnection: close\r\n\r\n"
_CHUNKED_HEAD = b"\r\ntransfer-encoding: chunked\r\n\r\n"
_CHUNKED_CLOSE_HEAD = b"\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n"

# Phases of a connection, for the guards.
_IDLE = 0  # between requests on a kept-alive connection (keep_alive_s)
_HEADERS = 1  # reading a request line and headers (header_timeout_s)
_BODY = 2  # reading a request body (body_timeout_s, while reading is not paused)
_BUSY = 3  # the application has the request: no timeout


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d \r\n" % status


def _error_response(status: int, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response carrying the gateway's OpenAI-style error body."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = GatewayError(status, message, type=kind, code=code).body()
    head = b"%scontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n" % (
        _status_line(status),
        len(body),
    )
    if status == 503:
        head += b"retry-after: 1\r\n"
    return head + b"\r\n" + body


class _Cycle:
    """One request and its response: the ``receive`` and ``send`` the application gets."""

    __slots__ = (
        "body",
        "chunked",
        "complete",
        "conn",
        "delivered",
        "disconnected",
        "expect_100",
        "head",
        "head_only",
        "keep_alive",
        "more_body",
        "on_gone",
        "remaining",
        "scope",
        "started",
        "waiter",
    )

    def __init__(
        self, conn: GatewayProtocol, scope: dict[str, Any], keep_alive: bool, expect_100: bool
    ) -> None:
        self.conn = conn
        self.scope = scope
        self.keep_alive = keep_alive
        self.expect_100 = expect_100
        self.body = b""
        self.more_body = True
        self.delivered = False
        """The whole body went to the application: ``receive`` now waits for the end."""
        self.waiter: asyncio.Future[None] | None = None
        self.disconnected = False
        self.started = False
        self.complete = False
        self.head: bytes | None = None
        """The response head, held until the first body message so both go in one write."""
        self.head_only = scope["method"] == "HEAD"
        self.chunked = False
        self.remaining = 0
        self.on_gone: list[Callable[[], Any]] | None = None

    # -- the application's side ----------------------------------------------------------

    async def receive(self) -> dict[str, Any]:
        conn = self.conn
        if self.expect_100:
            self.expect_100 = False
            if not conn.transport.is_closing():
                conn.transport.write(_CONTINUE)
        waits = self.delivered or (not self.body and self.more_body)
        if waits and not self.disconnected and not self.complete:
            conn.resume_reading()
            self.waiter = waiter = conn.loop.create_future()
            try:
                await waiter
            finally:
                self.waiter = None
        if self.disconnected or self.complete or self.delivered:
            return _DISCONNECT
        body, self.body = self.body, b""
        if not self.more_body:
            self.delivered = True
        return {"type": "http.request", "body": body, "more_body": self.more_body}

    async def send(self, message: dict[str, Any]) -> None:
        conn = self.conn
        if conn.write_paused and not self.disconnected:
            await conn.drain()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started:
            if kind != "http.response.start":
                raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{kind}'.")
            headers = message.get("headers", ())
            length = message.get(LENGTH_KEY)
            if length is None or self.head_only or not headers:
                self._start(message["status"], headers)
            else:
                self._start_vouched(message["status"], headers, length)
            self.started = True
            self.expect_100 = False
            return
        if self.complete:
            raise RuntimeError(f"Unexpected ASGI message '{kind}' sent, after response already completed.")
        if kind != "http.response.body":
            raise RuntimeError(f"Expected ASGI message 'http.response.body', but got '{kind}'.")
        body = message.get("body", b"")
        more = message.get("more_body", False)
        head, self.head = self.head, None
        if self.head_only:
            data = body = b""
        elif self.chunked:
            if body:
                data = b"%x\r\n%s\r\n%s" % (len(body), body, b"" if more else b"0\r\n\r\n")
            else:
                data = b"" if more else b"0\r\n\r\n"
        else:
            self.remaining -= len(body)
            if self.remaining < 0:
                raise RuntimeError("Response content longer than Content-Length")
            data = body
        if head is not None:
            data = head + data if data else head
        if data:
            conn.transport.write(data)
        if not more:
            if self.remaining and not self.head_only:
                raise RuntimeError("Response content shorter than Content-Length")
            self.complete = True
            self.on_gone = None
            self.wake()
            conn.response_complete(self)

    def _start(self, status: int, headers: Any) -> None:
        defaults = self.conn.server_state.default_headers
        if defaults:
            headers = [*defaults, *headers]
        parts = [_status_line(status)]
        length: int | None = None
        chunked = closing = False
        if headers:
            # One join per header, then every check over the whole block at C speed. Names
            # and values are the application's: a CR or LF inside one would let it write a
            # second response, so the block must hold exactly one line break per header;
            # then "\r\n<name>:" can only be the start of a header.
            block = b"\r\n".join(map(_JOIN_HEADER, headers))
            n = len(headers) - 1
            if block.count(b"\n") != n or block.count(b"\r") != n:
                raise RuntimeError("Invalid HTTP header name or value (CR or LF inside one).")
            parts += (block, b"\r\n")
            lower = b"\r\n" + block.lower()
            if (at := lower.find(b"\r\ncontent-length:")) >= 0:
                length = int(_value(lower, at + 17))
            if (at := lower.find(b"\r\ntransfer-encoding:")) >= 0:
                chunked = _value(lower, at + 20).strip() == b"chunked"
            if (at := lower.find(b"\r\nconnection:")) >= 0 and b"close" in _value(lower, at + 13):
                self.keep_alive = False
                closing = True
        if not self.keep_alive and not closing:
            parts.append(b"connection: close\r\n")
        if length is not None and not chunked:
            self.remaining = length
        elif not self.head_only and status not in (204, 304):
            if not chunked:
                parts.append(b"transfer-encoding: chunked\r\n")
            self.chunked = True
        parts.append(b"\r\n")
        self.head = b"".join(parts)

    def _start_vouched(self, status: int, headers: Any, length: int) -> None:
        """:meth:`_start` for headers the gateway vouches for (see :data:`LENGTH_KEY`):
        one join, no scan."""
        defaults = self.conn.server_state.default_headers
        block = b"\r\n".join(map(_JOIN_HEADER, [*defaults, *headers] if defaults else headers))
        if length >= 0:
            self.remaining = length
            tail = _END_HEAD if self.keep_alive else _CLOSE_HEAD
        else:
            self.chunked = True
            tail = _CHUNKED_HEAD if self.keep_alive else _CHUNKED_CLOSE_HEAD
        self.head = b"".join((_status_line(status), block, tail))

    def watch(self, callback: Callable[[], Any]) -> Callable[[], None]:
        """The ``shuniu.disconnect`` extension (see :data:`DISCONNECT_EXTENSION`)."""
        if self.disconnected:
            callback()
            return _nothing
        if self.on_gone is None:
            self.on_gone = []
        self.on_gone.append(callback)

        def forget() -> None:
            if self.on_gone is not None and callback in self.on_gone:
                self.on_gone.remove(callback)

        return forget

    # -- the connection's side -----------------------------------------------------------

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def gone(self) -> None:
        """The client went away."""
        if self.complete:
            return
        self.disconnected = True
        self.wake()
        callbacks, self.on_gone = self.on_gone, None
        for callback in callbacks or ():
            try:
                callback()
            except Exception:  # one callback's bug must not keep the others from running
                log.exception("disconnect callback failed")

    async def run(self, app: Callable[..., Any]) -> None:
        try:
            await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            log.error("Exception in ASGI application", exc_info=exc)
            if not self.started:
                await self._internal_error()
            else:
                self.conn.transport.close()
        else:
            if not self.started and not self.disconnected:
                log.error("ASGI callable returned without starting response.")
                await self._internal_error()
            elif not self.complete and not self.disconnected:
                log.error("ASGI callable returned without completing response.")
                self.conn.transport.close()
        finally:
            # The scope holds this cycle (its disconnect extension): drop the way back, so
            # a finished request is freed by reference counting, not left to the cyclic GC.
            self.on_gone = None
            self.scope = None  # type: ignore[assignment]

    async def _internal_error(self) -> None:
        self.keep_alive = False
        body = GatewayError(500, "Internal server error.", type="server_error", code="internal_error").body()
        await self.send(
            {
                "type": "http.response.start",
                "status": 500,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
            }
        )
        await self.send({"type": "http.response.body", "body": body})


def _value(head: bytes, start: int) -> bytes:
    """The rest of the header line of ``head`` from ``start``."""
    end = head.find(b"\r\n", start)
    return head[start:] if end < 0 else head[start:end]


def _nothing() -> None:
    return None


class _Sweeper:
    """Checks the guards' deadlines of one server's connections, a few times per timeout."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float) -> None:
        self.loop = loop
        self.interval = interval
        self.conns: set[GatewayProtocol] = set()
        self.handle: asyncio.TimerHandle | None = None

    def add(self, conn: GatewayProtocol) -> None:
        self.conns.add(conn)
        if self.handle is None:
            self.handle = self.loop.call_later(self.interval, self.sweep)

    def sweep(self) -> None:
        self.handle = None
        now = self.loop.time()
        for conn in list(self.conns):
            conn.check(now)
        if self.conns:
            self.handle = self.loop.call_later(self.interval, self.sweep)


class _Limits:
    """One server's guards (``gateway.*``) and its sweeper, shared by its connections."""

    __slots__ = (
        "body_timeout_s",
        "header_timeout_s",
        "max_connections",
        "max_header_bytes",
        "sweep_s",
        "sweeper",
    )

    def __init__(
        self,
        header_timeout_s: float = 10.0,
        body_timeout_s: float = 30.0,
        max_header_bytes: int = 32 * 1024,
        max_connections: int = 4096,
        sweep_s: float = 1.0,
    ) -> None:
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_header_bytes = max_header_bytes
        self.max_connections = max_connections
        self.sweep_s = sweep_s
        self.sweeper: _Sweeper | None = None
        """Made by the server's first connection."""


class GatewayProtocol(asyncio.Protocol):
    """One client connection, with its server's limits (:func:`gateway_protocol` makes the
    factory that uvicorn's server calls)."""

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        limits: _Limits | None = None,
    ) -> None:
        self.loop = _loop or asyncio.get_event_loop()
        self.limits = limits = limits if limits is not None else _Limits()
        # Read on every request's bytes (data_received): copied from the server's limits.
        self.max_header_bytes = limits.max_header_bytes
        self.app = config.loaded_app
        self.root_path: str = config.root_path
        self.keep_alive_s: float = config.timeout_keep_alive
        self.server_state = server_state
        self.connections: set[Any] = server_state.connections
        self.tasks: set[asyncio.Task[None]] = server_state.tasks
        self.app_state = app_state
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int | None] | None = None
        self.client: tuple[str, int] | None = None
        self.cycle: _Cycle | None = None
        """The request whose response is being produced (or was, last)."""
        self.pipeline: deque[_Cycle] = deque()
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_100 = False
        self.phase = _HEADERS
        self.since = 0.0
        self.header_bytes = 0
        self.tail = b""
        """The last bytes of the previous read (a header terminator may span two reads)."""
        self.read_paused = False
        self.write_paused = False
        self.drained: asyncio.Future[None] | None = None

    # -- connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.connections.add(self)
        self.server = get_local_addr(self.transport)
        self.client = get_remote_addr(self.transport)
        self.since = self.loop.time()
        limits = self.limits
        sweeper = limits.sweeper
        if sweeper is None or sweeper.loop is not self.loop:
            sweeper = limits.sweeper = _Sweeper(self.loop, limits.sweep_s)
        sweeper.add(self)
        if len(self.connections) > limits.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        sweeper = self.limits.sweeper
        if sweeper is not None:
            sweeper.conns.discard(self)
        for cycle in (self.cycle, *self.pipeline):
            if cycle is not None:
                cycle.gone()
        self.pipeline.clear()
        self.resume_writing()  # a send waiting to drain returns (and finds the client gone)
        self.phase = _BUSY
        if exc is None:
            self.transport.close()

    def eof_received(self) -> bool | None:
        return None

    def _make_room(self) -> None:
        """Close the connection that has waited longest in its headers; else the one idle
        longest between requests (its client reconnects); else refuse this one."""
        slowest: GatewayProtocol | None = None
        idlest: GatewayProtocol | None = None
        for conn in self.connections:
            if conn is self or not isinstance(conn, GatewayProtocol):
                continue
            if conn.phase == _HEADERS:
                if slowest is None or conn.since < slowest.since:
                    slowest = conn
            elif conn.phase == _IDLE:
                if idlest is None or conn.since < idlest.since:
                    idlest = conn
        if slowest is not None:
            slowest._refuse(408, "The request headers did not arrive in time.", "header_timeout")
        elif idlest is not None:
            idlest.transport.close()
        else:
            message = "The gateway has too many open connections; retry shortly."
            self._refuse(503, message, "too_many_connections")

    def shutdown(self) -> None:
        """The server is stopping: close now if idle, else after the response under way."""
        cycle = self.cycle
        if cycle is None or cycle.complete:
            self.transport.close()
        else:
            cycle.keep_alive = False

    def check(self, now: float) -> None:
        """The sweep: enforce the timeout of the phase this connection is in."""
        phase = self.phase
        if phase == _HEADERS:
            if now - self.since > self.limits.header_timeout_s and not self.transport.is_closing():
                self._refuse(408, "The request headers did not arrive in time.", "header_timeout")
        elif phase == _IDLE:
            if now - self.since > self.keep_alive_s:
                self.transport.close()
        elif phase == _BODY and not self.read_paused and now - self.since > self.limits.body_timeout_s:
            # (Paused: the gateway stopped reading, having enough buffered; not the client's fault.)
            self.transport.close()

    # -- reading ---------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self.phase == _IDLE:
            self.phase = _HEADERS
            self.since = self.loop.time()
        if self.phase == _HEADERS:
            if self.header_bytes + len(data) > self.max_header_bytes + _REQUEST_LINE_ALLOWANCE:
                # Only what comes before the blank line that ends the headers counts: a read
                # may hold the end of the headers and the start of a large body.
                end = (self.tail + data).find(b"\r\n\r\n")
                head = self.header_bytes + (end + 4 - len(self.tail) if end >= 0 else len(data))
                if head > self.max_header_bytes + _REQUEST_LINE_ALLOWANCE:
                    limit = self.max_header_bytes
                    message = f"The request headers are larger than this gateway accepts ({limit} bytes)."
                    self._refuse(431, message, "headers_too_large")
                    return
            self.header_bytes += len(data)
            self.tail = data[-3:]
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            pass  # no protocol upgrades here: the request is answered over HTTP/1.1
        except httptools.HttpParserError:
            self._refuse(400, "Invalid HTTP request received.", "invalid_http_request")

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.expect_100 = False
        if self.phase != _HEADERS:  # the next request on a kept-alive (or pipelined) connection
            self.phase = _HEADERS
            self.since = self.loop.time()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        # llhttp keeps trailing whitespace, which RFC 9110 section 5.5 excludes from values.
        value = value.rstrip(b" \t")
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100 = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        version = parser.get_http_version()
        method = parser.get_method().decode("ascii")
        url = self.url
        query = b""
        # find(), not ``in``: bytes' ``in`` first tries its operand as an int (a TypeError
        # made and cleared, 1.8 k instructions each).
        if url[:1] != b"/" or url.find(b"?") >= 0 or url.find(b"#") >= 0:
            # Not a bare path (a query, a fragment, the absolute form): parsed in full. Any:
            # httptools' stubs say bytes where it returns None for a part that is absent.
            parsed: Any = httptools.parse_url(url)
            url = parsed.path or b"/"
            query = parsed.query or b""
        raw_path = url
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": _ASGI,
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "method": method,
            "root_path": self.root_path,
            "path": self.root_path + path if self.root_path else path,
            "raw_path": self.root_path.encode("ascii") + raw_path if self.root_path else raw_path,
            "query_string": query,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }
        cycle = _Cycle(self, scope, version != "1.0" and parser.should_keep_alive(), self.expect_100)
        scope["extensions"] = {DISCONNECT_EXTENSION: cycle.watch}
        self.header_bytes = 0
        self.tail = b""
        if self._expects_body():
            self.phase = _BODY
            self.since = self.loop.time()
        else:
            self.phase = _BUSY
        current = self.cycle
        if current is None or current.complete:
            self._start(cycle)
        else:
            # A pipelined request: it waits for the response before it.
            self.pause_reading()
            self.pipeline.append(cycle)

    def _expects_body(self) -> bool:
        for name, value in self.headers:
            if name == b"content-length":
                return value.strip() not in (b"", b"0")
            if name == b"transfer-encoding":
                return True
        return False

    def _receiving(self) -> _Cycle | None:
        """The cycle whose request body is being read (the last one parsed)."""
        return self.pipeline[-1] if self.pipeline else self.cycle

    def on_body(self, body: bytes) -> None:
        if self.phase == _BODY:
            self.since = self.loop.time()
        cycle = self._receiving()
        if cycle is None or cycle.complete:
            return  # answered already (a 413, say): the rest of the body is read and dropped
        cycle.body += body
        if len(cycle.body) > _HIGH_WATER:
            self.pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        cycle = self._receiving()
        if cycle is None or cycle.complete:
            if self.phase == _BODY:  # the body of a request answered before it was read
                self.phase = _IDLE
                self.since = self.loop.time()
            return
        if self.phase == _BODY:
            self.phase = _BUSY
        cycle.more_body = False
        cycle.wake()

    def pause_reading(self) -> None:
        if not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()

    # -- the application -----------------------------------------------------------------

    def _start(self, cycle: _Cycle) -> None:
        self.cycle = cycle
        # The Task itself, with a name: loop.create_task (uvloop's too) would name it
        # ``Task-<n>``, formatted for every request. (No loop here sets a task factory.)
        task = asyncio.Task(cycle.run(self.app), loop=self.loop, name=_TASK_NAME)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def response_complete(self, cycle: _Cycle) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if not cycle.keep_alive:
            self.transport.close()
            return
        self.resume_reading()
        if self.pipeline:
            self._start(self.pipeline.popleft())
        elif self.phase == _BUSY:
            self.phase = _IDLE
            self.since = self.loop.time()

    # -- writing -------------------------------------------------------------------------

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drained, self.drained = self.drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def drain(self) -> None:
        if self.drained is None:
            self.drained = self.loop.create_future()
        await asyncio.shield(self.drained)

    # -- helpers -------------------------------------------------------------------------

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer on a connection the application has not got a request of, and close it."""
        self.phase = _BUSY
        if not self.transport.is_closing():
            self.transport.write(_error_response(status, message, code))
            self.transport.close()


def gateway_protocol(cfg: GatewayConfig) -> Callable[..., GatewayProtocol]:
    """The HTTP protocol factory for uvicorn's server (it calls it as it would a protocol
    class), with ``cfg``'s limits. A factory, not a subclass per server: the compiled build
    compiles this module, and an interpreted class cannot subclass a compiled one."""
    shortest = min(cfg.header_timeout_s, cfg.body_timeout_s, cfg.keep_alive_s)
    limits = _Limits(
        header_timeout_s=cfg.header_timeout_s,
        body_timeout_s=cfg.body_timeout_s,
        max_header_bytes=cfg.max_header_bytes,
        max_connections=cfg.max_connections,
        sweep_s=min(1.0, max(0.05, shortest / 4)),
    )
    return partial(GatewayProtocol, limits=limits)
