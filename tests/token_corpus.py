"""A multilingual text corpus built on this machine (no download), for token-count checks.

Each document belongs to one kind of traffic a gateway sees:

- ``chinese``: sentences of words drawn from jieba's dictionary by their frequency (the
  349,000-word ``dict.txt`` that the ``jieba`` package ships), with Chinese punctuation;
- ``english``: the docstrings of standard-library modules (real English prose);
- ``code``: standard-library source, cut into functions' worth of lines;
- ``mixed``: Chinese sentences with English terms, identifiers and numbers in them, the
  way Chinese users write about software;
- ``json``: tool-call style JSON objects with Chinese and English values, both raw UTF-8
  and ``\\uXXXX``-escaped;
- ``encoded``: base64, hex digests and long URLs (unbroken runs);
- ``symbols``: emoji, arrows, maths and box-drawing mixed with short text;
- ``repeated``: one character thousands of times (not in the training text: a tokenizer
  trained on it learns absurd merges no real vocabulary has).

``documents(seed)`` is deterministic. :func:`training_texts` (seed 0) trains the tiny model's
tokenizer (``tests/tiny_model.py --corpus``); checks use another seed, so a tokenizer is
never measured on the text it was trained on. Run as a script to write a training file::

    python tests/token_corpus.py OUT.txt     # the training text, one JSON string per line
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import inspect
import json
import os
import random
import sys
import warnings
from collections.abc import Iterator
from functools import cache
from pathlib import Path

__all__ = ["KINDS", "TRAINING_MIX", "chinese_words", "documents", "training_texts", "write_training_text"]

KINDS = ("chinese", "english", "code", "mixed", "json", "encoded", "symbols", "repeated")

_MODULES = (
    "argparse", "asyncio.events", "asyncio.tasks", "collections", "json", "logging", "pathlib",
    "re", "subprocess", "textwrap", "typing", "unittest.case", "urllib.request", "http.client",
    "email.message", "datetime", "decimal", "fractions", "functools", "itertools", "shutil",
    "socket", "sqlite3", "string", "tarfile", "threading", "zipfile", "csv", "difflib",
    "heapq", "inspect", "ipaddress", "contextlib", "dataclasses", "enum", "gzip", "hashlib",
    "pprint", "queue", "random", "statistics", "tempfile", "tokenize", "uuid", "weakref",
)  # fmt: skip
_CN_COMMA = "，、；："  # noqa: RUF001
_CN_END = "。！？"  # noqa: RUF001
_SYMBOLS = "😀😂🤔👍🚀🔥✅❌⚠️📈🎉💡→←↑↓⇒≤≥≠±×÷∑∫√∞°€£¥©®™§¶•…─│┌┐└┘├┤★☆♠♥♦♣"  # noqa: RUF001


@cache
def chinese_words() -> tuple[tuple[str, ...], tuple[int, ...]]:
    """jieba's dictionary: the Chinese words (with at least one Han character) and their
    cumulative frequencies, for ``random.choices``."""
    import jieba  # test dependency: the dictionary ships inside the package

    path = Path(jieba.__file__).parent / "dict.txt"
    words: list[str] = []
    cum: list[int] = []
    total = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        word, freq, *_ = line.split(" ")
        if any("\u4e00" <= ch <= "\u9fff" for ch in word):
            total += int(freq)
            words.append(word)
            cum.append(total)
    return tuple(words), tuple(cum)


@cache
def _docstrings() -> tuple[str, ...]:
    out: list[str] = []
    with warnings.catch_warnings():  # typing's deprecated io and re aliases warn when read
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in _MODULES:
            mod = importlib.import_module(name)
            for obj in [mod, *(getattr(mod, a) for a in sorted(vars(mod)) if not a.startswith("_"))]:
                doc = inspect.getdoc(obj) if callable(obj) or obj is mod else None
                if doc and len(doc) > 120 and doc not in out:
                    out.append(doc)
    return tuple(out)


@cache
def _sources() -> tuple[str, ...]:
    out: list[str] = []
    for name in _MODULES:
        mod = importlib.import_module(name)
        if not getattr(mod, "__file__", None):  # a built-in module has no source
            continue
        lines = inspect.getsource(mod).splitlines(keepends=True)
        out.extend("".join(lines[i : i + 40]) for i in range(0, len(lines), 40))
    return tuple(s for s in out if s.strip())


def _chinese_sentence(rng: random.Random) -> str:
    words, cum = chinese_words()
    parts: list[str] = []
    for _ in range(rng.randint(2, 4)):
        parts.append("".join(rng.choices(words, cum_weights=cum, k=rng.randint(3, 8))))
        parts.append(rng.choice(_CN_COMMA))
    parts[-1] = rng.choice(_CN_END)
    return "".join(parts)


def _chinese(rng: random.Random) -> str:
    return "".join(_chinese_sentence(rng) for _ in range(rng.randint(3, 12)))


def _english(rng: random.Random) -> str:
    return rng.choice(_docstrings())


def _code(rng: random.Random) -> str:
    return rng.choice(_sources())


def _english_terms(rng: random.Random) -> list[str]:
    text = rng.choice(_docstrings())
    return [w.strip(".,:;()") for w in text.split() if w.strip(".,:;()").isascii()] or ["API"]


def _mixed(rng: random.Random) -> str:
    terms = _english_terms(rng)
    out: list[str] = []
    for _ in range(rng.randint(3, 10)):
        sentence = _chinese_sentence(rng)
        cut = rng.randint(0, len(sentence) - 1)
        pick = rng.random()
        if pick < 0.4:
            insert = " " + " ".join(rng.choices(terms, k=rng.randint(1, 4))) + " "
        elif pick < 0.7:
            insert = f" `{rng.choice(terms).lower()}_{rng.choice(terms).lower()}` "
        else:
            insert = f" {rng.randint(1, 100000)} "
        out.append(sentence[:cut] + insert + sentence[cut:])
    return "".join(out)


def _json(rng: random.Random) -> str:
    obj = {
        "id": f"call_{rng.getrandbits(48):012x}",
        "type": "function",
        "function": {
            "name": rng.choice(["get_weather", "search_docs", "create_ticket", "查询订单"]),
            "arguments": {
                "query": _chinese_sentence(rng),
                "city": rng.choice(["北京", "上海", "深圳", "San Francisco", "杭州"]),
                "limit": rng.randint(1, 50),
                "tags": [rng.choice(_english_terms(rng)) for _ in range(rng.randint(1, 5))],
                "note": " ".join(_english_terms(rng)[:12]),
            },
        },
    }
    return json.dumps(obj, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 2]))


def _encoded(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.4:
        return base64.b64encode(rng.randbytes(rng.randint(48, 3000))).decode()
    if pick < 0.7:
        return "".join(hashlib.sha256(rng.randbytes(16)).hexdigest() for _ in range(rng.randint(1, 20)))
    path = "/".join(rng.choice(_english_terms(rng)).lower() for _ in range(rng.randint(3, 12)))
    query = "&".join(f"k{i}={rng.getrandbits(40):x}" for i in range(rng.randint(1, 8)))
    return f"https://example.com/{path}?{query}"


def _repeated(rng: random.Random) -> str:
    # One character many times: what a client sends to slip a long prompt under a limit.
    return rng.choice("abcxyz0-=") * rng.randint(100, 5000)


def _symbols(rng: random.Random) -> str:
    out: list[str] = []
    terms = _english_terms(rng)
    for _ in range(rng.randint(10, 60)):
        out.append(rng.choice(_SYMBOLS) * rng.randint(1, 3))
        if rng.random() < 0.5:
            out.append(rng.choice(terms))
        if rng.random() < 0.3:
            out.append(_chinese_sentence(rng)[: rng.randint(2, 8)])
        out.append(rng.choice(["", " ", "\n"]))
    return "".join(out)


_MAKERS = {
    "chinese": _chinese,
    "english": _english,
    "code": _code,
    "mixed": _mixed,
    "json": _json,
    "encoded": _encoded,
    "symbols": _symbols,
    "repeated": _repeated,
}


def documents(seed: int, per_kind: int = 40) -> Iterator[tuple[str, str]]:
    """``per_kind`` documents of every kind, as ``(kind, text)``, drawn with ``seed``."""
    rng = random.Random(seed)
    for kind in KINDS:
        make = _MAKERS[kind]
        for _ in range(per_kind):
            yield kind, make(rng)


TRAINING_MIX = {
    "chinese": 1800,
    "english": 1800,
    "code": 1200,
    "mixed": 600,
    "json": 600,
    "encoded": 180,
    "symbols": 12,
}
"""Documents of each kind in the training text: mostly prose and code, few encoded strings
and emoji, as in the corpora real vocabularies are trained on (a vocabulary trained on as
much emoji as prose learns them as single tokens, which no real one does)."""


def training_texts() -> list[str]:
    """The tiny tokenizer's training text (seed 0, :data:`TRAINING_MIX`)."""
    rng = random.Random(0)
    return [_MAKERS[kind](rng) for kind, n in TRAINING_MIX.items() for _ in range(n)]


def write_training_text(path: Path) -> Path:
    """:func:`training_texts` into ``path``, one JSON string per line (atomically)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as out:
        for text in training_texts():
            out.write(json.dumps(text, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


_PACKAGED = r"""
import json, os, sys
import mistral_common
from mistral_common.tokens.tokenizers.sentencepiece import SentencePieceTokenizer
from mistral_common.tokens.tokenizers.tekken import Tekkenizer
data = os.path.join(os.path.dirname(mistral_common.__file__), "data")
texts = json.load(sys.stdin)
out = {}
files = (("tekken_240911.json", Tekkenizer.from_file), ("tokenizer.model.v1", SentencePieceTokenizer))
for name, make in files:
    tok = make(os.path.join(data, name))
    out[name] = [len(tok.encode(t, bos=False, eos=False)) for t in texts]
json.dump(out, sys.stdout)
"""


def packaged_counts(python: Path, texts: list[str]) -> dict[str, list[int]]:
    """Counts of ``texts`` by the tokenizer files the ``mistral_common`` package ships (vLLM
    depends on it): Tekken (a 131k-token byte-level BPE of Mistral's multilingual models) and
    the 32k-token SentencePiece BPE of the first Mistral models, each by the package's own
    code, run with ``python`` (the vLLM virtualenv's)."""
    import subprocess

    done = subprocess.run(
        [str(python), "-c", _PACKAGED], input=json.dumps(texts), capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"counting with mistral_common failed:\n{done.stderr[-2000:]}")
    return {f"mistral_common {name}": counts for name, counts in json.loads(done.stdout).items()}


def ratios(
    kinds: list[str], estimate: list[int], reference: list[int]
) -> dict[str, tuple[float, float, float]]:
    """Per kind: (total estimate / total reference, lowest and highest document ratio)."""
    out: dict[str, tuple[float, float, float]] = {}
    for kind in dict.fromkeys(kinds):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        per_doc = [estimate[i] / reference[i] for i in idx if reference[i]]
        total = sum(estimate[i] for i in idx) / sum(reference[i] for i in idx)
        out[kind] = (total, min(per_doc), max(per_doc))
    return out


if __name__ == "__main__":
    print(write_training_text(Path(sys.argv[1])))
