"""A deterministic, dependency-free token estimate.

Real engines count with their own tokenizer; the gateway only needs an estimate (for the
context-length check and for the simulator, which counts exactly this way). One token is a
run of word characters or one punctuation character, which is within ~25% of BPE counts on
English text.
"""

from __future__ import annotations

import re

__all__ = ["count_tokens", "split_tokens"]

_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def split_tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)
