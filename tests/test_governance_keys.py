"""Keys managed at run time, on a real SQLite file: created, read by a second gateway,
expired, rotated with a grace period, revoked; stored only as hashes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from shuniu.core.config import ManagedKeysConfig
from shuniu.core.errors import GatewayError
from shuniu.core.governance import KeyManager, KeyRow, open_database
from shuniu.core.types import Budget, Limits


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _manager(path: Path, clock: Clock) -> KeyManager:
    database = open_database(f"sqlite:///{path}", base=path.parent, timeout_s=5)
    await database.connect()
    await database.migrate()
    return KeyManager(ManagedKeysConfig(), database, clock)


def _spec(**fields: object) -> KeyRow:
    return KeyRow(id=str(fields.pop("id", "acme-ci")), hash="", tenant="acme", **fields)  # type: ignore[arg-type]


async def test_a_created_key_authenticates_here_and_on_another_gateway_after_a_refresh(
    tmp_path: Path,
) -> None:
    clock = Clock()
    here, there = await _manager(tmp_path / "k.db", clock), await _manager(tmp_path / "k.db", clock)
    await there.refresh()
    spec = _spec(
        tier="pro",
        project="search",
        models=["chat"],
        limits={"rpm": 60},
        budgets=[{"period": "day", "tokens": 500}],
    )
    key, row = await here.create(spec)
    assert key.startswith("sk-shuniu-") and row.hash.startswith("sha256:")
    principal = here.table.authenticate(key, [])
    assert principal is not None
    assert (principal.tenant, principal.key_id, principal.tier, principal.project) == (
        "acme",
        "acme-ci",
        "pro",
        "search",
    )
    assert principal.models == frozenset({"chat"})
    assert principal.limits == Limits(rpm=60)
    assert principal.budgets == (Budget(period="day", tokens=500),)
    assert there.table.authenticate(key, []) is None  # not read yet
    clock.now += 1
    await there.refresh()
    assert there.table.authenticate(key, []) == principal
    # Only the hash is stored.
    with sqlite3.connect(tmp_path / "k.db") as conn:
        dump = "\n".join(conn.iterdump())
    assert key not in dump and row.hash in dump


async def test_an_expired_key_is_refused_with_a_reason(tmp_path: Path) -> None:
    clock = Clock()
    keys = await _manager(tmp_path / "k.db", clock)
    key, _row = await keys.create(_spec(expires_at=clock.now + 60))
    assert keys.table.authenticate(key, []) is not None
    clock.now += 61
    with pytest.raises(GatewayError) as refused:
        keys.table.authenticate(key, [])
    assert refused.value.status == 401 and "expired" in refused.value.message


async def test_rotating_keeps_the_old_secret_for_the_grace_period_only(tmp_path: Path) -> None:
    clock = Clock()
    keys = await _manager(tmp_path / "k.db", clock)
    old, _ = await keys.create(_spec())
    rotated = await keys.rotate("acme-ci", grace_s=300)
    assert rotated is not None
    new, row = rotated
    assert new != old and row.id == "acme-ci"
    assert keys.table.authenticate(new, []) is not None
    assert keys.table.authenticate(old, []) is not None
    clock.now += 301
    with pytest.raises(GatewayError):
        keys.table.authenticate(old, [])
    assert keys.table.authenticate(new, []) is not None
    # Without a grace period the old secret stops at once.
    newer, _ = await keys.rotate("acme-ci", grace_s=0) or ("", None)
    assert keys.table.authenticate(new, []) is None
    assert keys.table.authenticate(newer, []) is not None


async def test_a_revoked_key_stops_on_every_gateway_within_a_refresh(tmp_path: Path) -> None:
    clock = Clock()
    here, there = await _manager(tmp_path / "k.db", clock), await _manager(tmp_path / "k.db", clock)
    key, _ = await here.create(_spec())
    await there.refresh()
    assert there.table.authenticate(key, []) is not None
    clock.now += 5
    revoked = await here.revoke("acme-ci")
    assert revoked is not None and revoked.revoked_at == clock.now
    assert here.table.authenticate(key, []) is None
    await there.refresh()
    assert there.table.authenticate(key, []) is None
    assert await here.rotate("acme-ci", 0) is None  # a revoked key cannot come back
    assert [r.id for r in await here.list()] == ["acme-ci"]  # kept, for reports


async def test_ids_and_hashes_are_unique(tmp_path: Path) -> None:
    keys = await _manager(tmp_path / "k.db", Clock())
    await keys.create(_spec())
    with pytest.raises(sqlite3.IntegrityError):
        await keys.create(_spec())
