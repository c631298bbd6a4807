"""The token estimate of ASCII text by one pass over its bytes: what a compiled build runs
for :func:`~shuniu.core.tokens.count_tokens` on ASCII text.

:mod:`shuniu.core.tokens` defines the estimate by regular expressions; their engine tries
every alternative at each position, about 37 ns a character (0.67 ms for an 18,000-character
prompt, more than the rest of a request's work in the gateway). A regular install compiles
this module with mypyc (``core/compiled.py``), where this loop over a table of character
classes costs a fraction of that; run by the interpreter it would be the slower of the two,
so a pure-Python install keeps the regular expressions (``tokens`` chooses by
:data:`COMPILED`). Both give the same count for every ASCII text:
``tests/test_token_scan.py`` checks it on the token corpus and on random text, compiled too
(``tests/test_compiled_build.py``).

How the pieces of ``tokens._TOKEN_ASCII`` are found here, at each position, in its order:
a word of at most ``LETTERS_PER_TOKEN`` letters not followed by a digit; else a run of at
least ``RUN_MIN`` letters and digits (counted by ``run_tokens``); else up to
``LETTERS_PER_TOKEN`` letters, or up to ``DIGITS_PER_TOKEN`` digits; an underscore, a line
break, or any other character that is neither a word character nor white space, one piece
each. Other white space is no piece.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

__all__ = ["CLASSES", "COMPILED", "count_ascii"]

COMPILED = not __file__.endswith(".py")
"""Whether this module runs compiled (loaded from an extension module)."""

_SPACE: Final = 0
"""White space other than a line break: no piece (nor are the blanks after a line break,
which its pattern takes with it: the count is the same)."""
_LETTER: Final = 1
_DIGIT: Final = 2
_PIECE: Final = 3
"""An underscore, a line break, or neither a word character nor white space: a piece of
its own."""


def _classes() -> bytes:
    """Each ASCII character's class, by code, as the regular expressions (``re.ASCII``)
    classify it: taken from them, so that the two cannot disagree."""
    out = bytearray()
    for code in range(128):
        ch = chr(code)
        if ch in "_\n":
            kind = _PIECE
        elif re.fullmatch(r"\d", ch, re.ASCII):
            kind = _DIGIT
        elif re.fullmatch(r"[^\W\d_]", ch, re.ASCII):
            kind = _LETTER
        elif re.fullmatch(r"\s", ch, re.ASCII):
            kind = _SPACE
        else:
            kind = _PIECE
        out.append(kind)
    return bytes(out)


CLASSES: Final = _classes()
"""Class of each ASCII character, by its code."""


def count_ascii(
    text: str,
    letters_per_token: int,
    digits_per_token: int,
    run_min: int,
    run_tokens: Callable[[str], int],
) -> int:
    """The estimate of ``text`` (ASCII only): its pieces, a run's pieces as ``run_tokens``
    counts them."""
    data = text.encode("ascii")
    classes = CLASSES
    n = len(data)
    count = 0
    i = 0
    while i < n:
        kind = classes[data[i]]
        if kind == _LETTER or kind == _DIGIT:
            end = i + 1  # the end of the letters (of a word starting with one)
            if kind == _LETTER:
                while end < n and classes[data[end]] == _LETTER:
                    end += 1
                if end - i <= letters_per_token and (end == n or classes[data[end]] != _DIGIT):
                    count += 1  # a word
                    i = end
                    continue
            stop = end  # the end of the letters and digits
            while stop < n:
                c = classes[data[stop]]
                if c != _LETTER and c != _DIGIT:
                    break
                stop += 1
            if stop - i >= run_min:
                count += run_tokens(text[i:stop])
                i = stop
                continue
            count += 1
            if kind == _LETTER:
                i = min(end, i + letters_per_token)
            else:
                end = i + 1
                while end < n and end - i < digits_per_token and classes[data[end]] == _DIGIT:
                    end += 1
                i = end
        elif kind == _PIECE:
            count += 1
            i += 1
        else:
            i += 1
    return count
