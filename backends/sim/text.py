"""Deterministic pseudo-text: the same request always gets the same words."""

from __future__ import annotations

import hashlib
import random

__all__ = ["VOCABULARY", "rng_for"]

VOCABULARY: tuple[str, ...] = tuple(
    """the of and to in is that for it as with was on be by this are at from or an have not
    which but all they one were there can more has been their if will would about when so
    what up out into time some could them other than then now only its also after two first
    new way may any these our over such where well most through how much system model data
    token engine request cache batch memory queue latency throughput answer question river
    mountain light signal network value market garden window morning silver engine harbor
    bridge paper stone music winter summer forest ocean city street field voice story
    reason number simple quiet bright early later small large green blue golden gentle rapid
    steady open clear deep careful strong warm cold""".split()
)


def rng_for(prompt: str, seed: int | None) -> random.Random:
    """A generator seeded from the prompt and the request's ``seed``, stable across runs."""
    digest = hashlib.blake2b(f"{seed}\x00{prompt}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))
