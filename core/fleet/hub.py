"""Where the gateways of a fleet exchange their batches: Redis (:mod:`.redis`), or a
:class:`MemoryHub` shared by gateways of one process (``shuniu simulate --gateways N``).
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["FleetTransport", "MemoryHub"]


class FleetTransport(Protocol):
    """One gateway's line to the fleet."""

    async def exchange(self, batch: bytes, cursor: Any) -> tuple[Any, list[bytes]]:
        """Publish ``batch`` (may be empty: nothing to say) and return what was published
        after ``cursor`` (``None``: from the oldest kept), this gateway's own batches
        included, with the cursor to pass next time. Raises when the fleet cannot be
        reached."""
        ...

    async def close(self) -> None: ...


class MemoryHub:
    """Batches kept in this process, for gateways that run in one (the simulator): the
    last ``max_entries``. Each gateway talks to it through :meth:`transport`."""

    __slots__ = ("_entries", "_first", "max_entries")

    def __init__(self, max_entries: int = 20_000) -> None:
        self.max_entries = max_entries
        self._entries: list[bytes] = []
        self._first = 0
        """The sequence number of ``_entries[0]``."""

    def transport(self) -> _MemoryTransport:
        return _MemoryTransport(self)

    def exchange(self, batch: bytes, cursor: int | None) -> tuple[int, list[bytes]]:
        if batch:
            self._entries.append(batch)
            excess = len(self._entries) - self.max_entries
            if excess > 0:
                del self._entries[:excess]
                self._first += excess
        start = self._first if cursor is None else max(cursor, self._first)
        out = self._entries[start - self._first :]
        return self._first + len(self._entries), out


class _MemoryTransport:
    __slots__ = ("hub",)

    def __init__(self, hub: MemoryHub) -> None:
        self.hub = hub

    async def exchange(self, batch: bytes, cursor: Any) -> tuple[Any, list[bytes]]:
        return self.hub.exchange(batch, cursor)

    async def close(self) -> None:
        return None
