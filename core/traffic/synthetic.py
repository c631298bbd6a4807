"""Deterministic synthetic token ids for simulated prompts and answers, and the stable seeds
that name them.

Each seed names an infinite stream of token ids in ``[0, VOCAB_SIZE)``; ``synthetic_ids(seed,
n, start)`` returns the ids ``start .. start + n`` of that stream. A prefix of the stream is
always the same, whatever length is asked for, so a workload can rebuild a system prompt or a
previous answer (the engine generates output as ``synthetic_ids(output_seed, n)``) in a later
request's prompt, and the engine's prefix cache sees the same block contents.

The stream is SHAKE-128 (an extendable-output hash: a longer digest starts with the shorter
one) of the seed, two bytes per token with the top bit cleared: about 20 ns a token, stable
across platforms and Python versions, no state between calls. The cost of a call is
O(start + n).

The engine model and the workload generators both use these ids (the engine generates an
answer the workload later replays in a conversation's history), so they live with the traffic
model, which the engine imports.
"""

from __future__ import annotations

import sys
from array import array
from hashlib import blake2b, shake_128
from typing import Any

__all__ = ["VOCAB_SIZE", "stable_seed", "synthetic_array", "synthetic_ids"]

VOCAB_SIZE = 32768
"""Ids are in ``range(VOCAB_SIZE)`` (15 bits), within the vocabularies of the modelled LLMs."""

_MASK_HIGH = bytes(i & 0x7F for i in range(256))
_BIG_ENDIAN = sys.byteorder == "big"
_SEED_MASK = (1 << 64) - 1


def synthetic_array(seed: int, n: int, start: int = 0) -> array:
    """The ids ``start .. start + n`` of ``seed``'s stream as a compact ``array('H')`` (2 bytes
    a token, for holding many ids); the seed is taken modulo 2**64."""
    if n <= 0:
        return array("H")
    if start < 0:
        raise ValueError("start must not be negative")
    end = start + n
    raw = bytearray(shake_128((seed & _SEED_MASK).to_bytes(8, "little")).digest(2 * end))
    raw[1::2] = raw[1::2].translate(_MASK_HIGH)  # little-endian: odd bytes are the high ones
    ids = array("H", raw)
    if _BIG_ENDIAN:  # pragma: no cover - the same values on every platform
        ids.byteswap()
    return ids[start:] if start else ids


def synthetic_ids(seed: int, n: int, start: int = 0) -> list[int]:
    """The ids ``start .. start + n`` of ``seed``'s stream, as a list of ints."""
    return synthetic_array(seed, n, start).tolist()


def stable_seed(*parts: Any) -> int:
    """A stable 64-bit seed from ``parts`` (Python's ``hash`` of a str is salted per run)."""
    return int.from_bytes(blake2b(repr(parts).encode(), digest_size=8).digest(), "little")
