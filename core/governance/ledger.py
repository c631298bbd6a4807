"""The usage ledger: every request's record, written to the database in batches, never on
the request's path.

:meth:`Ledger.observe` (a ``request_finished`` observer) turns a request's record into a
:class:`LedgerRecord` and appends it to a bounded buffer; one task writes the buffer in
batches of ``batch_size`` every ``flush_interval_s`` (sooner when a batch is full). A batch
leaves the buffer only once the database has committed it, so a database that is slow or
down costs memory (up to ``buffer_size`` records), not records; beyond that the newest are
dropped, counted and logged once per outage. Writes are idempotent, so a batch retried
after a lost acknowledgement is not doubled.

At a graceful shutdown the buffer is written; what the database cannot take then is
spilled to a file (``ledger-spill-*.msgpack`` next to the deployment) that the next start
writes first, so nothing is lost across a restart during an outage. Records are keyed by
an id of their own (random per process, then a counter), so writes are idempotent even when
clients reuse an ``x-request-id``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Callable
from itertools import islice
from pathlib import Path

import msgspec

from shuniu.core.config import LedgerConfig
from shuniu.core.governance.database import Database
from shuniu.core.governance.prices import Prices
from shuniu.core.governance.records import LedgerRecord
from shuniu.core.tasks import cancel_and_wait
from shuniu.core.types import RequestRecord

__all__ = ["Ledger", "gateway_name"]

log = logging.getLogger("shuniu.ledger")

_PRUNE_EVERY_S = 3600.0
_DAY = 86400.0


def gateway_name() -> str:
    """``host:pid``: which gateway wrote a record."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Ledger:
    """The buffer and the writer of one gateway."""

    def __init__(
        self,
        cfg: LedgerConfig,
        database: Database,
        prices: Prices,
        *,
        spill_dir: Path,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.cfg = cfg
        self.database = database
        self.prices = prices
        self.spill_dir = spill_dir
        self._clock = clock
        self._buffer: deque[LedgerRecord] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()
        self._gateway = gateway_name()
        self._prefix = secrets.token_hex(8) + "-"
        self._count = 0
        self._loop_offset: float | None = None
        self.connected = False
        """Whether the schema is in place and the last write succeeded."""
        self.degraded = False
        """The database failed the last write (records are being held)."""
        self.written = 0
        """Records committed by this gateway."""
        self.dropped = 0
        """Records dropped because the buffer was full."""
        self.write_errors = 0
        self._warned_full = False
        self._last_prune = 0.0

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    # -- the request path's side: cheap and synchronous ----------------------------------

    def observe(self, record: RequestRecord) -> None:
        """The ``request_finished`` observer: one record into the buffer."""
        if record.status >= 400 and not self.cfg.record_refused:
            return
        offset = self._loop_offset
        if offset is None:
            # The record's times are the event loop's; the ledger's are the wall clock's.
            offset = self._loop_offset = self._clock() - asyncio.get_running_loop().time()
        principal = record.principal
        served = record.pool
        cost = (
            0.0
            if record.cached
            else self.prices.cost(
                served or record.model, record.prompt_tokens, record.cached_tokens, record.completion_tokens
            )
        )
        self._count += 1
        rec = LedgerRecord(
            f"{self._prefix}{self._count:x}",
            record.id,
            record.finished + offset,
            principal.tenant,
            principal.key_id,
            principal.project,
            principal.tier,
            record.model,
            served,
            record.endpoint,
            record.api,
            record.status,
            str(record.outcome),
            record.error_code,
            record.prompt_tokens,
            record.cached_tokens,
            record.completion_tokens,
            cost,
            record.first_token - record.arrival if record.first_token is not None else None,
            max(0.0, record.finished - record.arrival),
            record.cached,
            self._gateway,
        )
        self.add(rec)

    def add(self, rec: LedgerRecord) -> None:
        buffer = self._buffer
        if len(buffer) >= self.cfg.buffer_size:
            self.dropped += 1
            if not self._warned_full:
                self._warned_full = True
                log.error(
                    "the ledger's buffer is full (%d records; the database %s is not keeping up or is "
                    "down): new records are dropped and counted in shuniu_ledger_dropped_total",
                    len(buffer),
                    self.database.url,
                )
            return
        buffer.append(rec)
        if len(buffer) >= self.cfg.batch_size:
            self._wake.set()

    # -- the writer ---------------------------------------------------------------------

    async def start(self) -> None:
        """Read any spill files, then run the writer (which connects and migrates first:
        a database that is down at start-up delays the records, not the gateway)."""
        self._read_spills()
        self._task = asyncio.create_task(self._run(), name="shuniu-ledger")

    async def _ensure_schema(self) -> None:
        if not self.connected:
            await self.database.connect()
            await self.database.migrate()
            self.connected = True

    async def _run(self) -> None:
        cfg = self.cfg
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel
            # that lands as the wait ends (the wake set at that moment), and stop() would
            # then wait for this task for ever.
            try:
                async with asyncio.timeout(cfg.flush_interval_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if not await self.flush():
                await asyncio.sleep(cfg.retry_interval_s)
                continue
            now = self._clock()
            if cfg.retention_days is not None and now - self._last_prune >= _PRUNE_EVERY_S:
                self._last_prune = now
                try:
                    await self.database.prune(now - cfg.retention_days * _DAY)
                except Exception as exc:
                    log.warning("pruning the ledger failed: %s", _reason(exc))

    async def flush(self) -> bool:
        """Write everything buffered now; ``False`` when the database failed (what was not
        written stays buffered)."""
        async with self._flushing:
            buffer = self._buffer
            try:
                await self._ensure_schema()
                while buffer:
                    batch = list(islice(buffer, self.cfg.batch_size))
                    await self.database.write(batch)
                    for _ in batch:
                        buffer.popleft()
                    self.written += len(batch)
            except Exception as exc:
                self.write_errors += 1
                if not self.degraded:
                    log.error(
                        "the ledger cannot write to %s (%s): %d records held, retried every %gs",
                        self.database.url,
                        _reason(exc),
                        len(buffer),
                        self.cfg.retry_interval_s,
                    )
                self.degraded = True
                self.connected = False
                return False
            if self.degraded:
                log.warning("the ledger writes to %s again", self.database.url)
            self.degraded = False
            self._warned_full = False
            return True

    async def stop(self) -> None:
        """Stop the writer, write what is left, spill what the database cannot take."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        if self._buffer and not await self.flush():
            self._spill()
        try:
            await self.database.close()
        except Exception as exc:
            log.warning("closing the ledger's database failed: %s", _reason(exc))

    # -- spill files --------------------------------------------------------------------

    def _spill(self) -> None:
        records = list(self._buffer)
        path = self.spill_dir / f"ledger-spill-{int(self._clock() * 1000)}-{os.getpid()}.msgpack"
        try:
            self.spill_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(msgspec.msgpack.encode(records))
            tmp.replace(path)
        except OSError as exc:
            log.error("the ledger could not write %d records anywhere (%s): they are lost", len(records), exc)
            return
        self._buffer.clear()
        log.warning(
            "the ledger's database is down: %d records kept in %s for the next start", len(records), path
        )

    def _read_spills(self) -> None:
        if not self.spill_dir.is_dir():
            return
        for path in sorted(self.spill_dir.glob("ledger-spill-*.msgpack")):
            try:
                records = msgspec.msgpack.decode(path.read_bytes(), type=list[LedgerRecord])
            except (OSError, msgspec.DecodeError) as exc:
                log.error("ledger spill file %s cannot be read (%s); left in place", path, exc)
                continue
            self._buffer.extendleft(reversed(records))
            path.unlink()
            log.warning("the ledger replays %d records kept in %s", len(records), path)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
