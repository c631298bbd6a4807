"""The fallback token estimate never undercounts badly: Chinese, Japanese and Korean count
per character and unbroken runs by their length (both used to count as one or a few
tokens, which let such prompts past every token limit)."""

from __future__ import annotations

import json

import pytest

from shuniu.core.tokens import RUN_CHARS_PER_TOKEN, count_tokens, split_tokens


@pytest.mark.parametrize(
    ("text", "at_least"),
    [
        ("你好世界今天天气很好\uff0c我们去公园散步吧", 19),  # 18 Han characters and a full-width comma
        ("こんにちは世界", 7),
        ("안녕하세요", 5),
        ("a" * 100_000, 100_000),  # one letter repeated: one token each
        ("0123456789abcdef" * 64, int(1024 / RUN_CHARS_PER_TOKEN)),  # a hex string
        ("x1" * 5000, 10_000 // 2),  # alternating letters and digits
        ("🙂" * 50, 100),  # an emoji is two
    ],
)
def test_no_language_or_unbroken_run_undercounts(text: str, at_least: int) -> None:
    assert count_tokens(text) >= at_least


def test_english_words_count_by_word_and_code_by_line() -> None:
    assert count_tokens("Hello, world! How are you today?") == 9
    assert count_tokens("internationalization") == 3  # 20 letters: pieces of 9
    # each line break with its indentation is one token
    assert count_tokens("def f():\n    return 1\n") == count_tokens("def f(): return 1") + 2


def test_the_count_is_the_number_of_pieces() -> None:
    for text in ("mixed 中文 and English, 123", "x" * 37, "", "🙂 ok", "a_b-c" * 50):
        assert count_tokens(text) == len(split_tokens(text))
    assert "".join(split_tokens("x" * 37)) == "x" * 37


def test_ascii_text_is_cut_the_same_by_the_fast_pattern() -> None:
    # ASCII text is cut by a pattern compiled with re.ASCII (twice as fast) that takes a
    # short word with its space in one match; on ASCII input it must find exactly the pieces
    # the Unicode pattern finds.
    import random
    import string

    from shuniu.core import tokens
    from tests.token_corpus import documents

    rng = random.Random(11)
    texts = [doc for _, doc in documents(3, per_kind=10) if doc.isascii()]
    texts += ["".join(rng.choice(string.printable) for _ in range(rng.randrange(0, 400))) for _ in range(300)]
    words = [
        "a",
        "word",
        "nine9",
        "ninechars",
        "tencharsss",
        "internationalization",
        "x_y",
        "end.",
        "(ok)",
        "\n  ",
    ]
    texts += [" ".join(rng.choice(words) for _ in range(rng.randrange(1, 60))) for _ in range(100)]
    texts += ["x_1" * 20, "ab" * 30 + "12", "\n\t  \n", "snake_case_identifier_name", "", "ab  cd ", "ab\tcd"]
    assert len(texts) > 420
    for text in texts:
        assert tokens._TOKEN_ASCII.findall(text) == tokens._TOKEN.findall(text), repr(text[:80])


def test_a_deferred_estimate_is_the_estimate_parsing_makes() -> None:
    # The request path parses with estimate=False and counts once the model is known.
    from shuniu.core.api.anthropic import parse_messages
    from shuniu.core.api.openai import UNCOUNTED, estimate_prompt, parse_request
    from shuniu.core.api.responses import parse_responses

    chat = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "你好 world, 42!"},
        ],
    }
    cases = [
        (lambda e: parse_request(json.dumps(chat).encode(), "chat", "r", 0.0, e)),
        (
            lambda e: parse_request(
                b'{"model": "m", "prompt": "Hello there, friend."}', "completions", "r", 0.0, e
            )
        ),
        (
            lambda e: parse_messages(
                json.dumps(
                    {**chat, "max_tokens": 5, "messages": chat["messages"][1:], "system": "be brief"}
                ).encode(),
                "r",
                0.0,
                e,
            )
        ),
        (
            lambda e: parse_responses(
                b'{"model": "m", "input": "hi there", "instructions": "be brief"}', "r", 0.0, e
            )
        ),
    ]
    for parse in cases:
        counted, deferred = parse(True), parse(False)
        assert deferred.prompt_tokens == UNCOUNTED and counted.prompt_tokens > 0
        assert estimate_prompt(deferred) == counted.prompt_tokens
    ids = parse_request(b'{"model": "m", "prompt": [1, 2, 3]}', "completions", "r", 0.0, False)
    assert ids.prompt_tokens == 3  # token ids are counted exactly either way
