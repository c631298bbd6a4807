"""The usage ledger on a real SQLite file: batches, WAL mode, migrations, idempotent
writes, a locked (unavailable) database, a full buffer, and spill files across a restart."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest

from shuniu.core.config import LedgerConfig, PriceConfig
from shuniu.core.governance import (
    MIGRATIONS,
    Ledger,
    LedgerRecord,
    Prices,
    SchemaTooNewError,
    UsageQuery,
    open_database,
)
from shuniu.core.types import Outcome, Principal, RequestRecord


def _record(i: int, *, tenant: str = "acme", status: int = 200, cached: bool = False) -> RequestRecord:
    return RequestRecord(
        id=f"req-{i}",
        model="chat",
        api="chat",
        stream=False,
        status=status,
        outcome=Outcome.OK if status < 400 else Outcome.ERROR,
        error_code=None if status < 400 else "rate_limit_exceeded",
        prompt_tokens=100 if status < 400 else 0,
        completion_tokens=50 if status < 400 else 0,
        cached_tokens=40 if status < 400 else 0,
        arrival=1.0,
        first_token=1.2,
        finished=2.0,
        principal=Principal(tenant=tenant, key_id="k1", tier="pro", project="search"),
        pool="chat" if status < 400 else None,
        cached=cached,
    )


async def _until(check: Callable[[], object], within: float = 10.0) -> None:
    """Wait for a condition (polled on the event loop), failing after ``within`` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        if check():
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.005)


def _rows(path: Path) -> list[tuple]:  # type: ignore[type-arg]
    with sqlite3.connect(path) as conn:
        return conn.execute(
            "SELECT request_id, tenant, cost, cache_hit FROM shuniu_usage ORDER BY request_id"
        ).fetchall()


PRICES = Prices({"chat": PriceConfig(prompt=2.0, cached=0.5, completion=10.0)}, "USD")


def _ledger(path: Path, **cfg: object) -> Ledger:
    config = LedgerConfig(url=f"sqlite:///{path}", **cfg)  # type: ignore[arg-type]
    database = open_database(config.url, base=path.parent, timeout_s=config.timeout_s)
    return Ledger(config, database, PRICES, spill_dir=path.parent / "spill")


async def test_records_are_written_in_batches_in_wal_mode_with_their_cost(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = _ledger(path, batch_size=7, flush_interval_s=60)
    await ledger.start()
    for i in range(20):
        ledger.observe(_record(i))
    ledger.observe(_record(99, cached=True))
    ledger.observe(_record(100, status=429))
    # 20 records make two full batches, which wake the writer before the flush interval.
    await _until(lambda: ledger.written >= 14)
    assert ledger.buffered == 22 - ledger.written
    await ledger.stop()
    rows = _rows(path)
    assert len(rows) == 22
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    costs = {r[0]: r[2] for r in rows}
    # 60 uncached prompt tokens at 2/M, 40 cached at 0.5/M, 50 completion at 10/M.
    assert costs["req-1"] == pytest.approx((60 * 2 + 40 * 0.5 + 50 * 10) / 1e6)
    assert costs["req-99"] == 0.0  # the response cache's answer cost nothing
    assert costs["req-100"] == 0.0


async def test_refused_requests_are_left_out_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = _ledger(path, record_refused=False)
    await ledger.start()
    ledger.observe(_record(1))
    ledger.observe(_record(2, status=401))
    await ledger.stop()
    assert [r[0] for r in _rows(path)] == ["req-1"]


async def test_a_batch_written_twice_is_stored_once(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = _ledger(path)
    await ledger.start()
    for i in range(5):
        ledger.observe(_record(i))
    batch = list(ledger._buffer)
    await ledger.flush()
    await ledger.database.write(batch)  # a retry after a lost acknowledgement
    await ledger.stop()
    assert len(_rows(path)) == 5


async def test_two_requests_with_one_client_request_id_are_two_records(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = _ledger(path)
    await ledger.start()
    ledger.observe(_record(7))
    ledger.observe(_record(7))
    await ledger.stop()
    assert [r[0] for r in _rows(path)] == ["req-7", "req-7"]


async def test_a_locked_database_holds_records_then_writes_each_once(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = _ledger(path, timeout_s=0.2, retry_interval_s=0.05, flush_interval_s=0.05)
    await ledger.start()
    ledger.observe(_record(0))
    await _until(lambda: ledger.written >= 1)
    # Another process takes the database's write lock: every write now fails.
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    for i in range(1, 31):
        ledger.observe(_record(i))
    await _until(lambda: ledger.degraded)
    assert ledger.buffered == 30
    assert ledger.write_errors >= 1
    blocker.execute("ROLLBACK")
    blocker.close()
    await _until(lambda: ledger.buffered == 0)
    assert not ledger.degraded
    await ledger.stop()
    ids = [r[0] for r in _rows(path)]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(31))


async def test_a_full_buffer_drops_and_counts_the_newest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.db"
    ledger = _ledger(path, buffer_size=100, timeout_s=0.2, flush_interval_s=60, batch_size=1000)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("CREATE TABLE hold (x)")
    blocker.execute("BEGIN EXCLUSIVE")
    await ledger.start()
    for i in range(150):
        ledger.observe(_record(i))
    assert ledger.buffered == 100
    assert ledger.dropped == 50
    assert sum("buffer is full" in r.message for r in caplog.records) == 1  # logged once
    blocker.execute("ROLLBACK")
    blocker.close()
    await ledger.stop()
    assert len(_rows(path)) == 100


async def test_records_the_database_cannot_take_at_shutdown_are_spilled_then_replayed(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    first = _ledger(path, timeout_s=0.2, flush_interval_s=60)
    await first.start()
    await first.flush()  # the schema exists
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    for i in range(12):
        first.observe(_record(i))
    await first.stop()
    spills = list((tmp_path / "spill").glob("ledger-spill-*.msgpack"))
    assert len(spills) == 1
    blocker.execute("ROLLBACK")
    blocker.close()
    # The next start writes the spilled records first; the file is gone.
    second = _ledger(path)
    await second.start()
    await second.flush()
    await second.stop()
    assert not list((tmp_path / "spill").glob("*.msgpack"))
    assert sorted(r[0] for r in _rows(path)) == sorted(f"req-{i}" for i in range(12))


async def test_records_survive_a_restart_and_reports_total_them(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    for round_ in range(2):
        ledger = _ledger(path)
        await ledger.start()
        for i in range(10):
            ledger.observe(_record(round_ * 10 + i, tenant="acme" if i % 2 else "beta"))
        await ledger.stop()
    database = open_database(f"sqlite:///{path}", base=tmp_path, timeout_s=5)
    await database.connect()
    rows = await database.usage(UsageQuery(since=0, until=1e12, group_by=("tenant",)))
    await database.close()
    assert {r.groups["tenant"]: r.requests for r in rows} == {"acme": 10, "beta": 10}
    assert all(r.prompt_tokens == 1000 and r.completion_tokens == 500 for r in rows)


async def test_migrations_are_versioned_and_an_older_schema_is_brought_up(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = open_database(f"sqlite:///{path}", base=tmp_path, timeout_s=5)
    await old.connect()
    assert await old.migrate(upto=1) == 1
    await old.write(
        [
            LedgerRecord(
                "a",
                "r",
                1.0,
                "t",
                None,
                None,
                "default",
                "m",
                "m",
                None,
                "chat",
                200,
                "ok",
                None,
                1,
                0,
                1,
                0.0,
                None,
                0.1,
                False,
                "g",
            )
        ]
    )
    await old.close()
    with sqlite3.connect(path) as conn:
        assert "shuniu_keys" not in {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    ledger = _ledger(path)
    await ledger.start()
    await ledger.flush()
    assert await ledger.database.version() == MIGRATIONS[-1][0]
    await ledger.stop()
    with sqlite3.connect(path) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert {"shuniu_keys", "shuniu_usage", "shuniu_schema"} <= tables
        assert conn.execute("SELECT COUNT(*) FROM shuniu_usage").fetchone()[0] == 1
        versions = [r[0] for r in conn.execute("SELECT version FROM shuniu_schema ORDER BY version")]
    assert versions == [v for v, _what, _sql in MIGRATIONS]


async def test_a_schema_newer_than_this_shuniu_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE shuniu_schema (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO shuniu_schema VALUES (999)")
    database = open_database(f"sqlite:///{path}", base=tmp_path, timeout_s=5)
    with pytest.raises(SchemaTooNewError, match="999"):
        await database.migrate()
    await database.close()


async def test_usage_reports_filter_and_bucket_by_day(tmp_path: Path) -> None:
    database = open_database("sqlite:///r.db", base=tmp_path, timeout_s=5)
    await database.connect()
    await database.migrate()
    day = 86400.0
    records = [
        LedgerRecord(
            f"id{i}",
            f"r{i}",
            10 * day + i * day / 2,
            "acme" if i % 3 else "beta",
            f"k{i % 2}",
            None,
            "pro",
            "chat",
            "chat",
            "e0",
            "chat",
            429 if i == 5 else 200,
            "ok",
            None,
            10,
            0,
            5,
            0.25,
            0.1,
            0.5,
            False,
            "g",
        )
        for i in range(6)
    ]
    await database.write(records)
    rows = await database.usage(UsageQuery(since=0, until=1e12, tenant="acme", group_by=("day",)))
    # acme: i = 1, 2, 4, 5 → days 10 (i=1), 11 (i=2), 12 (i=4, 5).
    assert [
        (r.groups["day"], r.requests, r.refused) for r in sorted(rows, key=lambda r: r.groups["day"])
    ] == [("1970-01-11", 1, 0), ("1970-01-12", 1, 0), ("1970-01-13", 2, 1)]
    rows = await database.usage(UsageQuery(since=11 * day, until=12 * day, group_by=("key",)))
    assert {r.groups["key"]: r.requests for r in rows} == {"k0": 1, "k1": 1}
    assert await database.usage(UsageQuery(since=0, until=1, group_by=())) == []
    await database.close()
