"""Hash chains of token blocks, the one formula the gateway's prefix routing and the simulated
engine's prefix cache share, and a memo of them for prompts that start alike.

Block *i* of a token sequence is identified by ``hash((hash of block i-1, tuple(block i)))``,
the chain seeded with the block size (so chains of different sizes never collide): two
sequences share block *i*'s hash only if they share every token up to its end. Ints and
tuples of ints hash the same in every process, so the gateways of a fleet agree.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

__all__ = ["PrefixChain", "common_length", "extend_chain"]


def extend_chain(chain: list[int], ids: Sequence[int], block: int, stop: int) -> list[int]:
    """Append to ``chain`` (the hashes of ``ids``'s first ``len(chain)`` blocks) the hashes of
    its blocks up to block ``stop`` (exclusive; full blocks only: ``stop`` is at most
    ``len(ids) // block``); returns ``chain``."""
    h = chain[-1] if chain else block
    append = chain.append
    lo, hi = len(chain) * block, stop * block
    if hi <= lo:
        return chain
    # The blocks' tuples straight from one iterator over the ids (zip takes `block` at a
    # time), not a slice and a tuple per block; an array's ids made into ints once. Every
    # block asked for is full (a caller's `stop` is at most len(ids) // block).
    part = ids[lo:hi]
    blocks = zip(*[iter(part.tolist() if isinstance(part, array) else part)] * block, strict=False)
    for ids_of_block in blocks:
        h = hash((h, ids_of_block))
        append(h)
    return chain


def common_length(run: list[int], hashes: Sequence[int], i: int, n: int) -> int:
    """How many leading hashes of ``run`` equal ``hashes[i:]``, at most ``n`` (no more than
    either has; ``run[0]`` equals ``hashes[i]``): what a prefix cache kept in runs of a chain
    (the simulated engine's KV pool, the balancers' prefix index) compares. Slices compared
    at C speed, then halved where they differ; mostly the same int objects (a conversation's
    chain adopts the engine's), so each element costs an identity check."""
    if (run if n == len(run) else run[:n]) == hashes[i : i + n]:
        return n
    lo, hi = 1, n  # run[:lo] matches, run[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if run[:mid] == hashes[i : i + mid]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixChain:
    """The hash chains (one per block size) of a token prefix that many prompts start with,
    so each prompt hashes only the blocks past it: a shared system prompt, or a
    conversation, whose every turn's prompt starts with the whole previous one.

    Whoever hands prompts in promises that the first ``shared`` tokens of each are the same
    as those of every other prompt handed in with at least that many (:meth:`hashes`)."""

    __slots__ = ("_chains",)

    def __init__(self) -> None:
        self._chains: dict[int, list[int]] = {}

    def hashes(self, ids: Sequence[int], block: int, shared: int) -> list[int]:
        """The chain of ``ids``'s full blocks (a fresh list), remembering those within its
        first ``shared`` tokens for the prompts that follow."""
        stable = min(shared, len(ids)) // block
        return extend_chain(self.known(ids, block, shared)[:stable], ids, block, len(ids) // block)

    def known(self, ids: Sequence[int], block: int, shared: int) -> list[int]:
        """The remembered chain, hashed on to cover at least ``ids``'s first ``shared``
        tokens' full blocks (it may hold more; the memo itself: not to be changed)."""
        memo = self._memo(block)
        stable = min(shared, len(ids)) // block
        if len(memo) < stable:
            extend_chain(memo, ids, block, stable)
        return memo

    def adopt(self, chain: Sequence[int], block: int, shared: int) -> None:
        """Remember the full blocks of ``chain``'s first ``shared`` tokens, hashed already
        elsewhere (the same formula, blocks of ``block`` tokens), as what the prompts that
        follow start with; ``chain`` must start with what is remembered."""
        memo = self._memo(block)
        stable = min(shared // block, len(chain))
        if len(memo) < stable:
            memo += chain[len(memo) : stable]

    def _memo(self, block: int) -> list[int]:
        """The remembered chain for blocks of ``block`` tokens (empty at first)."""
        memo = self._chains.get(block)
        if memo is None:
            memo = self._chains[block] = []
        return memo
