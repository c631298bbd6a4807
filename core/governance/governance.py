"""One gateway's governance: the ledger, prices, budgets and managed keys, built from the
deployment's ``governance:`` section, started and stopped with the gateway, and kept
across reloads (a change to the section takes a restart)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from shuniu.core.config import GovernanceConfig
from shuniu.core.governance.budgets import Budgets, window_start
from shuniu.core.governance.counters import Counters, MemoryCounters, RedisCounters
from shuniu.core.governance.database import Database
from shuniu.core.governance.engines import open_database
from shuniu.core.governance.keys import KeyManager
from shuniu.core.governance.ledger import Ledger
from shuniu.core.governance.prices import Prices
from shuniu.core.tasks import cancel_and_wait

__all__ = ["Governance"]

log = logging.getLogger("shuniu.governance")

_PERIODS = ("day", "month", "total")
_FIRST_READ_S = 5.0
"""Longest start-up waits for the key table and the first reconciliation (a database that
is down delays them, never the gateway)."""


class Governance:
    """The ledger, the budgets (with their counters) and the managed keys of one gateway."""

    def __init__(
        self,
        cfg: GovernanceConfig,
        *,
        base: Path,
        default_output_tokens: int,
        keys_enabled: bool,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.prices = Prices(cfg.prices, cfg.currency)
        self.database: Database | None = None
        self.ledger: Ledger | None = None
        if cfg.ledger is not None:
            self.database = open_database(cfg.ledger.url, base=base, timeout_s=cfg.ledger.timeout_s)
            self.ledger = Ledger(
                cfg.ledger, self.database, self.prices, spill_dir=base / ".shuniu-ledger-spill", clock=clock
            )
        self.counters: Counters = (
            RedisCounters(cfg.redis_url, settle_interval_s=cfg.settle_interval_s)
            if cfg.redis_url is not None
            else MemoryCounters()
        )
        self.budgets = Budgets(cfg, self.counters, self.prices, default_output_tokens)
        self.keys: KeyManager | None = None
        if keys_enabled:
            assert self.database is not None  # the config check says keys need a ledger
            self.keys = KeyManager(cfg.keys, self.database, clock)
        self._clock = clock
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.counters.start()
        if self.ledger is not None:
            await self.ledger.start()
            try:
                async with asyncio.timeout(_FIRST_READ_S):
                    await self.ledger.flush()  # spilled records first: they count in budgets
                    if self.keys is not None:
                        await self.keys.refresh()
                    await self.reconcile()
            except Exception as exc:
                log.error(
                    "governance: the ledger's database %s is not answering at start-up (%s); budgets "
                    "count from zero and only the deployment's keys work until it does",
                    self.database.url if self.database is not None else "?",
                    type(exc).__name__,
                )
            if self.keys is not None:
                await self.keys.start()
            self._task = asyncio.create_task(self._reconcile_loop(), name="shuniu-budget-reconcile")

    async def reconcile(self) -> None:
        """Raise every budget counter of the current windows to what the ledger holds."""
        if self.database is None:
            return
        now = self._clock()
        for period in _PERIODS:
            spent = await self.database.spent_since(window_start(period, now))
            await self.counters.raise_to(self.budgets.reconcile_values(period, spent, now))

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.reconcile_s)
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("budget reconciliation failed: %s", exc)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self.keys is not None:
            await self.keys.stop()
        if self.ledger is not None:
            await self.ledger.stop()
        await self.counters.close()
