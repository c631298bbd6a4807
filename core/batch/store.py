"""The batch queue in a database (SQLite by default, or PostgreSQL shared by a fleet), so
a batch survives restarts and any gateway can work on it.

Each request of a batch is one row, keyed by (batch, line). A gateway **claims** rows
(``pending`` ones, and ``running`` ones whose lease ran out: their gateway died) with one
statement, so two gateways never take the same row at once; it renews the lease of what it
runs and records each result in the row. A result is written only by the claim that holds
the row, so a request redone after a lease ran out leaves one result: the batch's output
has every ``custom_id`` exactly once.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from shuniu.core.batch.queue import BatchQueue, BatchRecord, Item, Result
from shuniu.core.governance import Database
from shuniu.core.types import Principal

__all__ = ["BATCH_MIGRATIONS", "SqlBatchQueue"]

BATCH_MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (
        1,
        "batches and their requests",
        (
            """CREATE TABLE shuniu_batches (
                id TEXT PRIMARY KEY,
                tenant TEXT NOT NULL,
                principal TEXT NOT NULL,
                endpoint TEXT NOT NULL,
                input_file_id TEXT NOT NULL,
                completion_window TEXT NOT NULL,
                status TEXT NOT NULL,
                created_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                times TEXT NOT NULL,
                output_file_id TEXT,
                error_file_id TEXT,
                metadata TEXT,
                errors TEXT
            )""",
            "CREATE INDEX shuniu_batches_status ON shuniu_batches (status)",
            """CREATE TABLE shuniu_batch_items (
                batch_id TEXT NOT NULL,
                idx INTEGER NOT NULL,
                custom_id TEXT NOT NULL,
                body TEXT NOT NULL,
                state TEXT NOT NULL,
                claim TEXT,
                lease_until DOUBLE PRECISION,
                attempts INTEGER NOT NULL,
                not_before DOUBLE PRECISION NOT NULL,
                status_code INTEGER,
                response TEXT,
                request_id TEXT,
                PRIMARY KEY (batch_id, idx)
            )""",
            "CREATE INDEX shuniu_batch_items_state ON shuniu_batch_items (state, batch_id)",
        ),
    ),
)
"""(version, what it adds, statements), oldest first; append only."""

_BATCH_COLUMNS = (
    "id, tenant, principal, endpoint, input_file_id, completion_window, status, created_at, "
    "expires_at, times, output_file_id, error_file_id, metadata, errors"
)


class SqlBatchQueue(BatchQueue):
    """Batches and their requests in one database."""

    def __init__(self, database: Database) -> None:
        self.database = database
        self.opened = False

    def exists(self) -> bool:
        """Whether there is a queue to read: a SQLite file is created by the first batch,
        not by a gateway that never gets one (``shuniu serve`` leaves no file behind)."""
        path = getattr(self.database, "path", None)
        return self.opened or path is None or path.exists()

    async def open(self) -> None:
        """Connect and migrate (once)."""
        if self.opened:
            return
        await self.database.connect()
        await self.database.migrate(
            migrations=BATCH_MIGRATIONS, table="shuniu_batch_schema", what="the batch queue"
        )
        self.opened = True

    async def close(self) -> None:
        await self.database.close()

    # -- batches ------------------------------------------------------------------------

    async def create(self, batch: BatchRecord) -> None:
        await self.open()
        await self.database.run(
            [
                (
                    f"INSERT INTO shuniu_batches ({_BATCH_COLUMNS}) VALUES ({', '.join('?' * 14)})",
                    [
                        (
                            batch.id,
                            batch.tenant,
                            msgspec.json.encode(batch.principal).decode(),
                            batch.endpoint,
                            batch.input_file_id,
                            batch.completion_window,
                            batch.status,
                            batch.created_at,
                            batch.expires_at,
                            json.dumps(batch.times),
                            None,
                            None,
                            json.dumps(batch.metadata) if batch.metadata else None,
                            None,
                        )
                    ],
                )
            ]
        )

    async def get(self, batch_id: str) -> BatchRecord | None:
        if not self.exists():
            return None
        await self.open()
        rows = await self.database.fetch(
            f"SELECT {_BATCH_COLUMNS} FROM shuniu_batches WHERE id = ?", [batch_id]
        )
        return _record(rows[0]) if rows else None

    async def list(self, tenant: str | None) -> list[BatchRecord]:
        if not self.exists():
            return []
        await self.open()
        if tenant is None:
            rows = await self.database.fetch(f"SELECT {_BATCH_COLUMNS} FROM shuniu_batches")
        else:
            rows = await self.database.fetch(
                f"SELECT {_BATCH_COLUMNS} FROM shuniu_batches WHERE tenant = ?", [tenant]
            )
        return [_record(r) for r in rows]

    async def with_status(self, *statuses: str) -> list[BatchRecord]:
        marks = ", ".join("?" * len(statuses))
        rows = await self.database.fetch(
            f"SELECT {_BATCH_COLUMNS} FROM shuniu_batches WHERE status IN ({marks})", list(statuses)
        )
        return [_record(r) for r in rows]

    async def move(self, batch: BatchRecord, frm: Sequence[str], to: str, **fields: Any) -> bool:
        """Set the batch's status ``to`` if it is one of ``frm`` (and ``fields``: output and
        error file ids, errors); whether this call made the change (so one gateway does each
        step)."""
        now = int(time.time())
        times = {**batch.times, f"{to}_at": now}
        sets = ["status = ?", "times = ?"]
        params: list[Any] = [to, json.dumps(times)]
        for name, value in fields.items():
            sets.append(f"{name} = ?")
            params.append(json.dumps(value) if name == "errors" else value)
        marks = ", ".join("?" * len(frm))
        changed = await self.database.execute(
            f"UPDATE shuniu_batches SET {', '.join(sets)} WHERE id = ? AND status IN ({marks})",
            [*params, batch.id, *frm],
        )
        if changed:
            batch.status, batch.times = to, times
            for name, value in fields.items():
                setattr(batch, name, value)
        return bool(changed)

    async def counts(self, batch_ids: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
        """Batch id → request state → how many."""
        if batch_ids is not None and not batch_ids:
            return {}
        sql = "SELECT batch_id, state, COUNT(*) FROM shuniu_batch_items"
        params: list[Any] = []
        if batch_ids is not None:
            sql += f" WHERE batch_id IN ({', '.join('?' * len(batch_ids))})"
            params = list(batch_ids)
        out: dict[str, dict[str, int]] = {}
        for batch_id, state, n in await self.database.fetch(sql + " GROUP BY batch_id, state", params):
            out.setdefault(batch_id, {})[state] = int(n)
        return out

    # -- requests -----------------------------------------------------------------------

    async def add_items(self, batch_id: str, lines: Sequence[tuple[str, bytes]]) -> None:
        """The batch's requests, in file order: (custom_id, body)."""
        rows = [(batch_id, i, cid, body.decode(), "pending", 0, 0.0) for i, (cid, body) in enumerate(lines)]
        await self.database.run(
            [
                (
                    "INSERT INTO shuniu_batch_items (batch_id, idx, custom_id, body, state, attempts, "
                    "not_before) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (batch_id, idx) DO NOTHING",
                    rows,
                )
            ]
        )

    async def claim(self, batch_ids: Sequence[str], n: int, lease_s: float) -> list[Item]:
        """Take up to ``n`` requests of these (running) batches: pending ones that may start,
        and running ones whose lease ran out."""
        if not batch_ids or n <= 0:
            return []
        now = time.time()
        token = secrets.token_hex(8)
        marks = ", ".join("?" * len(batch_ids))
        free = (
            f"batch_id IN ({marks}) AND ((state = 'pending' AND not_before <= ?) "
            "OR (state = 'running' AND lease_until < ?))"
        )
        await self.database.execute(
            "UPDATE shuniu_batch_items SET state = 'running', claim = ?, lease_until = ? "
            "WHERE (batch_id, idx) IN (SELECT batch_id, idx FROM shuniu_batch_items "
            f"WHERE {free} ORDER BY batch_id, idx LIMIT {int(n)}) AND {free}",
            [token, now + lease_s, *batch_ids, now, now, *batch_ids, now, now],
        )
        rows = await self.database.fetch(
            "SELECT batch_id, idx, custom_id, body, attempts FROM shuniu_batch_items WHERE claim = ? "
            "AND state = 'running'",
            [token],
        )
        return [Item(r[0], int(r[1]), r[2], r[3].encode(), int(r[4]), token) for r in rows]

    async def renew(self, items: Sequence[Item], lease_s: float) -> None:
        if not items:
            return
        until = time.time() + lease_s
        await self.database.run(
            [
                (
                    "UPDATE shuniu_batch_items SET lease_until = ? "
                    "WHERE batch_id = ? AND idx = ? AND claim = ?",
                    [(until, i.batch_id, i.idx, i.claim) for i in items],
                )
            ]
        )

    async def finish(
        self, item: Item, state: str, status_code: int | None, response: bytes | None, request_id: str
    ) -> bool:
        """Record a request's result (``done`` or ``failed``), only while this claim holds
        it; whether it did."""
        changed = await self.database.execute(
            "UPDATE shuniu_batch_items SET state = ?, status_code = ?, response = ?, request_id = ?, "
            "claim = NULL, lease_until = NULL "
            "WHERE batch_id = ? AND idx = ? AND claim = ? AND state = 'running'",
            [state, status_code, response.decode() if response is not None else None, request_id,
             item.batch_id, item.idx, item.claim],
        )  # fmt: skip
        return bool(changed)

    async def retry_later(self, item: Item, delay_s: float, *, attempt: bool) -> None:
        """Give the request back, to be tried again after ``delay_s``; ``attempt``: it was
        tried (and refused for load), which counts against ``max_attempts``."""
        await self.database.execute(
            "UPDATE shuniu_batch_items SET state = 'pending', claim = NULL, lease_until = NULL, "
            "not_before = ?, attempts = attempts + ? "
            "WHERE batch_id = ? AND idx = ? AND claim = ? AND state = 'running'",
            [time.time() + delay_s, 1 if attempt else 0, item.batch_id, item.idx, item.claim],
        )

    async def end_open(self, batch_id: str, state: str, *, running_too: bool) -> None:
        """Every pending request (and running one, with ``running_too``) of the batch →
        ``state`` (``cancelled``, ``expired``)."""
        # Without running_too, a running request whose lease ran out ends too: its gateway
        # died, and a cancelled batch, whose requests nobody claims, would wait for it for ever.
        which = (
            "state IN ('pending', 'running')"
            if running_too
            else "(state = 'pending' OR (state = 'running' AND lease_until < ?))"
        )
        await self.database.execute(
            f"UPDATE shuniu_batch_items SET state = ?, claim = NULL WHERE batch_id = ? AND {which}",
            [state, batch_id] if running_too else [state, batch_id, time.time()],
        )

    async def results(self, batch_id: str) -> list[Result]:
        """(line, custom_id, state, status code, response, request id) of every request, in
        file order."""
        rows = await self.database.fetch(
            "SELECT idx, custom_id, state, status_code, response, request_id FROM shuniu_batch_items "
            "WHERE batch_id = ? ORDER BY idx",
            [batch_id],
        )
        return [(int(r[0]), r[1], r[2], r[3], r[4], r[5]) for r in rows]


def _record(row: Sequence[Any]) -> BatchRecord:
    return BatchRecord(
        id=row[0],
        tenant=row[1],
        principal=msgspec.json.decode(row[2], type=Principal),
        endpoint=row[3],
        input_file_id=row[4],
        completion_window=row[5],
        status=row[6],
        created_at=int(row[7]),
        expires_at=int(row[8]),
        times=json.loads(row[9]),
        output_file_id=row[10],
        error_file_id=row[11],
        metadata=json.loads(row[12]) if row[12] else None,
        errors=json.loads(row[13]) if row[13] else None,
    )
