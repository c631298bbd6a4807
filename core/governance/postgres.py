"""The ledger in PostgreSQL, for a fleet whose gateways share one ledger and one key table
(``pip install 'shuniu[postgres]'``: asyncpg).

A small pool of connections (writes are batched, so one or two are busy at most); a
connection lost with the server is replaced on the next call, so a restarted server is
used again without a restart of the gateway.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from shuniu.core.extras import require
from shuniu.core.governance.database import Database
from shuniu.core.governance.records import LedgerRecord
from shuniu.core.urls import redact_url

__all__ = ["PostgresDatabase"]

_PLACEHOLDER = re.compile(r"\?")
_CACHE_HIT = LedgerRecord.__struct_fields__.index("cache_hit")


class PostgresDatabase(Database):
    """A PostgreSQL database through an asyncpg pool."""

    def __init__(self, url: str, *, timeout_s: float) -> None:
        self._dsn = url.replace("postgres://", "postgresql://", 1)
        self.url = redact_url(self._dsn)
        self._timeout_s = timeout_s
        self._pool: Any = None
        self._lock = asyncio.Lock()

    async def _get_pool(self) -> Any:
        if self._pool is None:
            async with self._lock:
                if self._pool is None:
                    asyncpg = require("asyncpg", "postgres", "a PostgreSQL ledger")
                    self._pool = await asyncio.wait_for(
                        asyncpg.create_pool(
                            self._dsn,
                            min_size=0,
                            max_size=4,
                            command_timeout=self._timeout_s,
                            timeout=self._timeout_s,
                        ),
                        self._timeout_s,
                    )
        return self._pool

    async def connect(self) -> None:
        pool = await self._get_pool()
        async with asyncio.timeout(self._timeout_s):
            async with pool.acquire() as conn:
                await conn.execute("SELECT 1")

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), self._timeout_s)
            except (TimeoutError, OSError):
                pool.terminate()

    def _sql(self, sql: str) -> str:
        counter = iter(range(1, 1 << 30))
        return _PLACEHOLDER.sub(lambda _m: f"${next(counter)}", sql)

    def _row(self, record: LedgerRecord) -> tuple[Any, ...]:
        row = list(msgspec.structs.astuple(record))
        row[_CACHE_HIT] = int(row[_CACHE_HIT])  # asyncpg wants an int for an INTEGER
        return tuple(row)

    def _bucket(self, unit: str) -> str:
        fmt = "YYYY-MM-DD" if unit == "day" else 'YYYY-MM-DD"T"HH24":00Z"'
        return f"to_char(to_timestamp(ts) AT TIME ZONE 'UTC', '{fmt}')"

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        pool = await self._get_pool()
        async with asyncio.timeout(self._timeout_s):
            async with pool.acquire() as conn:
                return list(await conn.fetch(sql, *params))

    async def _execute(self, sql: str, params: Sequence[Any]) -> int:
        pool = await self._get_pool()
        async with asyncio.timeout(self._timeout_s):
            async with pool.acquire() as conn:
                status = await conn.execute(sql, *params)  # e.g. "UPDATE 3"
        tail = str(status).rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    async def _transaction(self, statements: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> None:
        pool = await self._get_pool()
        async with asyncio.timeout(self._timeout_s):
            async with pool.acquire() as conn, conn.transaction():
                for sql, rows in statements:
                    if len(rows) == 1:
                        await conn.execute(sql, *rows[0])
                    else:
                        await conn.executemany(sql, rows)
