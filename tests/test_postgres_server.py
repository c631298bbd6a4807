"""The real-PostgreSQL fixtures of ``tests/postgres_server.py`` work: a database that takes
writes, goes away when its server stops and comes back, with its data, when it starts."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import pytest

from tests.postgres_server import PostgresServer


async def test_postgres_url_is_a_fresh_database(postgres_url: str) -> None:
    conn = await asyncpg.connect(postgres_url, timeout=10)
    try:
        assert await conn.fetchval("SELECT current_user") == "shuniu"
        tables = await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        assert tables == 0
    finally:
        await conn.close()


async def test_the_data_survives_a_stop_and_a_start(
    postgres_server_factory: Callable[[], PostgresServer],
) -> None:
    server = postgres_server_factory()
    pid, port = server.pid, server.port
    assert pid is not None

    conn = await asyncpg.connect(server.url, timeout=10)
    try:
        await conn.execute("CREATE TABLE kept (id int PRIMARY KEY, name text NOT NULL)")
        await conn.execute("INSERT INTO kept VALUES (1, 'ledger')")
    finally:
        await conn.close()

    server.stop()
    assert server.pid is None
    with pytest.raises((OSError, asyncpg.PostgresError)):
        await asyncpg.connect(server.url, timeout=2)
    server.stop()  # idempotent

    server.start()
    server.start()  # idempotent
    assert server.port == port
    assert server.pid is not None and server.pid != pid
    conn = await asyncpg.connect(server.url, timeout=10)
    try:
        assert await conn.fetch("SELECT id, name FROM kept") == [(1, "ledger")]
    finally:
        await conn.close()
