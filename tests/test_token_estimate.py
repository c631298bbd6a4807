"""The fallback estimate (``core/tokens.py``) against real BPE tokenizers, on a corpus built
here (``tests/token_corpus.py``: Chinese, English, code, mixed, JSON, encoded strings,
symbols, one character repeated).

References: the tiny model's tokenizer (an 8,192-token byte-level BPE trained here on the
corpus' training seed; measured on another seed), and the tokenizer files the
``mistral_common`` package ships, counted by that package's own code in the vLLM
virtualenv. For every kind but ``repeated`` the estimate's total is within 30% of each
reference's; no document at all, ``repeated`` included, is counted below 0.7 of any.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shuniu.core.tokens import count_tokens
from tests.test_vllm_real import PYTHON, VENV

sys.path.insert(0, str(Path(__file__).parent))
import tiny_model  # type: ignore[import-not-found]
import token_corpus  # type: ignore[import-not-found]

sys.path.pop(0)

pytest.importorskip("tokenizers", reason="needs the tokenizers package (the test extra)")
pytest.importorskip("jieba", reason="needs jieba's dictionary for the Chinese documents (the test extra)")

DOCS = list(token_corpus.documents(seed=1))
KINDS = [k for k, _ in DOCS]
TEXTS = [t for _, t in DOCS]


@pytest.fixture(scope="module")
def estimate() -> list[int]:
    return [count_tokens(t) for t in TEXTS]


def _check(name: str, estimate: list[int], reference: list[int]) -> None:
    table = token_corpus.ratios(KINDS, estimate, reference)
    print(f"\n{name}: " + ", ".join(f"{k} {t:.2f} [{lo:.2f}, {hi:.2f}]" for k, (t, lo, hi) in table.items()))
    for kind, (total, low, _) in table.items():
        assert low >= 0.7, f"{name}: a {kind} document is counted at {low:.2f} of its tokens"
        if kind != "repeated":
            assert 0.7 <= total <= 1.3, f"{name}: {kind} totals {total:.2f} of its tokens"


def test_within_30_percent_of_the_tiny_models_tokenizer(estimate: list[int]) -> None:
    tok = tiny_model.train_tokenizer(token_corpus.training_texts())
    assert tok.get_vocab_size() == tiny_model.VOCAB
    _check("tiny model", estimate, [len(e.ids) for e in tok.encode_batch(TEXTS)])


@pytest.mark.skipif(not PYTHON.exists(), reason=f"needs the vLLM virtualenv (mistral_common) in {VENV}")
def test_within_30_percent_of_the_tokenizers_mistral_common_ships(estimate: list[int]) -> None:
    for name, counts in token_corpus.packaged_counts(PYTHON, TEXTS).items():
        _check(name, estimate, counts)


def test_the_corpus_has_every_kind_and_real_chinese() -> None:
    assert set(KINDS) == set(token_corpus.KINDS)
    chinese = "".join(t for k, t in DOCS if k == "chinese")
    han = sum("\u4e00" <= ch <= "\u9fff" for ch in chinese)
    assert han > 0.8 * len(chinese) and len(set(chinese)) > 1000  # thousands of distinct characters
