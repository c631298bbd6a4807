"""A deterministic, dependency-free token estimate.

Engines count with their own tokenizer, and a model with ``tokenizer:`` in the deployment
file is counted with it (:mod:`shuniu.core.tokenization`). Without one the gateway still
needs a count for every limit measured in tokens (the context check, ``max_prompt_tokens``,
TPM, length routing, fair shares), and the simulator counts exactly this way. The estimate
must never undercount badly, whatever the language or the trick:

- a Han ideograph, kana or hangul syllable is one token (the vocabularies of Chinese,
  Japanese and Korean models give about one per character);
- letters are one token per :data:`LETTERS_PER_TOKEN` (a word, or the pieces of a long
  one), digits one per :data:`DIGITS_PER_TOKEN`, an underscore one;
- a line break with the indentation after it is one token (code);
- a punctuation mark is one token; an emoji or any other non-ASCII symbol two (byte-level
  vocabularies spend two to four bytes' tokens on them);
- an unbroken run that is not a word (:data:`RUN_MIN` word characters or more with a digit
  in them, or :data:`RUN_MIN_LETTERS` letters: base64, a hash, 100,000 letters without a
  space) is at least one token per :data:`RUN_CHARS_PER_TOKEN` characters, and one
  character repeated is one token per character, so a run's length bounds its count.

Measured on a corpus of Chinese, English, code, mixed, JSON, encoded strings and symbols
(``tests/token_corpus.py``; the table is in ``docs/tokens.md``), the total of each kind is
within 20% of three real BPE tokenizers (Mistral's Tekken and SentencePiece vocabularies
and a byte-level BPE trained here), and no document is below 0.7 of any of them.
"""

from __future__ import annotations

import functools
import re

from shuniu.core import token_scan

__all__ = [
    "DIGITS_PER_TOKEN",
    "LETTERS_PER_TOKEN",
    "MESSAGE_TOKENS",
    "REPLY_TOKENS",
    "RUN_CHARS_PER_TOKEN",
    "RUN_MIN",
    "RUN_MIN_LETTERS",
    "count_by_pattern",
    "count_chat",
    "count_tokens",
    "split_by_pattern",
    "split_tokens",
]

LETTERS_PER_TOKEN = 9
"""Letters counted as one token (a word; a longer word is several)."""
DIGITS_PER_TOKEN = 2
"""Digits counted as one token."""
RUN_MIN = 12
"""Word characters, digits among them, from which an unbroken run counts by its length."""
RUN_MIN_LETTERS = 24
"""Letters from which an unbroken run of letters only counts by its length."""
RUN_CHARS_PER_TOKEN = 1.5
"""Characters per token, at most, of an unbroken run counted by its length."""
MESSAGE_TOKENS = 2
"""Tokens a chat template adds around each message beyond its role and a line break (the
start and end markers of ChatML, Llama 3's header and end-of-turn tokens)."""
REPLY_TOKENS = 3
"""Tokens of the generation prompt a chat template ends with (``<|im_start|>assistant``
and its line break)."""

# Han (CJK unified ideographs, extension A and B+, compatibility), kana, hangul syllables.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f"
_PIECE = rf"[^\W\d_{_CJK}]{{1,{LETTERS_PER_TOKEN}}}|[{_CJK}]|\d{{1,{DIGITS_PER_TOKEN}}}|_|\n[ \t]*|[^\w\s]"
_PIECES = re.compile(_PIECE)
# The same pieces, with a run of RUN_MIN word characters or more matched whole (and
# captured): the regex engine tries it only where a piece starts, so finding runs costs
# almost nothing on text without them (a separate search would try every position).
_TOKEN = re.compile(rf"([^\W_{_CJK}]{{{RUN_MIN},}})|{_PIECE}")
# The same pattern for ASCII text, compiled with re.ASCII: the same matches on ASCII input
# (letters, digits and word characters are the ASCII ones either way), found about twice as
# fast, since no character class has to be looked up in the Unicode tables.
# A whole word of at most LETTERS_PER_TOKEN letters (no word character after it) is tried
# first, with the space after it: prose is mostly such words, and each is then one match
# that skips its space, instead of a failed try for a run, the letters, and a failed try of
# every alternative at the space. The same count: such a word is no run (it is shorter than
# RUN_MIN), and a space there is no piece. About 1.2x on English prose, 1.9x on text of
# plain words; not used for other scripts, where it measured slower.
_PIECE_ASCII = rf"[^\W\d_]{{1,{LETTERS_PER_TOKEN}}}|\d{{1,{DIGITS_PER_TOKEN}}}|_|\n[ \t]*|[^\w\s]"
_TOKEN_ASCII = re.compile(
    rf"[a-zA-Z]{{1,{LETTERS_PER_TOKEN}}}(?![a-zA-Z0-9]) ?|([^\W_]{{{RUN_MIN},}})|{_PIECE_ASCII}", re.ASCII
)
# Symbols outside ASCII (emoji, arrows, maths, box drawing) count twice; CJK and full-width
# punctuation, which Chinese vocabularies hold as single tokens, once.
_WIDE = re.compile(r"[^\w\s\x00-\x7f\u3000-\u303f\uff00-\uffef]")
_SCAN = token_scan.COMPILED
"""Count with :func:`~shuniu.core.token_scan.count_text` (compiled, it is the faster;
interpreted, the regular expressions are)."""


@functools.cache
def _plane_classes() -> bytes:
    """The class of each character of the Basic Multilingual Plane for the scan, made when
    the first text beyond ASCII is counted (~15 ms, 64 KiB)."""
    return token_scan.plane_classes(_CJK, _WIDE)


@functools.lru_cache(maxsize=4096)
def _char_class(code: int) -> int:
    """The scan's class of a character beyond the plane (an emoji, a rare Han character)."""
    return token_scan.char_class(chr(code), _CJK, _WIDE)


def _run_tokens(run: str) -> int:
    """The count of a run of :data:`RUN_MIN` word characters or more."""
    if len(run) < RUN_MIN_LETTERS and run.isalpha():  # a long word: its pieces
        return -(-len(run) // LETTERS_PER_TOKEN)
    if run.count(run[0]) == len(run):  # one character repeated
        return len(run)
    return max(-int(-len(run) // RUN_CHARS_PER_TOKEN), len(_PIECES.findall(run)))


def count_tokens(text: str) -> int:
    """The estimated token count of ``text`` (``len(split_tokens(text))``, without building
    the split pieces)."""
    ascii = text.isascii()
    if _SCAN:
        # Compiled: one pass over the characters (the same count; see core/token_scan.py).
        if ascii:
            return token_scan.count_ascii(
                text, token_scan.CLASSES, LETTERS_PER_TOKEN, DIGITS_PER_TOKEN, RUN_MIN, _run_tokens
            )
        classes = _plane_classes()
        return token_scan.count_text(
            text, classes, _char_class, LETTERS_PER_TOKEN, DIGITS_PER_TOKEN, RUN_MIN, _run_tokens
        )
    return count_by_pattern(text, ascii)


def count_by_pattern(text: str, ascii: bool) -> int:
    """:func:`count_tokens` by the regular expressions (``ascii``: ``text.isascii()``), the
    estimate's definition (what an interpreted install runs)."""
    found = (_TOKEN_ASCII if ascii else _TOKEN).findall(text)  # a run's text, or "" for any other piece
    n = len(found)
    if any(found):
        for run in filter(None, found):
            n += _run_tokens(run) - 1
    if not ascii:
        n += len(_WIDE.findall(text))
    return n


def count_chat(flattened: str, messages: int) -> int:
    """The estimated count of a chat prompt: ``flattened`` is its messages as
    ``role: content`` lines, and the template's markers are added (:data:`MESSAGE_TOKENS` per
    message, :data:`REPLY_TOKENS` for the reply's start), as engines count them."""
    return count_tokens(flattened) + MESSAGE_TOKENS * messages + REPLY_TOKENS


def split_tokens(text: str) -> list[str]:
    """The pieces :func:`count_tokens` counts, in order (the simulator hashes them into
    prompt token ids). A symbol counted twice appears twice; a long run is cut into as many
    pieces as it counts."""
    if _SCAN:
        # Compiled: the same pieces in one pass (the Unicode patterns' classes, as
        # split_by_pattern uses them for every text).
        pieces: list[str] = []
        classes = _plane_classes()
        if text.isascii():
            token_scan.count_ascii(
                text, classes, LETTERS_PER_TOKEN, DIGITS_PER_TOKEN, RUN_MIN, _run_tokens, pieces
            )
        else:
            token_scan.count_text(
                text, classes, _char_class, LETTERS_PER_TOKEN, DIGITS_PER_TOKEN, RUN_MIN, _run_tokens, pieces
            )
        return pieces
    return split_by_pattern(text)


def split_by_pattern(text: str) -> list[str]:
    """:func:`split_tokens` by the regular expressions, its definition (what an interpreted
    install runs)."""
    out: list[str] = []
    for match in _TOKEN.finditer(text):
        piece = match.group()
        if match.group(1) is None:
            out.append(piece)
            if len(piece) == 1 and _WIDE.match(piece) is not None:
                out.append(piece)
            continue
        n = _run_tokens(piece)
        size = len(piece) / n
        out.extend(piece[int(i * size) : int((i + 1) * size)] for i in range(n))
    return out
