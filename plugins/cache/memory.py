"""``memory`` cache store: a bounded LRU in this process, with a time to live per entry."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import CacheStore, RegisterCacheStore

__all__ = ["MemoryCache", "MemoryCacheOptions"]


class MemoryCacheOptions(Options):
    """Options of the ``memory`` cache store."""

    max_entries: int = Field(10_000, ge=1)
    """Most answers kept; the least recently used goes first."""
    max_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    """Most bytes of answers kept (encoded size)."""


class MemoryCache(CacheStore):
    """LRU by entries and bytes; expired entries are dropped when met. Not shared between
    processes, so the fill lock is always granted (single-flight inside the process is the
    request path's job)."""

    def __init__(
        self, options: MemoryCacheOptions | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        opts = options or MemoryCacheOptions()
        self.max_entries = opts.max_entries
        self.max_bytes = opts.max_bytes
        self.clock = clock
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if expires <= self.clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return value

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        if len(value) > self.max_bytes:
            return
        if key in self._entries:
            self._drop(key)
        self._entries[key] = (self.clock() + ttl_s, value)
        self.bytes += len(value)
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            oldest = next(iter(self._entries))
            self._drop(oldest)

    def _drop(self, key: str) -> None:
        _, value = self._entries.pop(key)
        self.bytes -= len(value)

    async def lock(self, key: str, ttl_s: float) -> bool:
        return True

    async def unlock(self, key: str) -> None:
        return None

    async def close(self) -> None:
        self._entries.clear()
        self.bytes = 0


@hookimpl
def register_caches(register: RegisterCacheStore) -> None:
    register(
        "memory",
        MemoryCache,
        options=MemoryCacheOptions,
        description="A bounded LRU in this process (entries and bytes), with a TTL per answer.",
    )
