"""The token estimate by one pass over the characters: what a compiled build runs for
:func:`~shuniu.core.tokens.count_tokens`.

:mod:`shuniu.core.tokens` defines the estimate by regular expressions; their engine tries
every alternative at each position, about 37 ns an ASCII character (0.67 ms for an
18,000-character prompt, more than the rest of a request's work in the gateway) and ~300 ns
a Chinese one. A regular install compiles this module with mypyc (``core/compiled.py``),
where this loop over a table of character classes costs a fraction of that; run by the
interpreter it would be the slower of the two, so a pure-Python install keeps the regular
expressions (``tokens`` chooses by :data:`COMPILED`). Both give the same count for every
text: ``tests/test_token_scan.py`` checks it on the token corpus and on random text of every
script, compiled too (``tests/test_compiled_build.py``).

The classes come from the patterns themselves (:data:`CLASSES` for ASCII text, whose
patterns are compiled with ``re.ASCII``; :func:`plane_classes` and :func:`char_class` for
other text), so the two cannot disagree on a character. How the pieces of ``tokens._TOKEN``
are found here, at each position, in its order: a word of at most ``LETTERS_PER_TOKEN``
letters not followed by a digit; else a run of at least ``RUN_MIN`` letters and digits
(counted by ``run_tokens``); else up to ``LETTERS_PER_TOKEN`` letters, or up to
``DIGITS_PER_TOKEN`` digits; an underscore, a line break, a kana, hangul or Han character,
or any other character that is neither a word character nor white space, one piece each,
and a symbol outside ASCII one more (``tokens._WIDE``). Other white space is no piece.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

__all__ = ["CLASSES", "COMPILED", "char_class", "count_ascii", "count_text", "plane_classes"]

COMPILED = not __file__.endswith(".py")
"""Whether this module runs compiled (loaded from an extension module)."""

_SPACE: Final = 0
"""White space other than a line break: no piece (nor are the blanks after a line break,
which its pattern takes with it: the count is the same)."""
_LETTER: Final = 1
_DIGIT: Final = 2
_PIECE: Final = 3
"""An underscore, a line break, a kana, hangul or Han character, or any other character
that is neither a word character nor white space: a piece of its own."""
_WIDE: Final = 4
"""A symbol outside ASCII that counts twice (``tokens._WIDE``): a piece, and one more."""


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


def plane_classes(cjk: str, wide: re.Pattern[str]) -> bytes:
    """The class of each code point of the Basic Multilingual Plane, by code, as the Unicode
    regular expressions classify it (``cjk``: the ranges counted one piece a character, a
    character set's body; ``wide``: a symbol counted twice), as :func:`char_class` would
    give one by one: found by the patterns over the whole plane at once (~15 ms)."""
    plane = "".join(map(chr, range(0x10000)))
    out = bytearray([_PIECE]) * len(plane)
    marks = (
        (r"\s+", _SPACE),
        (rf"[^\W\d_{cjk}]+", _LETTER),
        (rf"[^\D{cjk}]+", _DIGIT),
        (f"(?:{wide.pattern})+", _WIDE),
    )
    for pattern, kind in marks:
        for found in re.finditer(pattern, plane):
            start, end = found.span()
            out[start:end] = bytes([kind]) * (end - start)
    out[ord("_")] = out[ord("\n")] = _PIECE
    return bytes(out)


def char_class(ch: str, cjk: str, wide: re.Pattern[str]) -> int:
    """The class of one character, as :func:`plane_classes` gives it for the plane's: for
    those beyond it (emoji, the CJK extensions past the plane)."""
    if ch in "_\n":
        return _PIECE
    if re.fullmatch(r"\s", ch):
        return _SPACE
    if re.fullmatch(rf"[^\W\d_{cjk}]", ch):
        return _LETTER
    if re.fullmatch(rf"[^\D{cjk}]", ch):
        return _DIGIT
    return _WIDE if wide.fullmatch(ch) else _PIECE


def count_ascii(
    text: str,
    classes: bytes,
    letters_per_token: int,
    digits_per_token: int,
    run_min: int,
    run_tokens: Callable[[str], int],
    pieces: list[str] | None = None,
) -> int:
    """The estimate of ``text`` (ASCII only), read as bytes: its pieces, a run's pieces as
    ``run_tokens`` counts them. ``classes``: each ASCII character's class, by code (only
    the first 128 entries are read: :data:`CLASSES` to count as the ASCII patterns do,
    :func:`plane_classes`' table to split as the Unicode ones do). With ``pieces``, each
    piece is appended to it too, as ``tokens.split_tokens`` cuts them. The same scan as
    :func:`count_text` (keep the two alike), over bytes: the scan of a ``str``'s characters
    measured 2 to 3 times slower on English text."""
    data = text.encode("ascii")
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
                    if pieces is not None:
                        pieces.append(text[i:end])
                    i = end
                    continue
            stop = end  # the end of the letters and digits
            while stop < n:
                c = classes[data[stop]]
                if c != _LETTER and c != _DIGIT:
                    break
                stop += 1
            if stop - i >= run_min:
                count += _run(text[i:stop], run_tokens, pieces)
                i = stop
                continue
            count += 1
            if kind == _LETTER:
                end = min(end, i + letters_per_token)
            else:
                end = i + 1
                while end < n and end - i < digits_per_token and classes[data[end]] == _DIGIT:
                    end += 1
            if pieces is not None:
                pieces.append(text[i:end])
            i = end
        elif kind == _PIECE:
            count += 1
            if pieces is None:
                i += 1
                continue
            end = i + 1
            if data[i] == 10:  # a line break takes the blanks after it
                while end < n and (data[end] == 32 or data[end] == 9):
                    end += 1
            pieces.append(text[i:end])
            i = end
        else:
            i += 1
    return count


def count_text(
    text: str,
    classes: bytes,
    other: Callable[[int], int],
    letters_per_token: int,
    digits_per_token: int,
    run_min: int,
    run_tokens: Callable[[str], int],
    pieces: list[str] | None = None,
) -> int:
    """The estimate of any ``text``: :func:`count_ascii` over its characters. ``classes``
    holds the class of each code point below its length (:func:`plane_classes`), ``other``
    gives the class of one beyond it. (Each look-up is written out where it is needed: a
    call per character would cost more than the scan.)"""
    n = len(text)
    size = len(classes)
    count = 0
    i = 0
    while i < n:
        code = ord(text[i])  # compiled: read in place, no one-character str made
        kind = classes[code] if code < size else other(code)
        if kind == _LETTER or kind == _DIGIT:
            end = i + 1  # the end of the letters (of a word starting with one)
            if kind == _LETTER:
                while end < n:
                    code = ord(text[end])
                    if (classes[code] if code < size else other(code)) != _LETTER:
                        break
                    end += 1
                after = _SPACE  # what follows the letters (nothing at the end)
                if end < n:
                    code = ord(text[end])
                    after = classes[code] if code < size else other(code)
                if end - i <= letters_per_token and after != _DIGIT:
                    count += 1  # a word
                    if pieces is not None:
                        pieces.append(text[i:end])
                    i = end
                    continue
            stop = end  # the end of the letters and digits
            while stop < n:
                code = ord(text[stop])
                c = classes[code] if code < size else other(code)
                if c != _LETTER and c != _DIGIT:
                    break
                stop += 1
            if stop - i >= run_min:
                count += _run(text[i:stop], run_tokens, pieces)
                i = stop
                continue
            count += 1
            if kind == _LETTER:
                end = min(end, i + letters_per_token)
            else:
                end = i + 1
                while end < n and end - i < digits_per_token:
                    code = ord(text[end])
                    if (classes[code] if code < size else other(code)) != _DIGIT:
                        break
                    end += 1
            if pieces is not None:
                pieces.append(text[i:end])
            i = end
        elif kind == _PIECE or kind == _WIDE:
            end = i + 1
            if pieces is not None:
                if code == 10:  # a line break takes the blanks after it
                    while end < n and (ord(text[end]) == 32 or ord(text[end]) == 9):
                        end += 1
                pieces.append(text[i:end])
                if kind == _WIDE:
                    pieces.append(text[i:end])
            count += 2 if kind == _WIDE else 1
            i = end
        else:
            i += 1
    return count


def _run(run: str, run_tokens: Callable[[str], int], pieces: list[str] | None) -> int:
    """The count of a run; with ``pieces``, the run cut into that many pieces of (about)
    equal length, appended to it."""
    many = run_tokens(run)
    if pieces is not None:
        size = len(run) / many
        for k in range(many):
            pieces.append(run[int(k * size) : int((k + 1) * size)])
    return many
