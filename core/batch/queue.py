"""The batch queue's contract: what the Batch API's views and the runner ask of the place
batches and their requests are kept, whatever keeps them.

Two queues implement it: :class:`~shuniu.core.batch.store.SqlBatchQueue` (SQLite, the
embedded default, or PostgreSQL shared by a fleet) and
:class:`~shuniu.core.batch.redis_queue.RedisBatchQueue` (Redis Streams with a consumer
group, for fleets that run Redis). Both give the same guarantees: a request **claimed** by
one gateway is taken by no other while that gateway renews its claim; one whose gateway
died is taken again once its lease runs out (at least once); and a request's result is
recorded once, so a batch's output has every ``custom_id`` exactly once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from shuniu.core.types import Principal

__all__ = ["TERMINAL", "BatchQueue", "BatchRecord", "Item", "Result"]

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
"""Batch statuses that never change again."""

Result = tuple[int, str, str, int | None, str | None, str | None]
"""(line, custom_id, state, status code, response, request id) of one request."""


class BatchRecord(msgspec.Struct, kw_only=True):
    """A batch as stored."""

    id: str
    tenant: str
    principal: Principal
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    expires_at: int
    times: dict[str, int]
    """Status → when the batch entered it (``in_progress_at``, ...)."""
    output_file_id: str | None = None
    error_file_id: str | None = None
    metadata: dict[str, str] | None = None
    errors: list[dict[str, Any]] | None = None


class Item(msgspec.Struct):
    """One claimed request of a batch."""

    batch_id: str
    idx: int
    """Its line in the input file, from 0."""
    custom_id: str
    body: bytes
    attempts: int
    """Tries the gateway refused for load so far."""
    claim: str
    """What proves the claim (a claim token; a stream entry id): only its holder records
    the result or gives the request back."""


class BatchQueue(Protocol):
    """Batches and their requests. Request states: ``pending``, ``running``, ``done``,
    ``failed``, and ``cancelled`` / ``expired`` for those a batch's end left unrun."""

    opened: bool
    """Whether :meth:`open` ran (and :meth:`close` has something to release)."""

    def exists(self) -> bool:
        """Whether there is a queue to read (an embedded SQLite file is created by the
        first batch, not by a gateway that never gets one)."""
        ...

    async def open(self) -> None:
        """Connect, and create or migrate what the queue needs (once)."""
        ...

    async def close(self) -> None: ...

    # -- batches ------------------------------------------------------------------------

    async def create(self, batch: BatchRecord) -> None: ...

    async def get(self, batch_id: str) -> BatchRecord | None: ...

    async def list(self, tenant: str | None) -> list[BatchRecord]:
        """The tenant's batches (every tenant's with ``None``), in no particular order."""
        ...

    async def with_status(self, *statuses: str) -> list[BatchRecord]: ...

    async def move(self, batch: BatchRecord, frm: Sequence[str], to: str, **fields: Any) -> bool:
        """Set the batch's status ``to`` if it is one of ``frm`` (and ``fields``: output and
        error file ids, errors), updating ``batch``; whether this call made the change (so
        one gateway does each step)."""
        ...

    async def counts(self, batch_ids: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
        """Batch id → request state → how many (every batch's with ``None``)."""
        ...

    # -- requests -----------------------------------------------------------------------

    async def add_items(self, batch_id: str, lines: Sequence[tuple[str, bytes]]) -> None:
        """The batch's requests, in file order: (custom_id, body). Adding them again (a
        validation that a dead gateway left half done) adds none twice."""
        ...

    async def claim(self, batch_ids: Sequence[str], n: int, lease_s: float) -> list[Item]:
        """Take up to ``n`` requests of these (running) batches: pending ones that may start,
        and running ones whose lease ran out."""
        ...

    async def renew(self, items: Sequence[Item], lease_s: float) -> None:
        """Extend the lease of requests this gateway still holds."""
        ...

    async def finish(
        self, item: Item, state: str, status_code: int | None, response: bytes | None, request_id: str
    ) -> bool:
        """Record a request's result (``done`` or ``failed``) unless one is recorded or the
        batch ended meanwhile; whether this call recorded it."""
        ...

    async def retry_later(self, item: Item, delay_s: float, *, attempt: bool) -> None:
        """Give the request back, to be tried again after ``delay_s``; ``attempt``: it was
        tried (and refused for load), which counts against ``max_attempts``."""
        ...

    async def end_open(self, batch_id: str, state: str, *, running_too: bool) -> None:
        """Every pending request (and running one, with ``running_too``) of the batch →
        ``state`` (``cancelled``, ``expired``)."""
        ...

    async def results(self, batch_id: str) -> list[Result]:
        """Every request's result or end, in file order."""
        ...
