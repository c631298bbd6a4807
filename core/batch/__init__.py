"""The Batch API's engine: the durable queue (:mod:`.queue`, the contract; :mod:`.store`,
in SQLite or PostgreSQL; :mod:`.redis_queue`, in Redis Streams), the runner that works on it
on idle capacity (:mod:`.runner`), and the objects the API answers (:mod:`.objects`)
(``docs/batch.md``)."""

from __future__ import annotations

from shuniu.core.batch.objects import batch_object, output_line, parse_window
from shuniu.core.batch.queue import TERMINAL, BatchQueue, BatchRecord, Item, Result
from shuniu.core.batch.redis_queue import RedisBatchQueue
from shuniu.core.batch.runner import BatchRunner
from shuniu.core.batch.store import BATCH_MIGRATIONS, SqlBatchQueue

__all__ = [
    "BATCH_MIGRATIONS",
    "TERMINAL",
    "BatchQueue",
    "BatchRecord",
    "BatchRunner",
    "Item",
    "RedisBatchQueue",
    "Result",
    "SqlBatchQueue",
    "batch_object",
    "output_line",
    "parse_window",
]
