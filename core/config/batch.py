"""The ``files:`` and ``batches:`` sections: the Files API's store and limits, and the
Batch API's queue and how it uses idle capacity (``docs/batch.md``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from shuniu.core.config.base import Strict as _Strict
from shuniu.core.config.governance import check_database_url
from shuniu.core.redis_client import check_redis_url

__all__ = ["BatchesConfig", "FilesConfig"]


class FilesConfig(_Strict):
    """Uploaded files (``POST /v1/files``) and the files the gateway writes."""

    enabled: bool = True
    """Serve the Files API (``/v1/files``)."""
    store: str = "local"
    """A registered file store: ``local`` (a folder on this host's disk)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that store, validated by it (``local``: ``dir``)."""
    max_file_bytes: int = Field(200 * 1024 * 1024, ge=1024)
    """Largest upload; a larger one gets 413."""
    max_batch_lines: int = Field(50_000, ge=1)
    """Most requests in one ``batch`` input file."""


class BatchesConfig(_Strict):
    """The Batch API (``/v1/batches``): jobs kept in a durable queue and run on capacity
    interactive traffic does not need."""

    enabled: bool = True
    """Serve the Batch API (needs ``files.enabled``)."""
    database: str = "sqlite:///shuniu-batches.db"
    """Where batches and their requests are kept: ``sqlite:///PATH`` (relative to the
    deployment file's folder; the embedded default), or one queue for the gateways of a
    fleet (any gateway works on any batch): ``postgresql://...``, or a Redis URL
    (``redis://``, ``redis+sentinel://``, ``redis+cluster://``: Redis Streams with a
    consumer group)."""
    tier: str = "batch"
    """The tier batch requests run in: its priority and limits apply to them (the key's
    own limits and budgets too). Without a tier of that name in ``tiers:``, one with the
    lowest priority (``priority`` below) and no limits is added."""
    priority: int = 1_000_000
    """The added tier's scheduling priority (larger runs later): behind every interactive
    request."""
    concurrency: int = Field(8, ge=1, le=10_000)
    """Batch requests this gateway runs at once, at most."""
    headroom: float = Field(0.25, ge=0, lt=1)
    """Share of a pool's concurrency slots always kept for interactive traffic (besides its
    recent peak, ``burst_window_s``); a batch request starts only while nothing is queued."""
    burst_window_s: float = Field(60.0, gt=0)
    """Batch requests leave free as many slots as the most interactive requests the pool
    ran at once over this long (a burst that comes back finds its slots: a batch request is
    never preempted), besides ``headroom``."""
    lease_s: float = Field(60.0, gt=0)
    """A request a gateway took but has not finished (and not renewed) for this long is
    taken by another gateway (or this one after a restart): work of a gateway that died is
    redone."""
    poll_interval_s: float = Field(0.5, gt=0, le=60)
    """How often the runner looks for work and room."""
    max_attempts: int = Field(5, ge=1)
    """Tries of one request that the gateway refused for load (429 queue_full, 503) before
    it is recorded as failed."""

    @field_validator("database")
    @classmethod
    def _url(cls, url: str) -> str:
        if url.startswith(("redis", "rediss", "unix")):
            return check_redis_url(url)
        try:
            return check_database_url(url)
        except ValueError as exc:
            raise ValueError(f"{exc}, or a Redis URL (redis://HOST:PORT/DB)") from None
