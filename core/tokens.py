"""A deterministic, dependency-free token estimate.

Real engines count with their own tokenizer; the gateway needs an estimate for every limit
counted in tokens (the context check, ``max_prompt_tokens``, TPM, length routing, fair
shares), and the simulator counts exactly this way. The estimate must never undercount
badly, whatever the language:

- a Han ideograph, kana or hangul syllable is one token each (BPE vocabularies of the
  Chinese, Japanese and Korean models give about one per character, often more);
- a run of other word characters is one token, up to :data:`WORD_CHARS` characters (a
  word); a longer unbroken run (a hash, base64, a URL without separators, 100,000 letters)
  is one token per :data:`RUN_CHARS_PER_TOKEN` characters, so its length bounds its count;
- every other non-space character (punctuation, a symbol, an emoji) is one token.

On English text that is within about 25% of BPE counts. Per-model tokenizers, for exact
counts, are planned (issue 15); this is also their fallback.
"""

from __future__ import annotations

import re

__all__ = ["RUN_CHARS_PER_TOKEN", "WORD_CHARS", "count_tokens", "split_tokens"]

WORD_CHARS = 16
"""Longest run of word characters counted as one token (a word)."""
RUN_CHARS_PER_TOKEN = 4
"""Characters per token of a longer unbroken run."""

# Han (CJK unified ideographs, extension A and B+, compatibility), kana, hangul syllables.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f"
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")


def count_tokens(text: str) -> int:
    """The estimated token count of ``text`` (``len(split_tokens(text))``, without building
    the split pieces)."""
    pieces = _TOKEN.findall(text)
    n = len(pieces)
    if n and max(map(len, pieces)) > WORD_CHARS:  # rare: a run longer than a word
        n += sum(-(-len(p) // RUN_CHARS_PER_TOKEN) - 1 for p in pieces if len(p) > WORD_CHARS)
    return n


def split_tokens(text: str) -> list[str]:
    """The pieces :func:`count_tokens` counts, in order (the simulator hashes them into
    prompt token ids)."""
    out: list[str] = []
    for piece in _TOKEN.findall(text):
        if len(piece) > WORD_CHARS:  # a run of word characters (a CJK piece is one character)
            out.extend(piece[i : i + RUN_CHARS_PER_TOKEN] for i in range(0, len(piece), RUN_CHARS_PER_TOKEN))
        else:
            out.append(piece)
    return out
