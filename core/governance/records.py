"""What the ledger stores and answers: one :class:`LedgerRecord` per request, and the
questions (:class:`UsageQuery`) reports ask of it."""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["GROUPS", "LedgerRecord", "UsageQuery", "UsageRow"]


class LedgerRecord(msgspec.Struct, array_like=True, frozen=True):
    """One finished or refused request. ``array_like``: a buffered record costs one small
    tuple, and spilled to a file at shutdown it is a short msgpack array."""

    id: str
    """The record's own id (unique per gateway process and record): the primary key, so
    writing a batch twice (a retry after a lost acknowledgement, a spill file replayed)
    never doubles a record."""
    request_id: str
    """The request's id (``x-request-id``, the client's when it sent one)."""
    ts: float
    """When the request ended, in seconds since 1970 (UTC)."""
    tenant: str
    key_id: str | None
    project: str | None
    tier: str
    model: str
    """The model the client asked for (a name or an alias)."""
    served: str | None
    """The model (pool) that served it; ``None`` when refused before one was known."""
    endpoint: str | None
    api: str
    status: int
    outcome: str
    error_code: str | None
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost: float
    ttft_s: float | None
    duration_s: float
    cache_hit: bool
    """Answered from the response cache: recorded, but it costs nothing and counts
    against no budget."""
    gateway: str
    """The gateway (host and process) that wrote it."""


GROUPS: dict[str, str] = {
    "tenant": "tenant",
    "key": "key_id",
    "project": "project",
    "tier": "tier",
    "model": "model",
    "served": "served",
    "endpoint": "endpoint",
    "status": "status",
    "api": "api",
    "gateway": "gateway",
}
"""What a report may group by (besides ``day`` and ``hour``) → the column."""

Bucket = Literal["day", "hour"]


class UsageQuery(msgspec.Struct, kw_only=True):
    """A report's question: a time range, filters, grouping."""

    since: float
    until: float
    tenant: str | None = None
    key_id: str | None = None
    project: str | None = None
    model: str | None = None
    group_by: tuple[str, ...] = ()
    """Names of :data:`GROUPS`, and ``day`` or ``hour`` for a time series."""
    limit: int = 1000


class UsageRow(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One group's totals."""

    requests: int
    refused: int
    """Requests answered with a status of 400 or more."""
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    total_tokens: int
    cost: float
    groups: dict[str, str | int | None] = msgspec.field(default_factory=dict)
