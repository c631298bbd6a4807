"""The usage details load testers and clients read: the prompt tokens the engine's prefix
cache served (OpenAI's ``prompt_tokens_details.cached_tokens``, Anthropic's
``cache_read_input_tokens``, the Responses API's ``input_tokens_details``), from the
simulator's own prefix cache here (from vLLM's usage in ``tests/test_vllm_real.py``), and
vLLM's ``stream_options.continuous_usage_stats`` (the usage so far on every chunk)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.conftest import GatewayProcess, start_gateway

# 16-token blocks; one replica, so a repeated prompt meets its own cached blocks.
CONFIG = """
models:
  m:
    endpoints:
      - kind: sim
        options: {ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 4, output_tokens_max: 4, block_size: 16}
"""
# 100 distinct two-letter words: one token each by the estimate.
PROMPT = " ".join(a + b for a in "abcdefghij" for b in "klmnopqrst")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    g = start_gateway(CONFIG, tmp_path_factory.mktemp("usage"))
    yield g
    g.stop()


def _client(g: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=g.base_url, api_key="unused", max_retries=0, timeout=30)


def test_a_repeated_prompt_reports_its_cached_tokens(gw: GatewayProcess) -> None:
    client = _client(gw)
    messages = [{"role": "user", "content": PROMPT + " first"}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=4)  # type: ignore[arg-type]
    again = client.chat.completions.create(model="m", messages=messages, max_tokens=4)  # type: ignore[arg-type]
    assert first.usage is not None and again.usage is not None
    assert first.usage.prompt_tokens_details is not None and again.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = again.usage.prompt_tokens_details.cached_tokens
    # every full 16-token block of the prompt but the last (the engine recomputes one token)
    assert cached == (again.usage.prompt_tokens - 1) // 16 * 16 and cached >= 96


def test_continuous_usage_stats_put_the_usage_on_every_chunk(gw: GatewayProcess) -> None:
    chunks = list(
        _client(gw).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        )
    )
    usages = [c.usage for c in chunks]
    assert all(u is not None for u in usages)
    counts = [u.completion_tokens for u in usages if u is not None]
    assert counts[0] == 0 and counts[-1] == 4 and counts == sorted(counts)
    assert {u.prompt_tokens for u in usages if u is not None} == {9}  # "user", ":", "hi", break, 2 + 3

    plain = list(
        _client(gw).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert [c.usage is None for c in plain] == [True] * (len(plain) - 1) + [False]


def test_the_other_apis_report_cached_tokens_their_way(gw: GatewayProcess) -> None:
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": PROMPT + " second"}]}
    httpx.post(f"{gw.url}/v1/messages", json=body, timeout=30)
    usage = httpx.post(f"{gw.url}/v1/messages", json=body, timeout=30).json()["usage"]
    assert usage["cache_read_input_tokens"] >= 96
    total = usage["input_tokens"] + usage["cache_read_input_tokens"]  # Anthropic counts them apart
    # "user", ":", the 100 words, "second", the line break; 2 + 3 chat markers
    assert total == 2 + 100 + 1 + 1 + 5

    request = {"model": "m", "input": PROMPT + " third", "max_output_tokens": 4}
    httpx.post(f"{gw.url}/v1/responses", json=request, timeout=30)
    usage = httpx.post(f"{gw.url}/v1/responses", json=request, timeout=30).json()["usage"]
    assert usage["input_tokens_details"]["cached_tokens"] >= 96
