"""Paged KV cache with prefix caching, as vLLM manages it, kept in runs of blocks.

The cache is a pool of fixed-size blocks. A block that holds a *full* block of tokens gets a
hash chained from its predecessor's (``hash((parent, tokens))``), so equal prefixes map to
equal hash chains. When a request ends its blocks are not wiped: a hashed block with no
users goes to an LRU list (a request's tail before its prefix) and can be reused by the next
request with the same prefix, until allocation pressure evicts it.

vLLM keeps that state per block; so did this module once, and a simulated request then
walked its ~150 cached blocks three times (look-up, claim, release), a quarter of the
simulator's time. Here the same state is kept per :class:`Run`: consecutive blocks of a chain
that the same requests hold, so they are claimed, released and queued for eviction together.
A run is split only where requests part (one claims only its first blocks), and an eviction
takes blocks from the tail of the run at the head of the LRU list. The observable behaviour
is vLLM's per-block one, block for block: which prefixes hit, which blocks are evicted and in
which order, what the KV events say (``tests/test_kvcache.py`` checks it against a per-block
model on random operation streams). Block ids are not kept: nothing observable depends on
which physical block holds what.

A block whose content another block already holds (two requests computed the same prefix at
once) is cached but not findable, as in vLLM: it sits in a run of its own kind
(``findable`` false) until evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

from shuniu.core.blockhash import common_length
from shuniu.core.kv_events.wire import BlockHash

__all__ = ["BlockPool", "Holder", "Run"]


class Run:
    """Consecutive cached blocks, in chain order, that the same holders use."""

    __slots__ = ("findable", "hashes", "holders")

    def __init__(self, hashes: list[int], holders: set[Holder], findable: bool) -> None:
        self.hashes = hashes
        """The blocks' content hashes, each chained from the one before."""
        self.holders = holders
        """The sequences using these blocks (none: cached and evictable)."""
        self.findable = findable
        """Whether a look-up finds these blocks (false: another block holds the same
        content and is the one found)."""


class Holder(Protocol):
    """What the pool keeps on a sequence: its cached runs, in order, then its blocks not yet
    hashed (``num_blocks`` counts both)."""

    runs: list[Run]
    num_blocks: int


Hits = list[tuple[Run, int]]
"""What :meth:`BlockPool.lookup` found: runs and how many leading blocks of each."""


class BlockPool:
    """Block accounting, the prefix-cache index and the LRU order of unused cached blocks."""

    __slots__ = (
        "_findable",
        "_free",
        "_heads",
        "_idle",
        "_idle_blocks",
        "caching",
        "evictions",
        "num_blocks",
        "removed",
        "used",
    )

    def __init__(self, num_blocks: int, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.caching = caching
        self._free = num_blocks  # blocks holding nothing
        self._findable: set[int] = set()  # every hash a look-up finds
        self._heads: dict[int, Run] = {}  # first hash -> findable run
        # Runs nobody uses, least recently released first; each is evicted from its tail.
        self._idle: OrderedDict[Run, None] = OrderedDict()
        self._idle_blocks = 0
        self.used = 0  # blocks with at least one user
        self.evictions = 0
        self.removed: list[BlockHash] | None = None
        """Hashes no longer findable since the engine last published KV events (``None``:
        the engine publishes none)."""

    @property
    def available(self) -> int:
        """Blocks that an allocation could get (free or evictable)."""
        return self._free + self._idle_blocks

    @property
    def empty(self) -> int:
        """Blocks holding nothing: an allocation of no more than these evicts nothing."""
        return self._free

    @property
    def cached(self) -> int:
        """Blocks a look-up can find (in use or not)."""
        return len(self._findable)

    def usage(self) -> float:
        return self.used / self.num_blocks if self.num_blocks else 0.0

    def lookup(self, hashes: Sequence[int], limit: int) -> tuple[Hits, int]:
        """The cached blocks matching the longest prefix of ``hashes[:limit]`` (not yet
        claimed), and how many they are."""
        hits: Hits = []
        if not self.caching:
            return hits, 0
        heads = self._heads
        i = 0
        while i < limit:
            run = heads.get(hashes[i])
            if run is None:
                break
            rh = run.hashes
            n = common_length(rh, hashes, i, min(len(rh), limit - i))
            hits.append((run, n))
            i += n  # the next block, if cached, starts a run: no two runs hold one hash
        return hits, i

    def claim(self, holder: Holder, hits: Hits) -> None:
        """Give ``holder`` (which holds nothing yet) the blocks :meth:`lookup` found."""
        runs = holder.runs
        idle = self._idle
        total = 0
        for run, n in hits:
            if n < len(run.hashes):
                run = self._split(run, n)
            holders = run.holders
            if not holders:
                idle.pop(run, None)  # a head split off an idle run was never queued itself
                self._idle_blocks -= n
                self.used += n
            holders.add(holder)
            runs.append(run)
            total += n
        holder.num_blocks += total

    def _split(self, run: Run, n: int) -> Run:
        """Cut ``run`` after its first ``n`` blocks; the head is returned, ``run`` keeps the
        rest (and its place in the LRU list), and every holder now holds both."""
        head = Run(run.hashes[:n], set(run.holders), run.findable)
        del run.hashes[:n]
        if run.findable:
            self._heads[head.hashes[0]] = head
            self._heads[run.hashes[0]] = run
        for h in run.holders:
            runs = h.runs
            runs.insert(runs.index(run), head)
        return head

    def allocate(self, n: int) -> bool:
        """Take ``n`` fresh blocks, evicting least-recently-used cached blocks if needed;
        ``False`` (and nothing taken) when there are not enough."""
        free = self._free
        if n > free:
            if n > free + self._idle_blocks:
                return False
            self._free = 0
            self._evict(n - free)
        else:
            self._free = free - n
        self.used += n
        return True

    def _evict(self, n: int) -> None:
        idle, removed = self._idle, self.removed
        self.evictions += n
        self._idle_blocks -= n
        while n:
            run = next(iter(idle))
            rh = run.hashes
            k = len(rh)
            if k <= n:
                idle.popitem(last=False)
                gone = rh
                n -= k
                if run.findable:
                    del self._heads[rh[0]]
            elif n == 1:  # the usual: a decode's next block
                h = rh.pop()
                if run.findable:
                    self._findable.discard(h)
                    if removed is not None:
                        removed.append(h)
                return
            else:
                gone = rh[k - n :]
                del rh[k - n :]
                n = 0
            if run.findable:
                self._findable.difference_update(gone)
                if removed is not None:
                    removed.extend(reversed(gone))  # tail first, as they were evicted

    def register_one(self, holder: Holder, h: int) -> bool:
        """:meth:`register` of ``holder``'s next block alone (prefix caching on), with content
        ``h``: a decode's commonest registration, without the slicing. ``False``, and nothing
        done, when another block holds ``h`` already (then :meth:`register` sorts it out)."""
        findable = self._findable
        if h in findable:
            return False
        findable.add(h)
        runs = holder.runs
        if runs:
            last = runs[-1]
            if last.findable and len(last.holders) == 1:
                last.hashes.append(h)
                return True
        last = Run([h], {holder}, True)
        runs.append(last)
        self._heads[h] = last
        return True

    def register(
        self,
        holder: Holder,
        hashes: list[int],
        start: int,
        stop: int,
        stored: list[tuple[int, int]] | None = None,
    ) -> None:
        """``holder``'s blocks ``start`` to ``stop - 1`` (its first not hashed yet: ``start``
        is how many its runs hold) are now full with contents ``hashes[start:stop]``: make
        them findable, but for those whose content another block holds already. With
        ``stored``, append each stretch ``(first, stop)`` of them that became findable."""
        if not self.caching or start >= stop:
            return
        if stop - start == 1 and self.register_one(holder, hashes[start]):  # the commonest
            if stored is not None:
                stored.append((start, stop))
            return
        findable = self._findable
        runs = holder.runs
        last = runs[-1] if runs else None
        new = hashes[start:stop]
        if findable.isdisjoint(new):  # the common case: all new to the cache
            findable.update(new)
            if last is not None and last.findable and len(last.holders) == 1:
                last.hashes += new  # its own run goes on: one unit from now on
            else:
                run = Run(new, {holder}, True)
                runs.append(run)
                self._heads[new[0]] = run
            if stored is not None:
                stored.append((start, stop))
            return
        first = -1  # the start of the stretch of findable blocks being added, if any
        for j in range(start, stop):
            h = hashes[j]
            fresh = h not in findable
            if fresh:
                findable.add(h)
                if first < 0:
                    first = j
            elif first >= 0:
                if stored is not None:
                    stored.append((first, j))
                first = -1
            if last is not None and last.findable is fresh and len(last.holders) == 1:
                last.hashes.append(h)
            else:
                last = Run([h], {holder}, fresh)
                runs.append(last)
                if fresh:
                    self._heads[h] = last
        if first >= 0 and stored is not None:
            stored.append((first, stop))

    def release(self, holder: Holder) -> None:
        """Drop ``holder``'s use of all its blocks: its unhashed ones are free again, its
        cached runs that nobody else uses join the LRU list (its tail first, so a request's
        tail is evicted before its prefix, as vLLM does)."""
        runs = holder.runs
        unused = holder.num_blocks
        if runs:
            unused -= sum(len(r.hashes) for r in runs)
        self._free += unused
        idle = self._idle
        queued = 0
        for run in reversed(runs):
            holders = run.holders
            holders.discard(holder)
            if not holders:
                queued += len(run.hashes)
                idle[run] = None
        self._idle_blocks += queued
        self.used -= unused + queued
        holder.runs = []
        holder.num_blocks = 0
