"""The ledger in a SQLite file: the embedded default.

WAL mode, so reports (``shuniu usage``, ``/v1/usage``, another gateway on the same host)
read while a gateway writes, and ``synchronous=NORMAL`` (a committed batch survives a
crash of the process; only a power cut can lose the last ones). sqlite3 blocks, so every
call runs on one thread of this database's own: the event loop never waits on the disk,
and one connection is used by one thread only.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from shuniu.core.governance.database import Database

__all__ = ["SqliteDatabase"]

T = TypeVar("T")


class SqliteDatabase(Database):
    """A SQLite file, reached through one worker thread."""

    def __init__(self, path: Path, *, timeout_s: float) -> None:
        self.path = path
        self.url = f"sqlite:///{path}"
        self._timeout_s = timeout_s
        self._conn: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shuniu-ledger")

    async def _call(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._timeout_s):  # not wait_for: it can swallow a cancel (3.11)
            return await loop.run_in_executor(self._thread, fn)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self._timeout_s, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._conn = conn
        return self._conn

    async def connect(self) -> None:
        await self._call(self._connection)

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        try:
            await self._call(shut)
        finally:
            self._thread.shutdown(wait=False)

    def _bucket(self, unit: str) -> str:
        fmt = "%Y-%m-%d" if unit == "day" else "%Y-%m-%dT%H:00Z"
        return f"strftime('{fmt}', ts, 'unixepoch')"

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        def run() -> list[Sequence[Any]]:
            return list(self._connection().execute(sql, tuple(params)).fetchall())

        return await self._call(run)

    async def _execute(self, sql: str, params: Sequence[Any]) -> int:
        def run() -> int:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                changed = conn.execute(sql, tuple(params)).rowcount
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return int(changed)

        return await self._call(run)

    async def _transaction(self, statements: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> None:
        def run() -> None:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                for sql, rows in statements:
                    conn.executemany(sql, rows)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

        await self._call(run)
