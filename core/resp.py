"""A lean Redis client for calls on the request path: one connection to one server, every
command pipelined, replies parsed by hiredis.

redis-py's asyncio client checks a connection out of a pool, writes, and reads back one reply
per call, with several layers of coroutines and locks in between: about 0.35 ms of the
gateway's CPU per call on the CI machine, more than the whole request path without Redis.
Here a command is encoded once, appended to the connection's output buffer, and written
with every other command issued in the same turn of the event loop (auto-pipelining); its
reply resolves a future, matched by order (Redis answers a connection's commands in the
order they came). One connection is enough: Redis runs commands one at a time, and
pipelining keeps it busy without a pool.

What it does not do: Sentinel, Cluster and TLS (the stores keep redis-py for those URLs),
pub/sub, blocking commands. A reply that does not come within ``timeout_s`` fails every
command waiting on the connection and closes it (its replies can no longer be matched); the
next command connects again. Errors: :class:`RespError` for an error reply, ``OSError``
(``ConnectionError``, ``TimeoutError``) when the server cannot be reached or does not answer
in time.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from shuniu.core.extras import require
from shuniu.core.redis_client import parse_redis_url

__all__ = ["RespClient", "RespError", "encode_command"]


class RespError(Exception):
    """An error reply from Redis (``NOSCRIPT …``, ``WRONGTYPE …``, ``NOAUTH …``)."""


def encode_command(args: tuple[Any, ...]) -> bytes:
    """One command as a RESP array of bulk strings (ints as digits, floats as ``repr``, which
    Lua's ``tonumber`` reads back exactly)."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, int):
            data = b"%d" % arg
        else:
            data = repr(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Connection(asyncio.Protocol):
    """One socket to Redis: futures waiting for replies in order, a reader that parses them."""

    def __init__(self, client: RespClient) -> None:
        self.client = client
        self.reader = client.hiredis.Reader(replyError=RespError)
        self.transport: asyncio.Transport | None = None
        self.waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        """Futures of the commands written and not yet answered, with their deadlines."""
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiting = self.waiting
        while True:
            reply = reader.gets()
            if reply is False:
                return
            if not waiting:  # a reply nobody asked for: the stream is out of step
                self.abort(ConnectionError("Redis sent a reply no command was waiting for"))
                return
            future = waiting.popleft()[0]
            if future.done():  # its caller gave up (cancelled)
                continue
            if isinstance(reply, RespError):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(exc if exc is not None else ConnectionError("Redis closed the connection"))
        self.client._lost(self)

    def fail(self, exc: BaseException) -> None:
        self.lost = exc
        waiting = self.waiting
        while waiting:
            future = waiting.popleft()[0]
            if not future.done():
                future.set_exception(exc)

    def abort(self, exc: BaseException) -> None:
        self.fail(exc)
        if self.transport is not None:
            self.transport.abort()


class RespClient:
    """Pipelined commands to one Redis server (see the module)."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        path: str | None = None,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout_s: float = 1.0,
    ) -> None:
        """``path``: a Unix socket instead of ``host:port``. ``timeout_s``: the longest wait
        to connect, and for any reply."""
        self.hiredis = require("hiredis", "redis", "The lean Redis client")
        self.host, self.port, self.path = host, port, path
        self.timeout_s = timeout_s
        hello: list[bytes] = []
        if password is not None:
            auth = ("AUTH", username, password) if username else ("AUTH", password)
            hello.append(encode_command(auth))
        if db:
            hello.append(encode_command(("SELECT", db)))
        self._hello = hello
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[_Connection] | None = None
        self._out: list[bytes] = []
        self._queued: list[asyncio.Future[Any]] = []
        """Futures of commands in ``_out``, not yet written."""
        self._flush_scheduled = False
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    @classmethod
    def from_url(cls, url: str, timeout_s: float) -> RespClient:
        """A client for a ``redis://`` or ``unix://`` URL (parsed as redis-py parses it)."""
        from redis.connection import parse_url

        kw = parse_url(url)
        return cls(
            host=kw.get("host") or "127.0.0.1",
            port=int(kw.get("port") or 6379),
            path=kw.get("path"),
            db=int(kw.get("db") or 0),
            username=kw.get("username"),
            password=kw.get("password"),
            timeout_s=timeout_s,
        )

    @classmethod
    def for_url(cls, url: str, client: str, timeout_s: float) -> RespClient | None:
        """The lean client for a store's ``url`` when its ``client`` option asks for it
        (``shuniu``) and the URL names one server without TLS; ``None`` otherwise (the store
        then uses redis-py)."""
        target = parse_redis_url(url)
        if client != "shuniu" or target.shape != "server" or target.tls:
            return None
        return cls.from_url(url, timeout_s)

    # -- commands ------------------------------------------------------------------------

    def send(self, *args: Any) -> asyncio.Future[Any]:
        """Queue one command; it leaves with this loop turn's other commands. The future
        gets its reply (or :class:`RespError`, or an ``OSError``)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._closed:
            future.set_exception(ConnectionError("the Redis client is closed"))
            return future
        self._out.append(encode_command(args))
        self._queued.append(future)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return future

    async def execute(self, *args: Any) -> Any:
        """One command's reply."""
        return await self.send(*args)

    async def run_script(self, sha: str, text: str, keys: list[str], args: list[Any]) -> Any:
        """A Lua script's reply, run by its SHA-1 (``EVALSHA``), and by its ``text`` when
        Redis does not have it yet (after a restart or ``SCRIPT FLUSH``), which loads it."""
        try:
            return await self.send("EVALSHA", sha, len(keys), *keys, *args)
        except RespError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            return await self.send("EVAL", text, len(keys), *keys, *args)

    async def close(self) -> None:
        """Fail what is still waiting and close the connection."""
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        conn = self._conn
        self._conn = None
        closed = ConnectionError("the Redis client is closed")
        for future in self._queued:
            if not future.done():
                future.set_exception(closed)
        self._out.clear()
        self._queued.clear()
        if conn is not None:
            conn.fail(closed)
            if conn.transport is not None:
                conn.transport.close()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- writing -------------------------------------------------------------------------

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out:
            return
        conn = self._conn
        if conn is None or conn.transport is None or conn.lost is not None:
            if self._connecting is None and not self._closed:
                self._start_connecting()
            return  # written once connected
        data = b"".join(self._out) if len(self._out) > 1 else self._out[0]
        self._out = []
        queued = self._queued
        self._queued = []
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        waiting = conn.waiting
        for future in queued:
            waiting.append((future, deadline))
        conn.transport.write(data)
        if self._timer is None:
            self._arm(deadline)

    def _start_connecting(self) -> None:
        task = asyncio.get_running_loop().create_task(self._connect())
        # Its failure reaches the queued commands; nothing else awaits the task.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._connecting = task

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        conn = _Connection(self)
        try:
            async with asyncio.timeout(self.timeout_s):
                if self.path is not None:
                    await loop.create_unix_connection(lambda: conn, self.path)
                else:
                    await loop.create_connection(lambda: conn, self.host, self.port)
                if self._hello:  # AUTH and SELECT before anything else
                    greeting = [loop.create_future() for _ in self._hello]
                    deadline = loop.time() + self.timeout_s
                    conn.waiting.extend((f, deadline) for f in greeting)
                    assert conn.transport is not None
                    conn.transport.write(b"".join(self._hello))
                    await asyncio.gather(*greeting)
        except BaseException as exc:
            if isinstance(exc, RespError):  # wrong password, no such database
                failure: BaseException = ConnectionError(f"Redis refused the connection: {exc}")
            elif isinstance(exc, OSError):
                failure = exc
            else:
                failure = ConnectionError(f"connecting to Redis failed: {exc!r}")
            for future, _ in conn.waiting:  # the greeting's: nobody else awaits them
                future.cancel()
            conn.waiting.clear()
            conn.abort(failure)
            self._refuse(failure)
            raise failure from None
        finally:
            self._connecting = None
        if self._closed:
            conn.abort(ConnectionError("the Redis client is closed"))
            return conn
        self._conn = conn
        if self._out:
            self._flush()
        return conn

    def _refuse(self, exc: BaseException) -> None:
        """Connecting failed: every command queued meanwhile fails with it."""
        queued = self._queued
        self._queued = []
        self._out = []
        for future in queued:
            if not future.done():
                future.set_exception(exc)

    def _lost(self, conn: _Connection) -> None:
        if self._conn is conn:
            self._conn = None

    # -- the reply timeout -----------------------------------------------------------------

    def _arm(self, deadline: float) -> None:
        self._timer = asyncio.get_running_loop().call_at(deadline, self._check_deadline)

    def _check_deadline(self) -> None:
        """One timer for all waiting commands: at the oldest one's deadline."""
        self._timer = None
        conn = self._conn
        if conn is None or not conn.waiting:
            return
        deadline = conn.waiting[0][1]
        if deadline > asyncio.get_running_loop().time():
            self._arm(deadline)
            return
        self._conn = None
        conn.abort(TimeoutError(f"Redis did not answer within {self.timeout_s:g} s"))
