"""The response-cache store contract: where cached answers live.

Where it runs: after rate limits, before the scheduler, for requests the cache may answer
(see :mod:`shuniu.core.pipeline.response_cache`): a lookup (``get``, and ``lock`` for the
fill of a miss across gateways), and after the answer was sent, ``put`` and ``unlock``.
A ``register_caches`` hook registers ``factory(options) -> CacheStore`` per ``cache.store``.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["CacheStore"]


class CacheStore(Protocol):
    """Values are opaque bytes. Built once per gateway (``cache.store``, ``cache.options``).
    Methods must not raise for an unreachable backing service: a failed ``get`` is a miss,
    a failed ``put`` is dropped."""

    async def get(self, key: str) -> bytes | None:
        """The value stored under ``key``, or ``None``."""
        ...

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        """Store ``value`` under ``key`` for ``ttl_s`` seconds."""
        ...

    async def lock(self, key: str, ttl_s: float) -> bool:
        """Try to become the one process filling ``key``: ``True`` when this caller holds
        the fill lock now (it expires after ``ttl_s``), ``False`` when another holds it.
        A store that is not shared between processes always returns ``True``."""
        ...

    async def unlock(self, key: str) -> None:
        """Give up the fill lock of ``key`` (after storing the answer, or on failure)."""
        ...

    async def close(self) -> None:
        """Release connections; called once at shutdown."""
        ...
