"""A bounded memory of which endpoints recently served which prompt blocks.

Keys are the block hashes of :func:`shuniu.core.pools.prefix_hashes`; values are bit masks
of endpoint indexes. The table is an LRU of at most ``max_blocks`` entries, so it cannot
grow without bound however many distinct prompts pass through (the trap that made other
routers' prefix trees run out of memory); an evicted block simply stops attracting traffic,
as an engine's evicted KV block stops giving hits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from shuniu.core.contracts import EndpointView

__all__ = ["PrefixIndex"]


class PrefixIndex:
    """Block hash → endpoints that hold it (a bit per endpoint index), least recent first."""

    __slots__ = ("_table", "max_blocks", "outbox")

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self._table: OrderedDict[int, int] = OrderedDict()
        self.outbox: list[tuple[int, Sequence[int]]] | None = None
        """What was recorded since the fleet's last sync (``None``: no fleet)."""

    def share(self) -> None:
        """Keep what is recorded for the fleet's other gateways (:class:`SharedIndex`)."""
        if self.outbox is None:
            self.outbox = []

    def merge(self, endpoint: int, hashes: Sequence[int]) -> None:
        """Another gateway sent ``hashes`` to local endpoint index ``endpoint``."""
        self._record(hashes, 1 << endpoint)

    def __len__(self) -> int:
        return len(self._table)

    def match(self, hashes: Sequence[int], endpoints: Sequence[EndpointView]) -> list[int]:
        """For each endpoint, how many leading blocks of ``hashes`` it is known to hold."""
        alive = 0
        for e in endpoints:
            alive |= 1 << e.index
        depths = self.match_sparse(hashes, alive)
        return [depths.get(e.index, 0) for e in endpoints]

    def match_sparse(self, hashes: Sequence[int], alive: int) -> dict[int, int]:
        """Endpoint index → matched leading blocks, for the endpoints in the bit mask
        ``alive`` that match at least one block (cheap for pools with many endpoints, where
        few match; :meth:`match` is the per-endpoint list form)."""
        table = self._table
        depth_of: dict[int, int] = {}
        if not hashes or not table:
            return depth_of
        depth = 0
        for h in hashes:
            mask = table.get(h)
            if mask is None:
                break
            still = alive & mask
            if still != alive:
                gone = alive & ~still
                if depth:
                    while gone:
                        bit = gone & -gone
                        depth_of[bit.bit_length() - 1] = depth
                        gone ^= bit
                alive = still
                if not alive:
                    break
            depth += 1
        if depth:
            while alive:
                bit = alive & -alive
                depth_of[bit.bit_length() - 1] = depth
                alive ^= bit
        return depth_of

    def record(self, hashes: Sequence[int], endpoint: EndpointView) -> None:
        """``endpoint`` now holds these blocks (it was sent the prompt)."""
        if not hashes:
            return
        if self.outbox is not None:
            self.outbox.append((endpoint.index, hashes))
        self._record(hashes, 1 << endpoint.index)

    def _record(self, hashes: Sequence[int], bit: int) -> None:
        table = self._table
        move = table.move_to_end
        for h in hashes:
            mask = table.get(h)
            if mask is None:
                table[h] = bit
            else:
                table[h] = mask | bit
                move(h)
        excess = len(table) - self.max_blocks
        if excess > 0:
            pop = table.popitem
            for _ in range(excess):
                pop(last=False)

    def forget(self, endpoint: EndpointView) -> None:
        """Drop ``endpoint`` from every entry (it restarted and lost its cache). O(table)."""
        clear = ~(1 << endpoint.index)
        table = self._table
        for h in list(table):
            mask = table[h] & clear
            if mask:
                table[h] = mask
            else:
                del table[h]
