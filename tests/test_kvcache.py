"""The simulator's KV pool, kept in runs of blocks, behaves as vLLM's per-block pool does.

:class:`PerBlockPool` below is the plain model: one reference count, hash and LRU position per
block, as vLLM's block pool keeps them (it was the simulator's pool before runs). Random
streams of admissions, growth, registrations and releases go to both; after every step the
hits, allocations, evictions, the hashes a KV event would report removed or stored, the blocks
in use and those available must agree.
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import pytest

from shuniu.backends.sim.kvcache import BlockPool, Run


class PerBlockPool:
    """vLLM's bookkeeping, block by block (the reference)."""

    def __init__(self, num_blocks: int) -> None:
        self.free: deque[int] = deque(range(num_blocks))
        self.refs = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.index: dict[int, int] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.used = 0
        self.evictions = 0
        self.removed: list[int] = []

    def lookup(self, hashes: list[int]) -> list[int]:
        out = []
        for h in hashes:
            b = self.index.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def claim(self, blocks: list[int]) -> None:
        for b in blocks:
            if not self.refs[b]:
                del self.evictable[b]
                self.used += 1
            self.refs[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self.free) + len(self.evictable):
            return None
        out = []
        for _ in range(n):
            if self.free:
                b = self.free.popleft()
            else:
                b, _ = self.evictable.popitem(last=False)
                h = self.hash_of[b]
                self.hash_of[b] = None
                if self.index.get(h) == b:  # type: ignore[arg-type]
                    del self.index[h]  # type: ignore[arg-type]
                    self.removed.append(h)  # type: ignore[arg-type]
                self.evictions += 1
            self.refs[b] = 1
            out.append(b)
        self.used += n
        return out

    def register(self, block: int, h: int) -> bool:
        self.hash_of[block] = h
        return self.index.setdefault(h, block) == block

    def release(self, blocks: list[int]) -> None:
        for b in reversed(blocks):
            self.refs[b] -= 1
            if not self.refs[b]:
                self.used -= 1
                if self.hash_of[b] is None:
                    self.free.append(b)
                else:
                    self.evictable[b] = None


@dataclass(eq=False)
class Holder:
    runs: list[Run] = field(default_factory=list)
    num_blocks: int = 0
    blocks: list[int] = field(default_factory=list)  # the reference's view of the same blocks
    chain: list[int] = field(default_factory=list)
    hashed: int = 0


def _chain(rng: random.Random, roots: list[list[int]]) -> list[int]:
    """A hash chain that often shares a prefix with others (few token values per block)."""
    base = rng.choice(roots)
    out = base[: rng.randint(0, len(base))]
    h = out[-1] if out else 7
    for _ in range(rng.randint(1, 12)):
        h = hash((h, rng.randint(0, 2)))
        out.append(h)
    return out


def _allocate(runs: BlockPool, ref: PerBlockPool, h: Holder, n: int) -> list[int] | None:
    """``n`` more blocks for ``h`` from both pools, which must agree whether they have them."""
    new = ref.allocate(n)
    assert runs.allocate(n) == (new is not None)
    if new is not None:
        h.num_blocks += n
    return new


@pytest.mark.parametrize("seed", range(40))
def test_runs_match_the_per_block_pool_on_random_streams(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.choice([12, 24, 48])
    runs, ref = BlockPool(size), PerBlockPool(size)
    runs.removed = []
    holders = [Holder() for _ in range(rng.randint(2, 6))]
    roots = [_chain(rng, [[]]) for _ in range(3)]
    for step in range(400):
        h = rng.choice(holders)
        op = rng.random()
        if not h.blocks and op < 0.5:  # admit: look up a prefix, claim it, allocate the rest
            h.chain = _chain(rng, roots)
            roots.append(h.chain)
            limit = rng.randint(0, len(h.chain))
            hits, found = runs.lookup(h.chain, limit)
            ref_hits = ref.lookup(h.chain[:limit])
            assert found == len(ref_hits), step
            runs.claim(h, hits)
            ref.claim(ref_hits)
            new = _allocate(runs, ref, h, rng.randint(0, 4))
            if new is not None:
                h.blocks = ref_hits + new
                h.hashed = found
            else:
                runs.release(h)
                ref.release(ref_hits)
        elif h.blocks and op < 0.65:  # grow by a block or a few
            new = _allocate(runs, ref, h, rng.randint(1, 3))
            if new is not None:
                h.blocks += new
        elif h.blocks and op < 0.85:  # blocks became full: register them
            stop = min(len(h.blocks), len(h.chain), h.hashed + rng.randint(1, 6))
            stored: list[tuple[int, int]] = []
            runs.register(h, h.chain, h.hashed, stop, stored)
            fresh = [ref.register(h.blocks[b], h.chain[b]) for b in range(h.hashed, stop)]
            assert [b for first, end in stored for b in range(first, end)] == [
                h.hashed + i for i, new in enumerate(fresh) if new
            ], step
            h.hashed = max(h.hashed, stop)
        elif h.blocks:  # finished or preempted
            runs.release(h)
            ref.release(h.blocks)
            h.blocks, h.hashed = [], 0
        available = len(ref.free) + len(ref.evictable)
        assert (runs.used, runs.available, runs.evictions) == (ref.used, available, ref.evictions), step
        assert runs.removed == ref.removed, step
        assert runs.cached == len(ref.index), step
        assert sum(x.num_blocks for x in holders) >= runs.used  # nothing in use by no one
        probe = rng.choice(roots)
        assert runs.lookup(probe, len(probe))[1] == len(ref.lookup(probe)), step


def test_a_lookup_stops_at_the_first_block_not_cached_and_evicts_tails_first() -> None:
    pool = BlockPool(8)
    a = Holder()
    assert pool.allocate(4)
    a.num_blocks = 4
    pool.register(a, [11, 12, 13, 14], 0, 4)
    assert pool.lookup([11, 12, 13, 14, 15], 5)[1] == 4
    pool.release(a)  # all four cached, unreferenced, evictable tail first
    assert pool.allocate(5)  # 4 free blocks, then one eviction: the tail (14)
    assert pool.lookup([11, 12, 13, 14], 4)[1] == 3
    assert pool.lookup([99, 11], 2)[1] == 0
    assert pool.lookup([11, 12, 99], 3)[1] == 2  # parts from the run mid-way


def test_a_claim_that_parts_from_a_run_splits_it_for_every_holder() -> None:
    pool = BlockPool(16)
    a, b = Holder(), Holder()
    assert pool.allocate(6)
    a.num_blocks = 6
    pool.register(a, [1, 2, 3, 4, 5, 6], 0, 6)
    hits, found = pool.lookup([1, 2, 3, 9], 4)
    assert found == 3
    pool.claim(b, hits)
    assert [r.hashes for r in a.runs] == [[1, 2, 3], [4, 5, 6]] and [r.hashes for r in b.runs] == [[1, 2, 3]]
    assert a.runs[0] is b.runs[0] and pool.used == 6
    pool.release(a)  # 4, 5, 6 are unused now; 1, 2, 3 still b's
    assert pool.used == 3 and pool.available == 16 - 3
