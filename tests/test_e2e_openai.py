"""End-to-end: a real ``shuniu serve`` process driven by the official ``openai`` SDK."""

from __future__ import annotations

import asyncio

import openai
import pytest


def _client(gw) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)


def test_chat_non_streaming(gateway) -> None:  # type: ignore[no-untyped-def]
    client = _client(gateway)
    resp = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Say something"}], max_tokens=7
    )
    assert resp.object == "chat.completion"
    assert resp.model == "tiny"
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("stop", "length")
    text = choice.message.content or ""
    assert resp.usage is not None
    # The simulator's output is one word per token; the prompt is its five pieces ("user",
    # ":", "Say", "something", the line break) and 2 + 3 for the chat template's markers,
    # counted here by hand, not by the gateway's estimator.
    assert resp.usage.completion_tokens == len(text.split())
    assert 1 <= resp.usage.completion_tokens <= 7
    assert resp.usage.prompt_tokens == 10
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_chat_streaming_with_usage(gateway) -> None:  # type: ignore[no-untyped-def]
    client = _client(gateway)
    stream = client.chat.completions.create(
        model="tiny-alias",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.completion_tokens == 12 == len(text.split())
    assert all(c.usage is None for c in chunks[:-1])
    assert {c.id for c in chunks} == {chunks[0].id}
    assert all(c.model == "tiny-alias" for c in chunks)


def test_streaming_without_usage_has_no_usage_chunk(gateway) -> None:  # type: ignore[no-untyped-def]
    client = _client(gateway)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3, stream=True
        )
    )
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_completions_api(gateway) -> None:  # type: ignore[no-untyped-def]
    client = _client(gateway)
    resp = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, seed=3)
    assert resp.object == "text_completion"
    assert resp.usage is not None and resp.usage.prompt_tokens == 4
    assert resp.usage.completion_tokens == len(resp.choices[0].text.split())
    again = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, seed=3)
    assert again.choices[0].text == resp.choices[0].text  # the simulator is deterministic

    streamed = list(
        client.completions.create(
            model="tiny",
            prompt="Once upon a time",
            max_tokens=5,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == resp.choices[0].text
    assert streamed[-1].usage is not None
    assert streamed[-1].usage.completion_tokens == resp.usage.completion_tokens


def test_content_parts_and_stop(gateway) -> None:  # type: ignore[no-untyped-def]
    client = _client(gateway)
    base = client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "parts "}, {"type": "text", "text": "ok"}]}
        ],
        max_tokens=30,
        seed=11,
        extra_body={"ignore_eos": True},
    )
    words = (base.choices[0].message.content or "").split(" ")
    assert len(words) == 30
    stop = " " + words[5]
    cut = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "parts ok"}],
        max_tokens=30,
        seed=11,
        stop=[stop, "never-appears"],
        extra_body={"ignore_eos": True},
    )
    # Same prompt text once parts are joined, so the same words up to the stop string.
    expected = (base.choices[0].message.content or "").split(stop)[0]
    assert cut.choices[0].message.content == expected
    assert cut.choices[0].finish_reason == "stop"


def test_models_list(gateway) -> None:  # type: ignore[no-untyped-def]
    models = _client(gateway).models.list()
    ids = sorted(m.id for m in models.data)
    assert ids == ["tiny", "tiny-alias"]


def test_sdk_errors(gateway) -> None:  # type: ignore[no-untyped-def]
    client = _client(gateway)
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert nf.value.body["code"] == "model_not_found"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as br:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=5000
        )
    assert br.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[], max_tokens=5)


async def test_async_client_concurrent_streams(gateway) -> None:  # type: ignore[no-untyped-def]
    client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)

    async def one(i: int) -> int:
        stream = await client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": f"request {i}"}],
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
        assert usage is not None
        return usage.completion_tokens

    results = await asyncio.gather(*(one(i) for i in range(20)))
    assert results == [10] * 20
    non_stream = await client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "a"}],
        max_tokens=4,
        extra_body={"ignore_eos": True},
    )
    assert non_stream.usage is not None and non_stream.usage.completion_tokens == 4
    await client.close()
