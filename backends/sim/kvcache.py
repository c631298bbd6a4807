"""Paged KV cache with prefix caching, as vLLM manages it.

The cache is a pool of fixed-size blocks. A block that holds a *full* block of tokens gets a
hash chained from its predecessor's (``hash((parent, tokens))``), so equal prefixes map to
equal hash chains. When a request ends its blocks are not wiped: a hashed block with no
users goes to an LRU list and can be reused by the next request with the same prefix,
until allocation pressure evicts it.
"""

from __future__ import annotations

from collections import OrderedDict, deque

__all__ = ["BlockPool"]


class BlockPool:
    """Block bookkeeping: free blocks, reference counts, and the prefix-cache index."""

    __slots__ = (
        "_evictable",
        "_free",
        "_hash_of",
        "_index",
        "_refs",
        "caching",
        "evictions",
        "num_blocks",
        "removed",
        "used",
    )

    def __init__(self, num_blocks: int, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.caching = caching
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        # block id -> content hash (None: not full yet); a list, as releasing asks it of every
        # block, and indexing a list beats a dict look-up
        self._hash_of: list[int | None] = [None] * num_blocks
        self._index: dict[int, int] = {}  # content hash -> block id
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached blocks with no user, LRU first
        self.used = 0  # blocks with at least one user
        self.evictions = 0
        self.removed: list[int] | None = None
        """Hashes no longer findable since the engine last published KV events (``None``:
        the engine publishes none)."""

    @property
    def available(self) -> int:
        """Blocks that an allocation could get (free or evictable)."""
        return len(self._free) + len(self._evictable)

    def usage(self) -> float:
        return self.used / self.num_blocks if self.num_blocks else 0.0

    def lookup(self, hashes: list[int]) -> list[int]:
        """The cached blocks matching the longest prefix of ``hashes`` (not yet claimed)."""
        if not self.caching:
            return []
        # Every hash looked up at C speed, then cut at the first miss: cheaper than a Python
        # loop that stops there, as prompts mostly hit far into their chain.
        found = list(map(self._index.get, hashes))
        try:
            del found[found.index(None) :]
        except ValueError:
            pass
        return found  # type: ignore[return-value]

    def claim(self, blocks: list[int]) -> None:
        """Take a reference on cached blocks found by :meth:`lookup`."""
        refs = self._refs
        evictable = self._evictable
        used = 0
        for b in blocks:
            r = refs[b]
            if not r:
                evictable.pop(b, None)
                used += 1
            refs[b] = r + 1
        self.used += used

    def allocate(self, n: int) -> list[int] | None:
        """``n`` fresh blocks, evicting least-recently-used cached blocks if needed; ``None``
        (and nothing taken) when there are not enough."""
        if n > len(self._free) + len(self._evictable):
            return None
        free, refs = self._free, self._refs
        out: list[int] = []
        for _ in range(min(n, len(free))):
            b = free.popleft()
            refs[b] = 1
            out.append(b)
        hash_of = self._hash_of
        for _ in range(n - len(out)):  # the rest evicted, least recently used first
            b, _ = self._evictable.popitem(last=False)
            h = hash_of[b]
            hash_of[b] = None
            if self._index.get(h) == b:
                del self._index[h]
                if self.removed is not None:
                    self.removed.append(h)
            self.evictions += 1
            refs[b] = 1
            out.append(b)
        self.used += n
        return out

    def register(self, block: int, h: int) -> bool:
        """Block ``block`` is now full with content hash ``h``: make it findable; whether
        ``h`` was not findable before (another block may already hold the same content)."""
        if not self.caching or self._hash_of[block] is not None:
            return False
        self._hash_of[block] = h
        return self._index.setdefault(h, block) == block

    def register_run(self, blocks: list[int], hashes: list[int], start: int, stop: int) -> None:
        """:meth:`register` of ``blocks[i]`` with ``hashes[i]`` for ``start <= i < stop``, in
        one call (a decode fills one block at a time; a prefill, many)."""
        if not self.caching:
            return
        hash_of, index = self._hash_of, self._index
        for i in range(start, stop):
            block = blocks[i]
            if hash_of[block] is None:
                h = hashes[i]
                hash_of[block] = h
                index.setdefault(h, block)

    def release(self, blocks: list[int]) -> None:
        """Drop one reference on each block; unreferenced hashed blocks stay cached (LRU),
        unhashed ones go back to the free list. Released in reverse so that a request's tail
        blocks are evicted before its prefix, as vLLM does."""
        refs, hashed, evictable, free = self._refs, self._hash_of, self._evictable, self._free
        unused = 0
        for b in reversed(blocks):
            r = refs[b] - 1
            refs[b] = r
            if not r:
                unused += 1
                if hashed[b] is None:
                    free.append(b)
                else:
                    evictable[b] = None
        self.used -= unused
