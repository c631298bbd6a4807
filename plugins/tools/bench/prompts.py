"""Synthetic prompts with a known approximate token count, deterministic by seed.

A prompt of ``n`` tokens is ``n`` words drawn from a fixed vocabulary of 256 common English
words, each of which is one token in the usual BPE vocabularies (GPT, Llama, Qwen: a
leading space plus a common word is a single token) and one token by shuniu's own estimate
(:mod:`shuniu.core.tokens`). The words come from SHAKE-128 of ``(seed, what)``: one byte of
the hash picks one word, so making a 1,000-token prompt costs about 25 µs here and the same seed
always gives the same text. A chat template or an engine's special tokens add a few tokens on
top; ``usage.prompt_tokens`` in the report is what the server counted.

Shared prefixes: prefix group ``g`` of a run is the words of ``(seed, "prefix", g)``, so
every request of that group starts with exactly the same text (an engine's prefix cache hits
on it), and distinct groups differ from their first word.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import shake_128
from operator import itemgetter

__all__ = ["VOCABULARY", "PromptMaker", "ids_to_text", "words"]

_WORDS = """
time year people way day man thing woman life child world school state family student group
country problem hand part place case week company system program question work purpose
number night point home water room mother area money story fact month lot right study book
eye job word business issue side kind head house service friend father power hour game line
end member law car city name team minute idea body back parent face level office door health
person art war history party result change morning reason research girl guy moment air teacher
force education foot boy age policy music market sense nation plan college interest death
method effect class control care field role effort rate heart show leader light voice wife
police mind price report decision son view town road arm value building action model season
society tax director position player record paper space ground form event matter center couple
site project activity star table need court oil situation cost industry figure street image
phone data picture practice piece land product doctor wall patient worker news test movie north
love support region step baby computer type attention film tree source evidence window
river garden bird stone summer winter spring island ocean forest mountain village letter train
ship bridge horse dog cat fish flower fruit bread milk coffee tea sugar salt rain snow wind
cloud sun moon sky fire earth gold silver glass paper color sound song dance memory dream
question answer reason simple small large early late young old new good great little long high
open close green blue red black white happy strong quick slow warm cold clear free full
""".split()

VOCABULARY: tuple[str, ...] = tuple(dict.fromkeys(_WORDS))[:256]
"""The 256 words prompts are made of (``VOCABULARY[b]`` for a hash byte ``b``)."""
assert len(VOCABULARY) == 256, len(VOCABULARY)

_BY_ID = VOCABULARY * 128  # token id (0..32767, the simulator's range) -> word
_SEED_MASK = (1 << 64) - 1


def _join(table: Sequence[str], keys: Sequence[int]) -> str:
    if len(keys) == 1:
        return table[keys[0]]
    return " ".join(itemgetter(*keys)(table))  # one C call for the whole lookup


def _digest(seed: int, what: str, n: int) -> bytes:
    key = (seed & _SEED_MASK).to_bytes(8, "little") + what.encode()
    return shake_128(key).digest(n)


def words(seed: int, what: str, n: int) -> str:
    """``n`` words, the same for the same ``(seed, what)`` (and a longer call starts with a
    shorter one's words)."""
    if n <= 0:
        return ""
    return _join(VOCABULARY, _digest(seed, what, n))


def ids_to_text(ids: Sequence[int]) -> str:
    """Token ids in ``[0, 32768)`` (the simulator's synthetic prompts) as words: id ``i``
    becomes ``VOCABULARY[i % 256]``, so equal id prefixes give equal text prefixes."""
    if not ids:
        return ""
    return _join(_BY_ID, ids)


class PromptMaker:
    """Prompts of a run: request ``i`` gets unique words ``(seed, i)``; with ``prefix_tokens``
    it also gets the shared prefix of group ``i mod groups``."""

    def __init__(self, seed: int, prefix_tokens: int = 0, groups: int = 1) -> None:
        if prefix_tokens < 0 or groups < 1:
            raise ValueError("prefix_tokens must be >= 0 and groups >= 1")
        self.seed = seed
        self.prefix_tokens = prefix_tokens
        self.groups = groups
        self._prefixes: dict[int, str] = {}

    def prefix(self, group: int) -> str:
        """The shared prefix text of ``group`` ('' without shared prefixes)."""
        if not self.prefix_tokens:
            return ""
        found = self._prefixes.get(group)
        if found is None:
            found = self._prefixes[group] = words(self.seed, f"prefix/{group}", self.prefix_tokens)
        return found

    def make(self, index: int, tokens: int) -> tuple[str, str]:
        """(shared prefix, unique part) of request ``index``'s prompt; the unique part has
        ``tokens`` words."""
        return self.prefix(index % self.groups), words(self.seed, f"request/{index}", tokens)
