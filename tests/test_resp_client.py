"""The lean pipelined Redis client (core/resp.py) against a real ``redis-server``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from shuniu.core.resp import RespClient, RespError, encode_command
from tests.redis_server import RedisServer


def test_commands_are_encoded_as_resp_arrays_of_bulk_strings() -> None:
    assert encode_command(("SET", b"k", 7, 0.5, "é")) == (
        b"*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n7\r\n$3\r\n0.5\r\n$2\r\n\xc3\xa9\r\n"
    )


async def test_concurrent_commands_share_writes_and_get_their_own_replies(redis_url: str) -> None:
    client = RespClient.from_url(redis_url, timeout_s=5.0)
    writes: list[int] = []
    try:
        assert await client.execute("PING") == b"PONG"
        transport = client._conn.transport  # type: ignore[union-attr]
        write = transport.write

        def counting(data: Any) -> None:
            writes.append(len(data))
            write(data)

        transport.write = counting  # type: ignore[method-assign]
        # 500 increments issued in one turn: each reply is its own, in the order sent.
        replies = await asyncio.gather(*(client.execute("INCR", "counter") for _ in range(500)))
        assert replies == list(range(1, 501))
        assert len(writes) == 1  # pipelined: one write for the whole turn
        # An error reply fails its own command only; the others around it succeed.
        await client.execute("SET", "text", "x")
        results = await asyncio.gather(
            client.execute("INCR", "counter"),
            client.execute("INCR", "text"),
            client.execute("GET", "text"),
            return_exceptions=True,
        )
        assert results[0] == 501 and results[2] == b"x"
        assert isinstance(results[1], RespError) and "not an integer" in str(results[1])
    finally:
        await client.close()


async def test_password_and_database_are_sent_before_any_command(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory(password="s3cret")
    client = RespClient.from_url(f"redis://:s3cret@127.0.0.1:{server.port}/3", timeout_s=5.0)
    wrong = RespClient.from_url(f"redis://:nope@127.0.0.1:{server.port}/0", timeout_s=5.0)
    try:
        assert await client.execute("SET", "where", "db3") is not None
        # The key is in database 3 and nowhere else (read by a second, raw connection).
        assert await client.execute("GET", "where") == b"db3"
        other = RespClient.from_url(f"redis://:s3cret@127.0.0.1:{server.port}/0", timeout_s=5.0)
        try:
            assert await other.execute("GET", "where") is None
        finally:
            await other.close()
        with pytest.raises(ConnectionError, match="refused the connection") as err:
            await wrong.execute("PING")
        assert "nope" not in str(err.value)
    finally:
        await client.close()
        await wrong.close()


async def test_a_silent_server_times_out_every_waiting_command_and_the_next_reconnects(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    # 1 s: the PINGs before the pause and after it (a new connection) must not time out.
    client = RespClient.from_url(server.url, timeout_s=1.0)
    try:
        assert await client.execute("PING") == b"PONG"
        server.pause()
        results = await asyncio.gather(*(client.execute("PING") for _ in range(3)), return_exceptions=True)
        assert all(isinstance(r, TimeoutError) for r in results)
        server.resume()
        assert await client.execute("PING") == b"PONG"  # on a new connection
    finally:
        server.resume()
        await client.close()


async def test_a_stopped_server_fails_commands_and_a_restarted_one_is_used_again(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    client = RespClient.from_url(server.url, timeout_s=1.0)
    try:
        assert await client.execute("SET", "k", "1")
        server.stop()
        with pytest.raises(OSError):
            await client.execute("GET", "k")
        with pytest.raises(OSError):  # refused: nothing listens
            await client.execute("GET", "k")
        server.start()
        assert await client.execute("GET", "k") is None  # the restarted server is empty
    finally:
        await client.close()


async def test_close_fails_what_is_queued_and_refuses_new_commands(redis_url: str) -> None:
    client = RespClient.from_url(redis_url, timeout_s=5.0)
    queued = client.send("PING")  # not written yet: the flush runs on the next turn
    await client.close()
    with pytest.raises(ConnectionError):
        await queued
    with pytest.raises(ConnectionError):
        await client.execute("PING")


async def test_a_caller_that_gives_up_does_not_shift_the_replies_of_others(redis_url: str) -> None:
    client = RespClient.from_url(redis_url, timeout_s=5.0)
    try:
        await client.execute("SET", "a", "1")
        await client.execute("SET", "b", "2")
        first = asyncio.ensure_future(client.execute("GET", "a"))
        second = asyncio.ensure_future(client.execute("GET", "b"))
        await asyncio.sleep(0)  # both queued
        first.cancel()
        assert await second == b"2"
        assert await client.execute("GET", "a") == b"1"
    finally:
        await client.close()
