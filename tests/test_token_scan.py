"""The one-pass count of ASCII text (``core/token_scan.py``, what a compiled build runs) gives
the regular expressions' count (``core/tokens.py``, the estimate's definition) for every
text: the token corpus, hand-picked edges of each piece, and random ASCII. Run compiled too
(``tests/test_compiled_build.py``)."""

from __future__ import annotations

import random
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shuniu.core import token_scan, tokens
from tests import token_corpus


def scan(text: str) -> int:
    return token_scan.count_ascii(
        text,
        tokens.LETTERS_PER_TOKEN,
        tokens.DIGITS_PER_TOKEN,
        tokens.RUN_MIN,
        tokens._run_tokens,
    )


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
    docs = [doc for _, doc in token_corpus.documents(seed=3, per_kind=10) if doc.isascii()]
    assert len(docs) > 30  # English, code, JSON, encoded, repeated
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
