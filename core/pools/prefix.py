"""Prompt prefixes as hash chains of fixed-size blocks, for prefix-aware routing.

Engines with prefix caching (vLLM, SGLang, the simulator) reuse the KV cache of a prompt's
leading full blocks. The gateway cannot see engine blocks, so it approximates them: the
prompt is cut into blocks (of token ids when the request carries them, otherwise of
characters of the flattened prompt) and block *i* is identified by a hash of blocks 0..i,
so two prompts share block *i*'s hash only if they share everything up to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import groupby
from zlib import adler32, crc32

from shuniu.core.blockhash import extend_chain
from shuniu.core.types import InferenceRequest

__all__ = ["depths_of", "match_depths", "prefix_hashes", "set_depths"]


def prefix_hashes(req: InferenceRequest, block_chars: int, block_tokens: int) -> list[int]:
    """The hash chain of ``req``'s full prompt blocks (a trailing partial block is left out,
    as engines only cache full blocks). Computed once per request and block size."""
    ids = req.token_ids if req.token_ids is not None else req.prompt_ids
    block = block_tokens if ids is not None else block_chars
    if req.prefix_hashes is not None and req.prefix_block == block:
        return req.prefix_hashes
    out: list[int] = []
    if ids is not None:
        extend_chain(out, ids, block, len(ids) // block)
    else:
        h = block  # seed the chain with the block size so different sizes never collide
        # Text is checksummed, not hash()ed: str hashes differ between processes, and the
        # gateways of a fleet must agree on a block's hash (ints and tuples of ints hash
        # the same everywhere).
        data = req.prompt.encode()
        size = len(data)
        # A while loop, not range() with a step: compiled, it stays on native ints (range()
        # with a variable step makes and iterates a range object).
        if block < 1:
            raise ValueError(f"a prefix block must hold at least 1 character, not {block}")
        start = 0
        while start + block <= size:
            piece = data[start : start + block]
            h = hash((h, crc32(piece), adler32(piece)))
            out.append(h)
            start += block
    req.prefix_hashes = out
    req.prefix_block = block
    return out


def match_depths(table: Mapping[int, int], hashes: Sequence[int], alive: int) -> dict[int, int]:
    """Endpoint index → how many leading blocks of ``hashes`` it holds, for the endpoints in
    the bit mask ``alive`` that hold at least the first; ``table``: block hash → bit mask of
    the endpoints holding it (a prefix index, approximate or from KV events)."""
    if not hashes or not table:
        return {}
    # Every block looked up at C speed (a Python loop per block would cost several times as
    # much), then walked by runs (depths_of).
    return depths_of(list(map(table.get, hashes)), alive)


def depths_of(masks: Sequence[int | None], alive: int) -> dict[int, int]:
    """:func:`match_depths` from each block's bit mask of endpoints (``None``: a block no
    endpoint is known to hold), for a caller that looked the masks up itself."""
    depth_of: dict[int, int] = {}
    first = masks[0] if masks else None
    if first is None:
        return depth_of
    # The common case first, at C speed: one run of equal masks (a prefix sent to the same
    # endpoints throughout), whole or up to the first unknown block. (Counting equal small
    # ints is fast; finding None in a list of ints is not, so it is left for the rest.)
    single = len(masks)  # the blocks of that one run (0: more than one)
    if masks.count(first) != single:
        try:
            single = masks.index(None)
        except ValueError:
            pass
        if masks[:single].count(first) != single:
            single = 0
    depth = 0
    if single:
        alive &= first
        depth = single
    else:  # walked by runs of equal masks up to the first unknown block
        for mask, run in groupby(masks):
            if mask is None:
                break
            still = alive & mask  # type: ignore[operator]
            if still != alive:
                if depth:
                    set_depths(depth_of, alive & ~still, depth)
                alive = still
                if not alive:
                    break
            depth += len(list(run))
    if depth:
        set_depths(depth_of, alive, depth)
    return depth_of


def set_depths(depth_of: dict[int, int], endpoints: int, depth: int) -> None:
    """``depth_of[e] = depth`` for each endpoint index ``e`` in the bit mask ``endpoints``."""
    while endpoints:
        bit = endpoints & -endpoints
        endpoints ^= bit
        depth_of[bit.bit_length() - 1] = depth
