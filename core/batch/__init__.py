"""The Batch API's engine: the durable queue (:mod:`.store`), the runner that works on it
on idle capacity (:mod:`.runner`), and the objects the API answers (:mod:`.objects`)
(``docs/batch.md``)."""

from __future__ import annotations

from shuniu.core.batch.objects import batch_object, output_line, parse_window
from shuniu.core.batch.runner import BatchRunner
from shuniu.core.batch.store import BATCH_MIGRATIONS, TERMINAL, BatchRecord, BatchStore, Item

__all__ = [
    "BATCH_MIGRATIONS",
    "TERMINAL",
    "BatchRecord",
    "BatchRunner",
    "BatchStore",
    "Item",
    "batch_object",
    "output_line",
    "parse_window",
]
