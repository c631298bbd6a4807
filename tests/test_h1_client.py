"""The lean HTTP/1.1 client of the engine calls (``backends/http/h1.py``) against a real
asyncio server in the test's loop, which answers as each test scripts it: keep-alive reuse,
the connection limit, the three ways a body can end, timeouts, an engine that goes away,
back-pressure on a large body, and an unfinished answer closing its connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from shuniu.backends.http import h1
from shuniu.backends.http.h1 import H1Pool

Handler = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]
"""Answers one request (its head and body); returns False to close the connection."""


class Server:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed_by_client = 0
        self.client_closed = asyncio.Event()
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    self.closed_by_client += 1
                    self.client_closed.set()
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                if not await self.handler(body, writer):
                    return
        except (ConnectionError, asyncio.CancelledError):
            return
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


async def _ok(body: bytes, writer: asyncio.StreamWriter) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\nX-Prompt-Tokens: 7\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    await writer.drain()
    return True


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(handler: Handler) -> Server:
        server = Server(handler)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.server is not None
        server.server.close()


def _pool(server: Server, **kw: float) -> H1Pool:
    return H1Pool(
        server.url,
        max_connections=int(kw.get("max_connections", 8)),
        timeout_s=kw.get("timeout_s", 30.0),
        connect_timeout_s=kw.get("connect_timeout_s", 5.0),
    )


async def test_requests_reuse_one_keep_alive_connection(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(_ok)
    pool = _pool(server)
    for i in range(5):
        resp = await pool.post(server.url + "/chat/completions", data=b"body-%d" % i, headers={"x-a": "1"})
        assert resp.status == 200
        assert resp.headers["x-prompt-tokens"] == "7" and resp.headers["content-length"] == "6"
        assert await resp.read() == b"body-%d" % i
        resp.release()
    assert server.connections == 1
    first = server.requests[0]
    assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\nx-a: 1\r\n" in first and b"\r\ncontent-length: 6\r\n" in first
    assert b"\r\nhost: 127.0.0.1:%d\r\n" % server.port in first
    await pool.close()


async def test_past_the_limit_a_request_waits_for_a_released_connection(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve(_ok)
    pool = _pool(server, max_connections=1)
    first = await pool.post(server.url + "/x", data=b"a", headers={})
    second = asyncio.ensure_future(pool.post(server.url + "/x", data=b"b", headers={}))
    # A third request that gives up waiting must not take the connection with it.
    third = asyncio.ensure_future(pool.post(server.url + "/x", data=b"c", headers={}))
    await asyncio.sleep(0)
    third.cancel()
    assert not second.done()
    assert await first.read() == b"a"
    first.release()
    resp = await second
    assert await resp.read() == b"b"
    resp.release()
    assert server.connections == 1
    with pytest.raises(asyncio.CancelledError):
        await third
    resp = await pool.post(server.url + "/x", data=b"d", headers={})
    assert await resp.read() == b"d"
    resp.release()
    assert server.connections == 1
    await pool.close()


@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
async def test_a_body_ends_by_length_by_chunks_or_by_close(serve, framing: str) -> None:  # type: ignore[no-untyped-def]
    payload = b"x" * 5000 + b"end"

    async def answer(body: bytes, writer: asyncio.StreamWriter) -> bool:
        if framing == "length":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload))
        elif framing == "chunked":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for i in range(0, len(payload), 1000):
                part = payload[i : i + 1000]
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + payload)
        await writer.drain()
        return framing != "close"

    server = await serve(answer)
    pool = _pool(server)
    for _ in range(2):
        resp = await pool.post(server.url + "/x", data=b"", headers={})
        assert await resp.read() == payload
        resp.release()
    assert server.connections == (2 if framing == "close" else 1)
    await pool.close()


@pytest.mark.parametrize("kept_by", ["own timer", "wheel"])
async def test_the_total_time_limit_ends_a_stalled_body_with_a_timeout(
    serve, kept_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    if kept_by == "wheel":  # limits this long are kept by the pool's TimerWheel
        monkeypatch.setattr(h1, "COARSE_FROM_S", 0.1)
    release = asyncio.Event()

    async def stall(body: bytes, writer: asyncio.StreamWriter) -> bool:
        if body == b"silent":
            await release.wait()
            return False
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        await release.wait()
        return False

    server = await serve(stall)
    pool = _pool(server, timeout_s=0.2)
    resp = await pool.post(server.url + "/x", data=b"", headers={})
    assert await resp.readany() == b"abc"
    with pytest.raises(TimeoutError):
        await resp.readany()
    resp.release()
    # An engine that never answers at all: the same limit ends the wait for the head.
    with pytest.raises(TimeoutError):
        await pool.post(server.url + "/silent", data=b"silent", headers={})
    release.set()
    await pool.close()


async def test_a_finished_answer_leaves_nothing_armed(serve) -> None:  # type: ignore[no-untyped-def]
    async def answer(body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        return True

    server = await serve(answer)
    pool = _pool(server, timeout_s=600.0)
    for _ in range(20):
        resp = await pool.post(server.url + "/x", data=b"", headers={})
        assert await resp.read() == b"ok"
        resp.release()
    assert pool._wheel is not None and not pool._wheel.buckets
    await pool.close()


async def test_an_engine_that_goes_away_is_a_disconnect_before_the_head_and_a_payload_error_after(
    serve,
) -> None:  # type: ignore[no-untyped-def]
    async def hang_up(body: bytes, writer: asyncio.StreamWriter) -> bool:
        if body == b"mid":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly-part")
            await writer.drain()
        return False

    server = await serve(hang_up)
    pool = _pool(server)
    with pytest.raises(aiohttp.ServerDisconnectedError):
        await pool.post(server.url + "/x", data=b"before", headers={})
    resp = await pool.post(server.url + "/x", data=b"mid", headers={})
    assert resp.status == 200
    with pytest.raises(aiohttp.ClientPayloadError):
        await resp.read()
    resp.release()
    await pool.close()


async def test_an_engine_that_is_not_there_cannot_be_connected_to() -> None:
    pool = H1Pool("http://127.0.0.1:9/v1", max_connections=2, timeout_s=5, connect_timeout_s=2)
    with pytest.raises(OSError):
        await pool.post("http://127.0.0.1:9/v1/x", data=b"", headers={})
    await pool.close()


async def test_a_large_body_arrives_whole_through_back_pressure(serve) -> None:  # type: ignore[no-untyped-def]
    payload = bytes(range(256)) * 16384  # 4 MiB

    async def big(body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(payload))
        for i in range(0, len(payload), 65536):
            writer.write(payload[i : i + 65536])
            await writer.drain()
        return True

    server = await serve(big)
    pool = _pool(server)
    resp = await pool.post(server.url + "/x", data=b"", headers={})
    got = bytearray()
    while block := await resp.readany():
        got += block
        await asyncio.sleep(0)  # a slow reader: the socket is paused and resumed
    assert bytes(got) == payload
    resp.release()
    await pool.close()


async def test_releasing_an_unfinished_answer_closes_its_connection(serve) -> None:  # type: ignore[no-untyped-def]
    async def endless(body: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        return True  # then wait for the next request, or for the client to close

    server = await serve(endless)
    pool = _pool(server)
    resp = await pool.post(server.url + "/x", data=b"", headers={})
    assert await resp.readany() == b"hello"
    resp.release()
    await asyncio.wait_for(server.client_closed.wait(), 10)
    assert server.closed_by_client == 1
    resp = await pool.post(server.url + "/x", data=b"", headers={})
    assert server.connections == 2
    resp.close()
    await pool.close()
