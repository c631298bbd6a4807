"""A lean HTTP/1.1 client for the engine calls on the request path.

Profiles of the gateway in front of an instant upstream put aiohttp's client at about 40% of
the gateway's CPU per proxied request (request objects, header multidicts, timer contexts,
payload registries, a stream reader with its own buffering). An engine call needs much less:
one keep-alive connection from a pool, the request written in one ``write``, the answer's
status and body parsed with ``httptools`` (the parser the server side already uses), the body
handed on in the blocks it arrives in. :class:`H1Pool` does that and no more: plain
``http://`` only (``https://`` engines keep aiohttp), no redirects, no cookies, no
decompression (the gateway asks for none and proxies bodies as they come).

The response has the part of aiohttp's ``ClientResponse`` the engine clients use (``status``,
``read()``, ``content.readany()``, ``content.iter_any()``, ``release()``, ``close()``), and its
failures are aiohttp's exception types, so :func:`post_or_raise`, :func:`end_stream` and the
stream-break handling work with either client. Design notes and measurements:
``docs/design-choices.md``.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Mapping
from typing import cast
from urllib.parse import urlsplit

import aiohttp
import httptools

from shuniu.core.running_loop import running_loop
from shuniu.core.timers import COARSE_FROM_S, TimerWheel

__all__ = ["H1Pool", "H1Response"]

_PAUSE_AT = 256 * 1024
"""Bytes of body buffered and not yet read past which the socket stops being read (the
engine is slowed down rather than the gateway's memory filled)."""


class H1Response:
    """One answer: its status once the head arrived, its body as it comes."""

    __slots__ = (
        "_blocks",
        "_conn",
        "_done",
        "_error",
        "_raw_headers",
        "_size",
        "_timer",
        "_waiter",
        "bucket",
        "keep_alive",
        "status",
    )

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self.status = 0
        self.keep_alive = False
        self._blocks: deque[bytes] = deque()
        self._size = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | TimerWheel | None = None
        """What keeps the total-time limit: its own timer, or the pool's wheel (a limit of
        seconds or more, the default 600 s: see :mod:`shuniu.core.timers`)."""
        self.bucket = 0  # in the wheel
        self._raw_headers: list[tuple[bytes, bytes]] = []

    @property
    def headers(self) -> dict[str, str]:
        """The answer's headers, names in lower case (the last of a repeated one)."""
        return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self._raw_headers}

    @property
    def content(self) -> H1Response:
        """The body reader (the response itself, as aiohttp's ``resp.content``)."""
        return self

    # -- fed by the connection --------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._blocks.append(data)
        self._size += len(data)
        if self._size > _PAUSE_AT:
            self._conn.pause()
        self._wake()

    def _stop_timer(self) -> None:
        timer = self._timer
        if timer is not None:
            self._timer = None
            if type(timer) is TimerWheel:
                timer.disarm(self)
            else:
                timer.cancel()  # type: ignore[union-attr]

    def expire(self) -> None:
        """The pool's wheel: the total-time limit has passed."""
        self._timed_out()

    def _end(self) -> None:
        self._done = True
        self._stop_timer()
        self._wake()

    def _fail(self, exc: BaseException) -> None:
        if not self._done and self._error is None:
            self._error = exc
        self._wake()

    def _timed_out(self) -> None:
        self._timer = None
        error = TimeoutError()
        self._fail(error)
        self._conn._head_failed(error)
        self._conn.close()

    # -- read by the engine client -----------------------------------------------------------

    async def readany(self) -> bytes:
        """What arrived since the last read (waiting for something); ``b""`` at the end."""
        while not self._blocks:
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            self._waiter = self._conn.loop.create_future()  # its connection's loop: the running one
            await self._waiter
        blocks = self._blocks
        data = blocks.popleft() if len(blocks) == 1 else b"".join(blocks)
        blocks.clear()
        if self._size > _PAUSE_AT:
            self._conn.resume()
        self._size = 0
        return data

    def iter_any(self) -> _Blocks:
        """The body's blocks as they arrive."""
        return _Blocks(self)

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while block := await self.readany():
            parts.append(block)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the answer: a whole one's connection goes back to the pool, an unfinished
        one's is closed (which is how an engine learns its client went away)."""
        self._stop_timer()
        conn = self._conn
        if conn.response is self:
            conn.response = None
            if self._done and self._error is None and self.keep_alive:
                conn.pool._put_back(conn)
            else:
                conn.close()

    def close(self) -> None:
        """Done with the answer, whole or not: the connection is closed."""
        self._stop_timer()
        if self._conn.response is self:
            self._conn.response = None
        self._conn.close()


class _Blocks:
    """:meth:`H1Response.iter_any`: an iterator class rather than an async generator, which
    the compiled build cannot compile."""

    __slots__ = ("_response",)

    def __init__(self, response: H1Response) -> None:
        self._response = response

    def __aiter__(self) -> _Blocks:
        return self

    async def __anext__(self) -> bytes:
        block = await self._response.readany()
        if not block:
            raise StopAsyncIteration
        return block


class _Connection(asyncio.Protocol):
    """One keep-alive connection to the engine and the answer it is reading."""

    __slots__ = (
        "closed",
        "framed",
        "head",
        "idle_since",
        "loop",
        "parser",
        "paused",
        "pool",
        "response",
        "transport",
    )

    def __init__(self, pool: H1Pool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        """The loop it was opened on (its only one)."""
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: H1Response | None = None
        self.head: asyncio.Future[None] | None = None
        self.closed = False
        self.paused = False
        self.framed = False
        """The answer being read says where its body ends (a length or chunks); one that does
        not ends when the engine closes the connection."""
        self.idle_since = 0.0

    # -- asyncio.Protocol ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._broken(aiohttp.ClientPayloadError("the engine switched protocols"))
        except httptools.HttpParserError as exc:
            self._broken(aiohttp.ClientPayloadError(f"malformed HTTP from the engine: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        resp = self.response
        if resp is not None and not resp._done and resp.status and not self.framed and resp._error is None:
            resp.keep_alive = False
            resp._end()  # a body delimited by the end of the connection
        elif resp is not None and not resp._done:
            why = f"the engine closed the connection ({exc})" if exc else "the engine closed the connection"
            error = (
                aiohttp.ServerDisconnectedError(why) if resp.status == 0 else aiohttp.ClientPayloadError(why)
            )
            resp._fail(error)
            self._head_failed(error)
        self.pool._lost(self)

    # -- httptools callbacks ----------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.framed = False

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) in (14, 17) and name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True
        if self.response is not None:
            self.response._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        resp = self.response
        if resp is not None:
            resp.status = self.parser.get_status_code()
            resp.keep_alive = self.parser.should_keep_alive()
            head = self.head
            if head is not None and not head.done():
                head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.response is not None:
            self.response._feed(body)

    def on_message_complete(self) -> None:
        resp = self.response
        if resp is not None:
            resp.keep_alive = resp.keep_alive and self.parser.should_keep_alive()
            resp._end()

    # -- the pool's side ---------------------------------------------------------------------

    def _head_failed(self, exc: BaseException) -> None:
        head = self.head
        if head is not None and not head.done():
            head.set_exception(exc)

    def _broken(self, exc: BaseException) -> None:
        if self.response is not None:
            self.response._fail(exc)
        self._head_failed(exc)
        self.close()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()


class H1Pool:
    """Keep-alive HTTP/1.1 connections to one engine (``http://HOST:PORT``), at most
    ``max_connections`` at a time; a request waits for a free one past that."""

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int,
        timeout_s: float,
        connect_timeout_s: float,
        keepalive_s: float = 60.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"H1Pool takes http:// URLs, not {base_url!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._host_header = parts.netloc.encode("idna")
        self._max = max_connections
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_s = keepalive_s
        self._wheel: TimerWheel | None = None
        self._idle: deque[_Connection] = deque()
        self._open = 0
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self._paths: dict[str, bytes] = {}
        self._headers_of: tuple[Mapping[str, str] | None, bytes] = (None, b"")
        self.closed = False

    async def post(self, url: str, *, data: bytes, headers: Mapping[str, str]) -> H1Response:
        """POST ``data`` to ``url`` (on this pool's server); the response once its head
        arrived. Raises ``OSError`` (cannot connect), ``TimeoutError`` (connect or total
        time), ``aiohttp.ServerDisconnectedError`` (closed before answering)."""
        loop = running_loop()
        conn = await self._acquire(loop)
        resp = H1Response(conn)
        conn.response = resp
        head = conn.head = loop.create_future()
        if self._timeout_s >= COARSE_FROM_S:
            wheel = self._wheel
            if wheel is None or wheel.loop is not loop:
                wheel = self._wheel = TimerWheel(loop)
            wheel.arm(resp, loop.time() + self._timeout_s)
            resp._timer = wheel
        else:
            resp._timer = loop.call_at(loop.time() + self._timeout_s, resp._timed_out)
        assert conn.transport is not None
        conn.transport.write(self._request(url, data, headers))
        try:
            await head
        except BaseException:
            resp.close()
            raise
        finally:
            conn.head = None
        return resp

    def _request(self, url: str, data: bytes, headers: Mapping[str, str]) -> bytes:
        path = self._paths.get(url)
        if path is None:
            parts = urlsplit(url)
            path = self._paths[url] = (parts.path or "/").encode() + (
                b"?" + parts.query.encode() if parts.query else b""
            )
        cached, lines = self._headers_of
        if cached is not headers:
            # The engine's headers are one dict per endpoint; a request with trace headers
            # brings its own, which is encoded for it alone.
            lines = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode("latin-1")) for k, v in headers.items())
            self._headers_of = (headers, lines)
        return b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-length: %d\r\n%s\r\n%s" % (
            path,
            self._host_header,
            len(data),
            lines,
            data,
        )

    async def _acquire(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        if self.closed:
            raise aiohttp.ClientConnectionError("the engine's connection pool is closed")
        now = loop.time()
        idle = self._idle
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have timed out
            if not conn.closed and now - conn.idle_since < self._keepalive_s:
                return conn
            conn.close()
        if self._open >= self._max:
            waiter: asyncio.Future[_Connection | None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                got = await waiter
            except asyncio.CancelledError:
                # Handed a connection (or the right to open one) just as the request was
                # cancelled: pass it on rather than lose it.
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    handed = waiter.result()
                    if handed is None:
                        self._hand_on(None)
                    else:
                        self._put_back(handed)
                raise
            if got is not None:
                return got
            # None: a connection closed, and this request may open one in its place.
        self._open += 1
        conn = _Connection(self, loop)
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await loop.create_connection(lambda: conn, self._host, self._port)
        except BaseException:
            if conn.transport is not None:
                conn.close()  # connected as the time ran out: counted back once it is lost
            else:
                conn.closed = True
                self._open -= 1
                self._hand_on(None)
            raise
        return conn

    def _hand_on(self, conn: _Connection | None) -> bool:
        """Give ``conn`` (or, with ``None``, the right to open one) to the first waiting
        request; False when nobody waits."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def _put_back(self, conn: _Connection) -> None:
        if conn.closed or self.closed:
            conn.close()
            return
        if not self._hand_on(conn):
            conn.idle_since = conn.loop.time()
            self._idle.append(conn)

    def _lost(self, conn: _Connection) -> None:
        """A connection closed (either side): it no longer counts against the limit."""
        if conn.transport is None:
            return  # never connected: _acquire counted it back
        conn.transport = None
        self._open -= 1
        try:
            self._idle.remove(conn)
        except ValueError:
            pass
        if self._open < self._max:
            self._hand_on(None)

    async def close(self) -> None:
        """Close every connection; later requests fail."""
        self.closed = True
        while self._idle:
            self._idle.pop().close()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(aiohttp.ClientConnectionError("the engine's connection pool is closed"))
