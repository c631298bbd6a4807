"""API keys managed at run time: created, rotated and revoked through the admin API,
stored hashed (SHA-256, as the deployment file's keys are) in the ledger's database, and
effective on every gateway within ``governance.keys.refresh_s``.

:class:`KeyTable` is the authenticator the gateway asks after the deployment's own (it is
synchronous and allocation-free: a digest and a dictionary lookup). :class:`KeyManager`
keeps it in step with the database (every gateway reads the rows changed since its last
read) and makes the changes the admin API asks for.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from shuniu.core.config import BudgetConfig, LimitsConfig, ManagedKeysConfig
from shuniu.core.governance.budgets import budget_of
from shuniu.core.governance.database import Database, KeyRow
from shuniu.core.tasks import cancel_and_wait
from shuniu.core.tenancy.auth import invalid_credentials
from shuniu.core.types import Limits, Principal

__all__ = ["KEY_PREFIX", "KeyManager", "KeyTable", "hash_key", "new_key"]

log = logging.getLogger("shuniu.keys")

KEY_PREFIX = "sk-shuniu-"
_OVERLAP_S = 60.0
"""Rows read again on each refresh (changed this long before the last one seen), so a
gateway whose clock is a little behind another's misses no change."""
_FULL_EVERY_S = 600.0


def new_key() -> str:
    """A fresh key: the prefix plus 256 random bits, URL-safe."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def principal_of(row: KeyRow) -> Principal:
    limits = None
    if row.limits:
        cfg = LimitsConfig.model_validate(row.limits)
        limits = Limits(cfg.rpm, cfg.rpd, cfg.tpm, cfg.tpd, cfg.concurrency)
    budgets = tuple(budget_of(BudgetConfig.model_validate(b)) for b in row.budgets or ())
    return Principal(
        tenant=row.tenant,
        key_id=row.id,
        tier=row.tier,
        models=frozenset(row.models) if row.models is not None else None,
        limits=limits,
        project=row.project,
        budgets=budgets,
    )


class KeyTable:
    """Managed keys by digest (implements the authenticator contract)."""

    __slots__ = ("_by_digest", "_clock", "rows")

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._by_digest: dict[bytes, tuple[bytes, Principal, float | None]] = {}
        """digest → (digest, principal, expires at)."""
        self.rows: dict[str, KeyRow] = {}
        """Key id → its row as last read (revoked keys included)."""
        self._clock = clock

    def __len__(self) -> int:
        return len(self._by_digest)

    def authenticate(self, credential: str, headers: Any) -> Principal | None:
        digest = hashlib.sha256(credential.encode("utf-8", "surrogateescape")).digest()
        entry = self._by_digest.get(digest)
        if entry is None or not hmac.compare_digest(entry[0], digest):
            return None
        expires = entry[2]
        if expires is not None and self._clock() >= expires:
            raise invalid_credentials("This API key has expired.")
        return entry[1]

    def apply(self, row: KeyRow) -> None:
        """Take ``row`` (new, changed or revoked) into the table."""
        old = self.rows.get(row.id)
        if old is not None:
            for h in (old.hash, old.previous_hash):
                if h is not None:
                    self._by_digest.pop(_digest(h), None)
        self.rows[row.id] = row
        if row.revoked_at is not None:
            return
        try:
            principal = principal_of(row)
        except ValueError as exc:  # a row another tool wrote badly: that key only is off
            log.error("managed key %r is not valid and is ignored: %s", row.id, exc)
            return
        digest = _digest(row.hash)
        self._by_digest[digest] = (digest, principal, row.expires_at)
        if row.previous_hash is not None and row.previous_expires_at is not None:
            old_digest = _digest(row.previous_hash)
            self._by_digest[old_digest] = (old_digest, principal, row.previous_expires_at)


def _digest(stored: str) -> bytes:
    return bytes.fromhex(stored.removeprefix("sha256:"))


class KeyManager:
    """The table, its refresh from the database, and the admin API's changes."""

    def __init__(
        self, cfg: ManagedKeysConfig, database: Database, clock: Callable[[], float] = time.time
    ) -> None:
        self.cfg = cfg
        self.database = database
        self.table = KeyTable(clock)
        self._clock = clock
        self._seen = 0.0
        self._full = 0.0
        self._task: asyncio.Task[None] | None = None
        self.loaded = False
        """Whether the table was read from the database at least once."""
        self._failing = False

    async def refresh(self) -> None:
        """Read the rows changed since the last read (all of them now and then)."""
        now = self._clock()
        full = now - self._full >= _FULL_EVERY_S
        since = 0.0 if full else max(0.0, self._seen - _OVERLAP_S)
        rows = await self.database.keys_changed(since)
        if full:
            self._full = now
            known = {row.id for row in rows}
            for gone in [k for k in self.table.rows if k not in known]:  # deleted by hand
                self.table.apply(KeyRow(**{**_fields(self.table.rows[gone]), "revoked_at": now}))
        for row in rows:
            if len(self.table.rows) >= self.cfg.max_keys and row.id not in self.table.rows:
                continue
            self.table.apply(row)
            self._seen = max(self._seen, row.updated_at)
        self.loaded = True

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="shuniu-keys")

    async def _run(self) -> None:
        while True:
            try:
                await self.refresh()
                if self._failing:
                    log.warning("managed keys: the database answers again")
                self._failing = False
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self._failing:
                    log.error(
                        "managed keys cannot be read from %s (%s): the keys read before keep working",
                        self.database.url,
                        type(exc).__name__,
                    )
                self._failing = True
            await asyncio.sleep(self.cfg.refresh_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    # -- changes ------------------------------------------------------------------------

    async def create(self, row: KeyRow) -> tuple[str, KeyRow]:
        """Store a new key with ``row``'s settings; the key itself (shown once) and its row."""
        key = new_key()
        now = self._clock()
        stored = KeyRow(**{**_fields(row), "hash": hash_key(key), "created_at": now, "updated_at": now})
        await self.database.insert_key(stored)
        self.table.apply(stored)
        return key, stored

    async def get(self, key_id: str) -> KeyRow | None:
        return await self.database.key(key_id)

    async def revoke(self, key_id: str) -> KeyRow | None:
        row = await self.database.key(key_id)
        if row is None:
            return None
        if row.revoked_at is None:
            now = self._clock()
            row = KeyRow(**{**_fields(row), "revoked_at": now, "updated_at": now})
            await self.database.update_key(row)
        self.table.apply(row)
        return row

    async def rotate(self, key_id: str, grace_s: float) -> tuple[str, KeyRow] | None:
        """A new secret for the key (same id, settings and budgets); the old one keeps
        working for ``grace_s``. ``None`` when there is no such key (or it is revoked)."""
        row = await self.database.key(key_id)
        if row is None or row.revoked_at is not None:
            return None
        key = new_key()
        now = self._clock()
        rotated = KeyRow(
            **{
                **_fields(row),
                "hash": hash_key(key),
                "previous_hash": row.hash if grace_s > 0 else None,
                "previous_expires_at": now + grace_s if grace_s > 0 else None,
                "updated_at": now,
            }
        )
        await self.database.update_key(rotated)
        self.table.apply(rotated)
        return key, rotated

    async def list(self) -> list[KeyRow]:
        return sorted(await self.database.keys_changed(0.0), key=lambda r: r.created_at)


def _fields(row: KeyRow) -> dict[str, Any]:
    return {name: getattr(row, name) for name in row.__struct_fields__}
