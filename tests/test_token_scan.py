"""The one-pass count (``core/token_scan.py``, what a compiled build runs) gives the regular
expressions' count (``core/tokens.py``, the estimate's definition) for every text: the token
corpus, hand-picked edges of each piece, random ASCII, and random text of every script (Han,
kana, hangul, other letters and digits, symbols counted twice, characters beyond the Basic
Multilingual Plane). Run compiled too (``tests/test_compiled_build.py``)."""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuniu.core import token_scan, tokens
from tests import token_corpus


def scan(text: str) -> int:
    args = (tokens.LETTERS_PER_TOKEN, tokens.DIGITS_PER_TOKEN, tokens.RUN_MIN, tokens._run_tokens)
    if text.isascii():
        return token_scan.count_ascii(text, token_scan.CLASSES, *args)
    return token_scan.count_text(text, tokens._plane_classes(), tokens._char_class, *args)


def by_pattern(text: str) -> int:
    return tokens.count_by_pattern(text, text.isascii())


# Each piece at its edges: word lengths around LETTERS_PER_TOKEN, a word before a digit,
# runs around RUN_MIN (letters only, digits only, mixed, RUN_MIN_LETTERS), digits around
# DIGITS_PER_TOKEN, underscores, line breaks with blanks, tabs and other white space, and
# characters that are neither (controls, DEL, punctuation).
EDGES = [
    "",
    "a",
    "abcdefghi",
    "abcdefghij",
    "abcdefghijk",
    "abcdefghijkl",
    "abc1",
    "abcdefghi1",
    "abcdefghij1",
    "abc123456789",
    "abc12345678",
    "1",
    "12",
    "123",
    "12345678901",
    "123456789012",
    "1111111111111",
    "a" * 23,
    "a" * 24,
    "a" * 40,
    "ab" * 30,
    "__init__",
    "snake_case_name_that_is_long",
    "x\n    y",
    "x\n\t \ty\n",
    "\n\n\n",
    "\r\n\x0b\x0c",
    "\x00\x01\x1c\x1f\x7f",
    "Hello, how are you?",
    "user: Hello, how are you?",
    "a.b,c;d!e?f",
    "word  word\tword",
    "deadbeefcafebabe0123456789abcdef",
    "aGVsbG8gd29ybGQgdGhpcyBpcyBiYXNlNjQ=",
]


@pytest.mark.parametrize("text", EDGES)
def test_the_scan_counts_each_edge_as_the_patterns_do(text: str) -> None:
    assert scan(text) == by_pattern(text)


def test_the_scan_counts_the_corpus_as_the_patterns_do() -> None:
    docs = [doc for _, doc in token_corpus.documents(seed=3, per_kind=10)]
    assert sum(doc.isascii() for doc in docs) > 30  # English, code, JSON, encoded, repeated
    assert sum(not doc.isascii() for doc in docs) > 20  # Chinese, mixed, symbols
    assert [scan(doc) for doc in docs] == [by_pattern(doc) for doc in docs]


def test_the_scan_counts_random_text_as_the_patterns_do() -> None:
    rng = random.Random(7)
    # Few characters, so that words, runs and the pieces between them meet often.
    alphabet = "ab1_ \n\t.\x0b"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(60))) for _ in range(3000)]
    assert [scan(t) for t in texts] == [by_pattern(t) for t in texts]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=127), max_size=80))
def test_the_scan_counts_any_ascii_text_as_the_patterns_do(text: str) -> None:
    assert scan(text) == by_pattern(text)


def test_every_class_is_the_patterns_class() -> None:
    # The table is built from the patterns; each class decides a different piece, so a
    # character moved to another class changes some count.
    for ch in string.printable + "".join(map(chr, range(32))) + "\x7f":
        for text in (ch, f"a{ch}b", f"{ch}{ch}", f"abcdefghi{ch}1", f"\n{ch}x"):
            assert scan(text) == by_pattern(text), repr(text)


def test_count_tokens_uses_the_scan_only_compiled() -> None:
    assert tokens._SCAN is token_scan.COMPILED


# Beyond ASCII, one of each kind the patterns tell apart: Han, kana (and the katakana middle
# dot, in the kana range but no word character: one piece there, and twice as a symbol),
# hangul, Latin and Cyrillic letters, a combining accent, decimal digits of other scripts
# (full-width, Arabic-Indic), digits that are not decimal (superscript two, a vulgar
# fraction: letters for the patterns), white space (no-break, ideographic), CJK and
# full-width punctuation (one piece), symbols (an arrow, an emoji: two), a Han character of
# extension B and an emoji beyond the plane, and ASCII among them.
WIDE_ALPHABET = "中文字あカ・한éжa\u0301\uff11٣²½\u00a0\u3000。\uff0c→😀\U00020000\U0001f9e0b1_ \n."


def test_the_scan_counts_random_text_of_every_script_as_the_patterns_do() -> None:
    rng = random.Random(11)
    texts = ["".join(rng.choice(WIDE_ALPHABET) for _ in range(rng.randrange(60))) for _ in range(3000)]
    assert [scan(t) for t in texts] == [by_pattern(t) for t in texts]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_the_scan_counts_any_text_as_the_patterns_do(text: str) -> None:
    assert scan(text) == by_pattern(text)


def test_the_plane_table_is_each_characters_class() -> None:
    # The table is found by the patterns over the whole plane at once; each character alone
    # must get the same class (the one the characters beyond the plane get).
    table = tokens._plane_classes()
    assert len(table) == 0x10000
    wrong = [
        code
        for code in range(0x10000)
        if table[code] != token_scan.char_class(chr(code), tokens._CJK, tokens._WIDE)
    ]
    assert wrong == []
    # ASCII: the same classes either way, but for the information separators, white space
    # only to the Unicode patterns (the ASCII text's patterns take \x1c-\x1f as pieces).
    differ = [code for code in range(128) if table[code] != token_scan.CLASSES[code]]
    assert differ == [0x1C, 0x1D, 0x1E, 0x1F]


def test_count_tokens_counts_text_beyond_ascii_as_the_patterns_do() -> None:
    for text in ("你好\uff0c世界\uff01今天天气很好。", "naïve café → 😀😀", "x² + ½ = ٣"):
        assert tokens.count_tokens(text) == by_pattern(text)


def split(text: str) -> list[str]:
    """The pieces by the scan of any text, and for ASCII text by the scan of bytes too (the
    two must agree)."""
    args = (tokens.LETTERS_PER_TOKEN, tokens.DIGITS_PER_TOKEN, tokens.RUN_MIN, tokens._run_tokens)
    classes = tokens._plane_classes()
    pieces: list[str] = []
    count = token_scan.count_text(text, classes, tokens._char_class, *args, pieces)
    assert count == len(pieces)
    if text.isascii():
        as_bytes: list[str] = []
        assert token_scan.count_ascii(text, classes, *args, as_bytes) == count
        assert as_bytes == pieces
    return pieces


def test_the_scan_splits_the_corpus_as_the_patterns_do() -> None:
    docs = [doc for _, doc in token_corpus.documents(seed=5, per_kind=10)]
    assert [split(doc) for doc in docs] == [tokens.split_by_pattern(doc) for doc in docs]


@pytest.mark.parametrize("text", EDGES)
def test_the_scan_splits_each_edge_as_the_patterns_do(text: str) -> None:
    assert split(text) == tokens.split_by_pattern(text)


def test_the_scan_splits_random_text_of_every_script_as_the_patterns_do() -> None:
    rng = random.Random(13)
    alphabet = WIDE_ALPHABET + "\t\x1c"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(60))) for _ in range(3000)]
    assert [split(t) for t in texts] == [tokens.split_by_pattern(t) for t in texts]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_the_scan_splits_any_text_as_the_patterns_do(text: str) -> None:
    assert split(text) == tokens.split_by_pattern(text)


def test_split_tokens_gives_the_patterns_pieces() -> None:
    for text in ("你好\uff0c世界\uff01", "def f(x):\n    return x_1 → 😀", "a" * 40 + " 1234567890123"):
        assert tokens.split_tokens(text) == tokens.split_by_pattern(text)
