"""A bounded memory of which endpoints recently served which prompt blocks.

Keys are the block hashes of :func:`shuniu.core.pools.prefix_hashes`; values are bit masks
of endpoint indexes. The table is an LRU of at most ``max_blocks`` entries, so it cannot
grow without bound however many distinct prompts pass through (the trap that made other
routers' prefix trees run out of memory); an evicted block simply stops attracting traffic,
as an engine's evicted KV block stops giving hits.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from functools import reduce
from itertools import islice
from operator import and_

from shuniu.core.contracts import EndpointView
from shuniu.core.pools.prefix import depths_of

__all__ = ["AgingPrefixIndex", "PrefixIndex", "loop_time"]


class PrefixIndex:
    """Block hash → endpoints that hold it (a bit per endpoint index), least recent first."""

    __slots__ = ("_seen", "_table", "max_blocks", "outbox")

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self._table: OrderedDict[int, int] = OrderedDict()
        self._seen: tuple[Sequence[int], list[int | None]] | None = None
        """The hashes :meth:`match_sparse` last looked up and their masks, for the
        :meth:`record` that follows it in a balancer's pick (saves a second look-up of every
        block); dropped by anything that changes the table."""
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
        return _per_endpoint(self.match_sparse, hashes, endpoints)

    def match_sparse(self, hashes: Sequence[int], alive: int) -> dict[int, int]:
        """Endpoint index → matched leading blocks, for the endpoints in the bit mask
        ``alive`` that match at least one block (cheap for pools with many endpoints, where
        few match; :meth:`match` is the per-endpoint list form)."""
        table = self._table
        if not hashes or not table:
            return {}
        masks = list(map(table.get, hashes))
        self._seen = (hashes, masks)
        return depths_of(masks, alive)

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
        seen, self._seen = self._seen, None
        if seen is not None and seen[0] is hashes and len(seen[1]) == len(hashes):
            masks = seen[1]  # looked up by the match just before (nothing changed since)
        else:
            masks = list(map(table.get, hashes))
        try:
            known = masks.index(None)
        except ValueError:
            known = len(masks)
        if known and reduce(and_, islice(masks, known)) & bit:
            # The common case: the prompt starts with a prefix this endpoint was sent before
            # (a shared system prompt, a conversation's earlier turns), whose every block is
            # known there already and only becomes the most recent, at C speed; a Python
            # loop only for the blocks past it. Same order as one loop over them all.
            deque(map(move, islice(hashes, known)), maxlen=0)
        else:
            known = 0
        for i in range(known, len(masks)):
            h, mask = hashes[i], masks[i]
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

    def drop(self, endpoint: int, h: int) -> None:
        """Endpoint index ``endpoint`` no longer holds block ``h`` (its engine said so)."""
        self._seen = None
        mask = self._table.get(h)
        if mask is not None:
            mask &= ~(1 << endpoint)
            if mask:
                self._table[h] = mask
            else:
                del self._table[h]

    def forget(self, endpoint: EndpointView) -> None:
        """Drop ``endpoint`` from every entry (it restarted and lost its cache). O(table)."""
        self.forget_index(endpoint.index)

    def forget_index(self, index: int) -> None:
        """:meth:`forget` by endpoint index."""
        self._seen = None
        clear = ~(1 << index)
        table = self._table
        for h in list(table):
            mask = table[h] & clear
            if mask:
                table[h] = mask
            else:
                del table[h]


def _per_endpoint(
    sparse: Callable[[Sequence[int], int], dict[int, int]],
    hashes: Sequence[int],
    endpoints: Sequence[EndpointView],
) -> list[int]:
    """A sparse match (endpoint index → depth) as one depth per endpoint, in order."""
    alive = 0
    for e in endpoints:
        alive |= 1 << e.index
    depths = sparse(hashes, alive)
    return [depths.get(e.index, 0) for e in endpoints]


def loop_time() -> float:
    # The running loop's clock (virtual in ``shuniu simulate``); asking for it this way
    # costs no exception when there is none (a balancer used outside a loop).
    loop = asyncio.events._get_running_loop()
    return loop.time() if loop is not None else time.monotonic()


class AgingPrefixIndex:
    """A :class:`PrefixIndex` whose entries are forgotten ``memory_s`` to twice that after
    they were last recorded: two generations, the older dropped when the newer is
    ``memory_s`` old. An engine evicts blocks nobody asks for; a memory that never forgets
    would keep claiming them, and in time claim every prefix on every endpoint.

    A fleet's sync (:class:`~shuniu.core.contracts.SharedIndex`) works on it as on one index:
    merges go to the newer generation, and the outbox survives a swap."""

    __slots__ = ("_born", "max_blocks", "memory_s", "new", "old")

    def __init__(self, max_blocks: int, memory_s: float) -> None:
        self.max_blocks = max_blocks
        self.memory_s = memory_s
        self.new = PrefixIndex(max_blocks)
        self.old = PrefixIndex(max_blocks)
        self._born = loop_time()

    def _age(self) -> PrefixIndex:
        now = loop_time()
        if now - self._born > self.memory_s:
            fresh = PrefixIndex(self.max_blocks)
            fresh.outbox, self.new.outbox = self.new.outbox, None
            self.old, self.new = self.new, fresh
            self._born = now
        return self.new

    @property
    def outbox(self) -> list[tuple[int, Sequence[int]]] | None:
        return self.new.outbox

    @outbox.setter
    def outbox(self, value: list[tuple[int, Sequence[int]]] | None) -> None:
        self.new.outbox = value

    def share(self) -> None:
        self.new.share()

    def merge(self, endpoint: int, hashes: Sequence[int]) -> None:
        self._age().merge(endpoint, hashes)

    def __len__(self) -> int:
        return len(self.new) + len(self.old)

    def match_sparse(self, hashes: Sequence[int], alive: int) -> dict[int, int]:
        """As :meth:`PrefixIndex.match_sparse`, the deeper of the two generations' matches."""
        self._age()
        depths = self.new.match_sparse(hashes, alive)
        old = self.old
        if len(old):
            # The older generation can only go deeper for an endpoint that it holds the
            # block at the newer one's depth for: one look-up per endpoint rules the rest
            # out (in steady traffic, most), instead of matching every block again.
            get, n, deeper, rest = old._table.get, len(hashes), 0, alive
            while rest:
                bit = rest & -rest
                rest ^= bit
                d = depths.get(bit.bit_length() - 1, 0)
                if d < n and get(hashes[d], 0) & bit:
                    deeper |= bit
            if deeper:
                for i, d in old.match_sparse(hashes, deeper).items():
                    if d > depths.get(i, 0):
                        depths[i] = d
        return depths

    def match(self, hashes: Sequence[int], endpoints: Sequence[EndpointView]) -> list[int]:
        return _per_endpoint(self.match_sparse, hashes, endpoints)

    def record(self, hashes: Sequence[int], endpoint: EndpointView) -> None:
        if hashes:  # a prompt shorter than a block: nothing to remember, no clock to read
            self._age().record(hashes, endpoint)

    def drop(self, endpoint: int, h: int) -> None:
        self.new.drop(endpoint, h)
        self.old.drop(endpoint, h)

    def forget(self, endpoint: EndpointView) -> None:
        self.forget_index(endpoint.index)

    def forget_index(self, index: int) -> None:
        self.new.forget_index(index)
        self.old.forget_index(index)
