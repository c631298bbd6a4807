"""Which endpoint holds which prompt blocks, exactly, from the engines' own KV events.

The engines' block hashes cannot be recomputed cheaply (vLLM's are sha256 over CBOR, with a
per-process seed unless ``PYTHONHASHSEED`` is set), so the index keys blocks by the **token
ids the events carry**: a stored block's key is the hash chain that
:func:`shuniu.core.pools.prefix.prefix_hashes` computes for a request's token ids (seeded
with the block size), so a request's chain matches the blocks an engine really holds,
block for block. Per endpoint it maps the engine's hash of each block to that key, to
follow ``parent_block_hash`` and to apply ``BlockRemoved``.

It answers :meth:`match_sparse` like the approximate :class:`PrefixIndex` (endpoint index
→ leading blocks held), so a balancer reads either. Bounded: at most ``max_blocks`` keys
(least recently stored forgotten first) and as many engine hashes per endpoint; a block
forgotten early only stops attracting traffic. About 250 bytes per block held by one
endpoint (two dict entries and a counted key).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from itertools import islice

from shuniu.core.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from shuniu.core.pools.prefix import match_depths

__all__ = ["KvBlockIndex"]


class _Endpoint:
    __slots__ = ("counts", "keys")

    def __init__(self) -> None:
        self.keys: dict[int | bytes, int] = {}
        """Engine block hash → our key (insertion order: oldest first)."""
        self.counts: dict[int, int] = {}
        """Our key → engine blocks of this endpoint with it (a LoRA or salted copy of the
        same tokens is another engine block with the same key)."""


class KvBlockIndex:
    """Block key → endpoints holding it (a bit per endpoint index), from KV events."""

    __slots__ = (
        "_endpoints",
        "_table",
        "batches",
        "block_size",
        "blocks_stored",
        "malformed",
        "max_blocks",
        "on_cleared",
        "on_removed",
        "orphaned",
    )

    def __init__(self, max_blocks: int = 1_000_000) -> None:
        self.max_blocks = max_blocks
        self._table: OrderedDict[int, int] = OrderedDict()
        self._endpoints: dict[int, _Endpoint] = {}
        self.batches = 0
        """Event batches applied."""
        self.block_size = 0
        """The engines' block size, from their events (0 before the first)."""
        self.blocks_stored = 0
        self.on_removed: Callable[[int, int], None] | None = None
        """Called with (endpoint, key) when an endpoint no longer holds a block."""
        self.on_cleared: Callable[[int], None] | None = None
        """Called with the endpoint when everything it held is forgotten."""
        self.orphaned: dict[int, int] = {}
        """Endpoint → stored blocks skipped because their parent was never seen (events
        missed before this index started, or lost): they stay invisible until stored again."""
        self.malformed: dict[int, int] = {}
        """Endpoint → stored blocks skipped because their event carried fewer token ids than
        its blocks hold (or no block size): their keys cannot be computed. A block after one
        of them is then an orphan."""

    def __len__(self) -> int:
        return len(self._table)

    @property
    def orphans(self) -> int:
        """Stored blocks skipped for a parent never seen, over all endpoints."""
        return sum(self.orphaned.values())

    def blocks(self, endpoint: int) -> int:
        """Blocks the index knows ``endpoint`` to hold."""
        e = self._endpoints.get(endpoint)
        return len(e.keys) if e is not None else 0

    # -- events ---------------------------------------------------------------------------

    def apply(self, endpoint: int, batch: EventBatch) -> None:
        """One engine step's events, from the endpoint with index ``endpoint``."""
        self.batches += 1
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(endpoint, event)
            elif isinstance(event, BlockRemoved):
                self._removed(endpoint, event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self.clear(endpoint)

    def _stored(self, endpoint: int, ev: BlockStored) -> None:
        e = self._endpoints.get(endpoint)
        if e is None:
            e = self._endpoints[endpoint] = _Endpoint()
        keys, counts = e.keys, e.counts
        engine_hashes = ev.block_hashes
        bs = self.block_size = ev.block_size
        if ev.parent_block_hash is None:
            h = bs  # the seed prefix_hashes uses
        else:
            parent = keys.get(ev.parent_block_hash)
            if parent is None:
                self.orphaned[endpoint] = self.orphaned.get(endpoint, 0) + len(engine_hashes)
                return
            h = parent
        ids = ev.token_ids
        if bs <= 0 or len(ids) < len(engine_hashes) * bs:
            # Only the blocks its ids cover whole have a key; a slice past the ids' end would
            # hash a part of a block (or nothing) into a key no request ever matches.
            whole = len(ids) // bs if bs > 0 else 0
            self.malformed[endpoint] = self.malformed.get(endpoint, 0) + len(engine_hashes) - whole
            if not whole:
                return
            engine_hashes = engine_hashes[:whole]
        table = self._table
        bit = 1 << endpoint
        for i, engine_hash in enumerate(engine_hashes):
            h = hash((h, tuple(ids[i * bs : (i + 1) * bs])))
            if engine_hash in keys:
                continue  # stored twice (a replay overlapping what came live)
            keys[engine_hash] = h
            counts[h] = counts.get(h, 0) + 1
            mask = table.get(h)
            if mask is None:
                table[h] = bit
            else:
                table[h] = mask | bit
                table.move_to_end(h)
        self.blocks_stored += len(engine_hashes)
        if len(keys) > self.max_blocks:
            old = list(islice(keys, len(keys) - self.max_blocks))  # the oldest, not a copy of all
            self._removed(endpoint, old)
        # Over the bound, forget the least recently stored keys; the endpoints' maps keep
        # their engine hashes until a BlockRemoved (or their own bound) finds no key to clear.
        for _ in range(len(table) - self.max_blocks):
            table.popitem(last=False)

    def _removed(self, endpoint: int, hashes: list[int | bytes]) -> None:
        e = self._endpoints.get(endpoint)
        if e is None:
            return
        keys, counts, table = e.keys, e.counts, self._table
        clear = ~(1 << endpoint)
        for engine_hash in hashes:
            h = keys.pop(engine_hash, None)
            if h is None:
                continue
            n = counts[h] - 1
            if n:
                counts[h] = n
                continue
            del counts[h]
            if self.on_removed is not None:
                self.on_removed(endpoint, h)
            _unset(table, h, clear)

    def clear(self, endpoint: int) -> None:
        """Forget everything ``endpoint`` held (it cleared its cache, restarted, or its
        events were lost). O(blocks it held)."""
        e = self._endpoints.pop(endpoint, None)
        if self.on_cleared is not None:
            self.on_cleared(endpoint)
        if e is None:
            return
        clear = ~(1 << endpoint)
        table = self._table
        for h in e.counts:
            _unset(table, h, clear)

    # -- queries --------------------------------------------------------------------------

    def match_sparse(self, hashes: list[int], alive: int) -> dict[int, int]:
        """Endpoint index → leading blocks of ``hashes`` it holds, for the endpoints in the
        bit mask ``alive`` that hold at least the first."""
        return match_depths(self._table, hashes, alive)


def _unset(table: OrderedDict[int, int], h: int, keep: int) -> None:
    """Clear the bits not in ``keep`` from key ``h``'s mask (dropping it when none is left)."""
    mask = table.get(h)
    if mask is not None:
        mask &= keep
        if mask:
            table[h] = mask
        else:
            del table[h]
