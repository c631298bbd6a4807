"""The simulator's embedding and rerank answers: deterministic, and alike where texts are.

A vector is a hashed bag of the text's words and word pairs (each feature adds ±1 at a few
positions picked by its hash), plus a small component from the whole text, normalised to
length 1: the same input always gets the same vector, any two different inputs get
different ones, and texts that share words have a positive cosine similarity, so a
newcomer's semantic search over simulated vectors behaves like one. A rerank score is the
cosine similarity of query and document mapped to 0..1.
"""

from __future__ import annotations

import hashlib
import math

from shuniu.core.tokens import split_tokens

__all__ = ["embed_text", "relevance", "truncate"]

_PER_FEATURE = 4
"""Positions one word (or word pair) moves."""
_WHOLE_WEIGHT = 0.25
"""Weight of the whole-text feature: small, so shared words dominate the similarity."""


def _add(vector: list[float], feature: bytes, weight: float) -> None:
    digest = hashlib.blake2b(feature, digest_size=4 * _PER_FEATURE).digest()
    dim = len(vector)
    for k in range(_PER_FEATURE):
        h = int.from_bytes(digest[4 * k : 4 * k + 4], "little")
        vector[(h >> 1) % dim] += weight if h & 1 else -weight


def embed_text(text: str, dim: int) -> list[float]:
    """The unit vector of ``text`` in ``dim`` dimensions."""
    vector = [0.0] * dim
    words = [w.strip().lower() for w in split_tokens(text) if w.strip()]
    previous = b""
    for word in words:
        encoded = word.encode()
        _add(vector, b"w\x00" + encoded, 1.0)
        if previous:
            _add(vector, b"p\x00" + previous + b"\x00" + encoded, 0.5)
        previous = encoded
    _add(vector, b"t\x00" + text.encode(), _WHOLE_WEIGHT if words else 1.0)
    return _unit(vector)


def truncate(vector: list[float], dimensions: int) -> list[float]:
    """``vector`` in ``dimensions`` dimensions: folded (position ``i`` adds to ``i mod
    dimensions``) and normalised again, so a short vector keeps every feature of the long
    one, as a Matryoshka model's prefix keeps its meaning."""
    folded = [0.0] * dimensions
    for i, v in enumerate(vector):
        folded[i % dimensions] += v
    return _unit(folded)


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(v * v for v in vector))
    if norm == 0.0:
        return vector
    return [v / norm for v in vector]


def relevance(query: list[float], document: list[float]) -> float:
    """A document's relevance to a query, 0..1, from their unit vectors' cosine."""
    cosine = sum(q * d for q, d in zip(query, document, strict=True))
    return round((cosine + 1.0) / 2.0, 6)
