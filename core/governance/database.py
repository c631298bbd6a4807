"""The ledger's database, whatever its engine: the schema and its versioned migrations,
the SQL every engine shares; the engines are :mod:`.sqlite` and :mod:`.postgres`, chosen from
the URL by :func:`shuniu.core.governance.engines.open_database`.

The schema is two tables: ``shuniu_usage`` (one row per request, keyed by the record's own
id, so a batch written twice is written once) and ``shuniu_keys`` (API keys managed at run time, by
the SHA-256 of the key, never the key). ``shuniu_schema`` holds the version; each start
applies, in one transaction each, the migrations above it. A database newer than this
shuniu is refused (an older gateway must not write rows it does not understand).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import msgspec

from shuniu.core.governance.records import GROUPS, LedgerRecord, UsageQuery, UsageRow

__all__ = ["MIGRATIONS", "Database", "KeyRow", "SchemaTooNewError"]

MIGRATIONS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (
        1,
        "the usage ledger",
        (
            """CREATE TABLE shuniu_usage (
                id TEXT PRIMARY KEY,
                request_id TEXT NOT NULL,
                ts DOUBLE PRECISION NOT NULL,
                tenant TEXT NOT NULL,
                key_id TEXT,
                project TEXT,
                tier TEXT NOT NULL,
                model TEXT NOT NULL,
                served TEXT,
                endpoint TEXT,
                api TEXT NOT NULL,
                status INTEGER NOT NULL,
                outcome TEXT NOT NULL,
                error_code TEXT,
                prompt_tokens BIGINT NOT NULL,
                cached_tokens BIGINT NOT NULL,
                completion_tokens BIGINT NOT NULL,
                cost DOUBLE PRECISION NOT NULL,
                ttft_s DOUBLE PRECISION,
                duration_s DOUBLE PRECISION NOT NULL,
                cache_hit INTEGER NOT NULL,
                gateway TEXT NOT NULL
            )""",
            "CREATE INDEX shuniu_usage_ts ON shuniu_usage (ts)",
            "CREATE INDEX shuniu_usage_tenant_ts ON shuniu_usage (tenant, ts)",
            "CREATE INDEX shuniu_usage_key_ts ON shuniu_usage (key_id, ts)",
        ),
    ),
    (
        2,
        "API keys managed at run time",
        (
            """CREATE TABLE shuniu_keys (
                id TEXT PRIMARY KEY,
                hash TEXT NOT NULL UNIQUE,
                tenant TEXT NOT NULL,
                tier TEXT NOT NULL,
                project TEXT,
                models TEXT,
                limits TEXT,
                budgets TEXT,
                description TEXT,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                expires_at DOUBLE PRECISION,
                revoked_at DOUBLE PRECISION,
                previous_hash TEXT,
                previous_expires_at DOUBLE PRECISION
            )""",
            "CREATE INDEX shuniu_keys_updated ON shuniu_keys (updated_at)",
        ),
    ),
    (
        3,
        "usage by project",
        ("CREATE INDEX shuniu_usage_project_ts ON shuniu_usage (project, ts)",),
    ),
)
"""(version, what it adds, statements), oldest first. Append only: a released migration is
never edited, a change is a new one."""

_COLUMNS = tuple(LedgerRecord.__struct_fields__)
_KEY_COLUMNS = (
    "id",
    "hash",
    "tenant",
    "tier",
    "project",
    "models",
    "limits",
    "budgets",
    "description",
    "created_at",
    "updated_at",
    "expires_at",
    "revoked_at",
    "previous_hash",
    "previous_expires_at",
)


class SchemaTooNewError(RuntimeError):
    """The database was migrated by a newer shuniu."""


class KeyRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One managed key as stored (``hash``: ``sha256:<hex>`` of the key)."""

    id: str
    hash: str
    tenant: str
    tier: str = "default"
    project: str | None = None
    models: list[str] | None = None
    limits: dict[str, int] | None = None
    budgets: list[dict[str, Any]] | None = None
    description: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0
    expires_at: float | None = None
    revoked_at: float | None = None
    previous_hash: str | None = None
    """The key's hash before its last rotation, still accepted until
    ``previous_expires_at``."""
    previous_expires_at: float | None = None

    def to_params(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.hash,
            self.tenant,
            self.tier,
            self.project,
            json.dumps(self.models) if self.models is not None else None,
            json.dumps(self.limits) if self.limits is not None else None,
            json.dumps(self.budgets) if self.budgets is not None else None,
            self.description,
            self.created_at,
            self.updated_at,
            self.expires_at,
            self.revoked_at,
            self.previous_hash,
            self.previous_expires_at,
        )

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> KeyRow:
        values = dict(zip(_KEY_COLUMNS, row, strict=True))
        for name in ("models", "limits", "budgets"):
            if values[name] is not None:
                values[name] = json.loads(values[name])
        return cls(**{k: v for k, v in values.items() if v is not None})


class Database:
    """The SQL the engines share. A subclass supplies the connection (:meth:`_run_many`,
    :meth:`_fetch`, :meth:`_transaction`) and its dialect (placeholders, time buckets)."""

    url: str
    """The URL with any password removed (for logs and ``/ready``)."""

    # -- what an engine provides --------------------------------------------------------

    async def connect(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        raise NotImplementedError

    async def _transaction(self, statements: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> None:
        """Run each ``(sql, rows of parameters)`` (``executemany``) in one transaction."""
        raise NotImplementedError

    def _sql(self, sql: str) -> str:
        """``sql`` written with ``?`` placeholders, in the engine's own."""
        return sql

    def _bucket(self, unit: str) -> str:
        """An SQL expression: ``ts`` truncated to the UTC ``day`` or ``hour``, as text."""
        raise NotImplementedError

    # -- the schema ---------------------------------------------------------------------

    async def migrate(
        self,
        upto: int | None = None,
        *,
        migrations: Sequence[tuple[int, str, Sequence[str]]] = MIGRATIONS,
        table: str = "shuniu_schema",
        what: str = "the ledger",
    ) -> int:
        """Apply the ``migrations`` above the version recorded in ``table`` (up to
        ``upto``); the version it is at afterwards. The ledger's are the default; the batch
        queue keeps its own (``shuniu_batch_schema``) in the same way."""
        await self._transaction([(f"CREATE TABLE IF NOT EXISTS {table} (version INTEGER NOT NULL)", [()])])
        rows = await self._fetch(f"SELECT MAX(version) FROM {table}")
        current = int(rows[0][0]) if rows and rows[0][0] is not None else 0
        newest = migrations[-1][0]
        if current > newest:
            raise SchemaTooNewError(
                f"the schema of {what} is version {current}, newer than this shuniu knows ({newest}); "
                "upgrade shuniu"
            )
        for version, _what, statements in migrations:
            if version <= current or (upto is not None and version > upto):
                continue
            await self._transaction(
                [
                    *((stmt, [()]) for stmt in statements),
                    (self._sql(f"INSERT INTO {table} (version) VALUES (?)"), [(version,)]),
                ]
            )
            current = version
        return current

    async def fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Sequence[Any]]:
        """Rows of ``sql`` (written with ``?`` placeholders)."""
        return await self._fetch(self._sql(sql), params)

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement (``?`` placeholders) in its own transaction; the rows it
        changed."""
        return await self._execute(self._sql(sql), params)

    async def _execute(self, sql: str, params: Sequence[Any]) -> int:
        raise NotImplementedError

    async def run(self, statements: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> None:
        """Each ``(sql, rows of parameters)`` (``?`` placeholders), in one transaction."""
        await self._transaction([(self._sql(sql), rows) for sql, rows in statements])

    async def version(self) -> int:
        rows = await self._fetch("SELECT MAX(version) FROM shuniu_schema")
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    # -- the ledger ---------------------------------------------------------------------

    async def write(self, records: Sequence[LedgerRecord]) -> None:
        """Insert ``records`` in one transaction; a record id already there is skipped."""
        sql = self._sql(
            f"INSERT INTO shuniu_usage ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))}) "
            "ON CONFLICT (id) DO NOTHING"
        )
        await self._transaction([(sql, [self._row(r) for r in records])])

    def _row(self, record: LedgerRecord) -> tuple[Any, ...]:
        """A record as the engine's parameters (SQLite takes a bool for an integer)."""
        return msgspec.structs.astuple(record)

    async def prune(self, before: float) -> None:
        """Delete the records older than ``before``."""
        await self._transaction([(self._sql("DELETE FROM shuniu_usage WHERE ts < ?"), [(before,)])])

    async def usage(self, q: UsageQuery) -> list[UsageRow]:
        """The totals of the records matching ``q``, one row per group, largest cost first."""
        where = ["ts >= ?", "ts < ?"]
        params: list[Any] = [q.since, q.until]
        for column, value in (("tenant", q.tenant), ("key_id", q.key_id), ("project", q.project)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if q.model is not None:
            where.append("(model = ? OR served = ?)")
            params += [q.model, q.model]
        groups = [self._bucket(g) if g in ("day", "hour") else GROUPS[g] for g in q.group_by]
        select = ", ".join(
            [
                *groups,
                "COUNT(*)",
                "SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END)",
                "SUM(prompt_tokens)",
                "SUM(cached_tokens)",
                "SUM(completion_tokens)",
                "SUM(cost)",
            ]
        )
        sql = f"SELECT {select} FROM shuniu_usage WHERE {' AND '.join(where)}"
        if groups:
            sql += f" GROUP BY {', '.join(groups)}"
        sql += f" ORDER BY {len(groups) + 6} DESC, {len(groups) + 1} DESC LIMIT {int(q.limit)}"
        out = []
        n = len(groups)
        for row in await self._fetch(self._sql(sql), params):
            if not row[n]:
                continue  # no matching record: the aggregate row of an empty table
            prompt, cached, completion = (int(row[n + i] or 0) for i in (2, 3, 4))
            out.append(
                UsageRow(
                    requests=int(row[n]),
                    refused=int(row[n + 1] or 0),
                    prompt_tokens=prompt,
                    cached_tokens=cached,
                    completion_tokens=completion,
                    total_tokens=prompt + completion,
                    cost=round(float(row[n + 5] or 0.0), 6),
                    groups=dict(zip(q.group_by, row[:n], strict=True)),
                )
            )
        return out

    async def spent_since(self, since: float) -> list[tuple[str, str | None, str | None, int, float]]:
        """(tenant, key id, project, tokens, cost) of the records since ``since`` that count
        against budgets (not answered from the response cache), for reconciling counters."""
        rows = await self._fetch(
            self._sql(
                "SELECT tenant, key_id, project, SUM(prompt_tokens + completion_tokens), SUM(cost) "
                "FROM shuniu_usage WHERE ts >= ? AND cache_hit = 0 GROUP BY tenant, key_id, project"
            ),
            [since],
        )
        return [(r[0], r[1], r[2], int(r[3] or 0), float(r[4] or 0.0)) for r in rows]

    # -- managed keys -------------------------------------------------------------------

    async def keys_changed(self, since: float) -> list[KeyRow]:
        """Keys created or changed at ``since`` or later (every key for ``since`` 0)."""
        rows = await self._fetch(
            self._sql(f"SELECT {', '.join(_KEY_COLUMNS)} FROM shuniu_keys WHERE updated_at >= ?"), [since]
        )
        return [KeyRow.from_row(r) for r in rows]

    async def key(self, key_id: str) -> KeyRow | None:
        rows = await self._fetch(
            self._sql(f"SELECT {', '.join(_KEY_COLUMNS)} FROM shuniu_keys WHERE id = ?"), [key_id]
        )
        return KeyRow.from_row(rows[0]) if rows else None

    async def insert_key(self, row: KeyRow) -> None:
        """Add a key (an id or hash already there raises the engine's integrity error)."""
        marks = ", ".join("?" * len(_KEY_COLUMNS))
        sql = self._sql(f"INSERT INTO shuniu_keys ({', '.join(_KEY_COLUMNS)}) VALUES ({marks})")
        await self._transaction([(sql, [row.to_params()])])

    async def update_key(self, row: KeyRow) -> None:
        """Write every field of the key ``row.id``."""
        sets = ", ".join(f"{c} = ?" for c in _KEY_COLUMNS[1:])
        params = (*row.to_params()[1:], row.id)
        await self._transaction([(self._sql(f"UPDATE shuniu_keys SET {sets} WHERE id = ?"), [params])])
