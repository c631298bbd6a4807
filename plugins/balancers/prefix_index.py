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
from collections.abc import Callable, Iterator, Sequence

from shuniu.core.blockhash import common_length
from shuniu.core.contracts import EndpointView
from shuniu.core.pools.prefix import set_depths

__all__ = ["AgingPrefixIndex", "PrefixIndex", "loop_time"]


class _Run:
    """Consecutive blocks of one chain with the same endpoints, next to each other in the
    LRU order (oldest first, which is chain order); a link of that order's list."""

    __slots__ = ("hashes", "mask", "newer", "older")

    def __init__(self, hashes: list[int], mask: int) -> None:
        self.hashes = hashes
        self.mask = mask
        self.older: _Run = self
        self.newer: _Run = self


class PrefixIndex:
    """Block hash → endpoints that hold it (a bit per endpoint index), least recent first.

    What it promises is per block (``tests/test_prefix_index_model.py`` checks it against a
    plain LRU of blocks), but it keeps runs: consecutive blocks of a hash chain with the same
    endpoints that were recorded together, so recording a prompt whose long prefix is known
    (a shared system prompt, a conversation's earlier turns) moves a few runs instead of
    every block, and a match compares each run with the prompt as one slice. A run is split
    where a prompt parts from it, ends inside it, or changes the endpoints of only part of
    it. Hashes are those of a chain: each one determines the one before it."""

    __slots__ = ("_lru", "_size", "_where", "max_blocks", "outbox")

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self._where: dict[int, _Run] = {}  # every hash -> its run
        self._lru = _Run([], 0)  # the list's ends: .newer is the oldest run, .older the newest
        self._size = 0
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
        return self._size

    def mask_of(self, h: int) -> int:
        """The endpoints known to hold block ``h`` (0: none)."""
        run = self._where.get(h)
        return run.mask if run is not None else 0

    def items(self) -> Iterator[tuple[int, int]]:
        """Every block and its endpoints, least recent first."""
        for run in self._runs():
            for h in run.hashes:
                yield h, run.mask

    def _runs(self) -> Iterator[_Run]:
        """The runs, least recent first; the one yielded may be unlinked meanwhile."""
        end = self._lru
        run = end.newer
        while run is not end:
            after = run.newer
            yield run
            run = after

    def match(self, hashes: Sequence[int], endpoints: Sequence[EndpointView]) -> list[int]:
        """For each endpoint, how many leading blocks of ``hashes`` it is known to hold."""
        return _per_endpoint(self.match_sparse, hashes, endpoints)

    def match_sparse(self, hashes: Sequence[int], alive: int) -> dict[int, int]:
        """Endpoint index → matched leading blocks, for the endpoints in the bit mask
        ``alive`` that match at least one block (cheap for pools with many endpoints, where
        few match; :meth:`match` is the per-endpoint list form)."""
        depths: dict[int, int] = {}
        where = self._where
        n = len(hashes)
        i = 0
        while i < n and alive:
            run = where.get(hashes[i])
            if run is None:
                break
            mask = run.mask
            gone = alive & ~mask
            if gone and i:
                set_depths(depths, gone, i)
            alive &= mask
            rh = run.hashes
            if rh[0] != hashes[i]:  # entered mid-run (a list that is no chain's start)
                rh = rh[rh.index(hashes[i]) :]
            i += common_length(rh, hashes, i, min(len(rh), n - i))
        if alive and i:
            set_depths(depths, alive, i)
        return depths

    def record(self, hashes: Sequence[int], endpoint: EndpointView) -> None:
        """``endpoint`` now holds these blocks (it was sent the prompt)."""
        if not hashes:
            return
        if self.outbox is not None:
            self.outbox.append((endpoint.index, hashes))
        self._record(hashes, 1 << endpoint.index)

    def _record(self, hashes: Sequence[int], bit: int) -> None:
        # Block by block this is: each hash gets the bit and becomes the most recent, in
        # order; then the least recent go while there are more than max_blocks. By runs:
        # each run the prompt covers moves to the newest end whole (split first where the
        # prompt leaves it, or where only part of it changes endpoints), and each stretch of
        # new blocks becomes a run there.
        where, end = self._where, self._lru
        n = len(hashes)
        i = 0
        while i < n:
            run = where.get(hashes[i])
            if run is None:
                new = list(hashes[i:])
                if where.keys().isdisjoint(new):  # the usual: the rest of the prompt is new
                    j = n
                else:
                    j = i + 1
                    while hashes[j] not in where:
                        j += 1
                    del new[j - i :]
                last = end.older
                if i and last.mask == bit and last.hashes[0] != hashes[0]:
                    # The run just moved ends with hashes[i - 1]: the chain goes on in it
                    # (a conversation's next turn), unless it starts the chain: that is
                    # mostly a shared system prompt, which the next prompt would part from
                    # where this one's own blocks begin.
                    last.hashes += new
                else:
                    last = _Run(new, bit)
                    _link_newest(end, last)
                where.update(dict.fromkeys(new, last))
                self._size += j - i
                i = j
                continue
            rh = run.hashes
            if rh[0] != hashes[i]:  # entered mid-run (not from a chain's start): part there
                run = self._split(run, rh.index(hashes[i]))
                rh = run.hashes
            m = common_length(rh, hashes, i, min(len(rh), n - i))
            if m < len(rh):
                self._split(run, m)  # the rest stays where it is
            run.mask |= bit
            if end.older is not run:
                _unlink(run)
                _link_newest(end, run)
            i += m
        excess = self._size - self.max_blocks
        if excess > 0:
            self._evict(excess)

    def _split(self, run: _Run, m: int) -> _Run:
        """Cut ``run`` after its first ``m`` blocks, in place in the LRU order; ``run`` keeps
        the first part, the second is returned."""
        rest = _Run(run.hashes[m:], run.mask)
        del run.hashes[m:]
        self._where.update(dict.fromkeys(rest.hashes, rest))
        newer = run.newer
        rest.older, rest.newer = run, newer
        run.newer = newer.older = rest
        return rest

    def _evict(self, k: int) -> None:
        """Forget the ``k`` least recent blocks."""
        end, where = self._lru, self._where
        self._size -= k
        while k:
            run = end.newer
            rh = run.hashes
            take = min(k, len(rh))
            for h in rh[:take]:
                del where[h]
            if take == len(rh):
                _unlink(run)
            else:
                del rh[:take]
            k -= take

    def drop(self, endpoint: int, h: int) -> None:
        """Endpoint index ``endpoint`` no longer holds block ``h`` (its engine said so)."""
        run = self._where.get(h)
        if run is None or not run.mask >> endpoint & 1:
            return
        p = run.hashes.index(h)
        if p:
            run = self._split(run, p)
        if len(run.hashes) > 1:
            self._split(run, 1)
        run.mask &= ~(1 << endpoint)
        if not run.mask:
            self._remove(run)

    def _remove(self, run: _Run) -> None:
        where = self._where
        for h in run.hashes:
            del where[h]
        self._size -= len(run.hashes)
        _unlink(run)

    def forget(self, endpoint: EndpointView) -> None:
        """Drop ``endpoint`` from every entry (it restarted and lost its cache). O(table)."""
        self.forget_index(endpoint.index)

    def clear(self) -> None:
        """Forget everything. The LRU list's links are cut run by run: linked both ways, the
        runs would otherwise be freed only by the cycle collector's next full pass (and an
        aging index drops a whole generation every ``memory_s``)."""
        end = self._lru
        for run in self._runs():
            run.older = run.newer = end
        end.older = end.newer = end
        self._where.clear()
        self._size = 0

    def forget_index(self, index: int) -> None:
        """:meth:`forget` by endpoint index."""
        clear = ~(1 << index)
        for run in self._runs():
            run.mask &= clear
            if not run.mask:
                self._remove(run)


def _unlink(run: _Run) -> None:
    run.older.newer = run.newer
    run.newer.older = run.older


def _link_newest(end: _Run, run: _Run) -> None:
    last = end.older
    run.older, run.newer = last, end
    last.newer = end.older = run


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
            self.old.clear()
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
            mask_of, n, deeper, rest = old.mask_of, len(hashes), 0, alive
            while rest:
                bit = rest & -rest
                rest ^= bit
                d = depths.get(bit.bit_length() - 1, 0)
                if d < n and mask_of(hashes[d]) & bit:
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
