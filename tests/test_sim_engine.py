"""The ``sim`` backend as the gateway uses it: exact usage, determinism, stop strings,
limits, pacing, aborts."""

from __future__ import annotations

import asyncio
import json

import pytest

from shuniu.backends.sim.backend import SimBackend
from shuniu.backends.sim.options import SimOptions
from shuniu.core.api.openai import parse_request
from shuniu.core.contracts import EndpointSpec


def _req(content: str = "hello there", **fields: object):  # type: ignore[no-untyped-def]
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **fields}
    return parse_request(json.dumps(body).encode(), "chat", "r1", 0.0)


def _backend(**opts: object) -> SimBackend:
    options = SimOptions(**{"ttft_ms": 0, "tokens_per_s": 0, **opts})  # type: ignore[arg-type]
    return SimBackend(EndpointSpec("e", "m", options))


async def _run(backend: SimBackend, req) -> tuple[str, list, object]:  # type: ignore[no-untyped-def]
    chunks = [c async for c in backend.stream(req)]
    return "".join(c.text for c in chunks), chunks, chunks[-1].usage


async def test_usage_is_exact_and_deterministic() -> None:
    backend = _backend()
    text, chunks, usage = await _run(backend, _req(seed=5))
    again, _, _ = await _run(backend, _req(seed=5))
    other, _, other_usage = await _run(backend, _req(seed=6))
    assert text == again and text != other
    # one word per token; the prompt's pieces are "user", ":", "hello", "there", the line
    # break, and 2 + 3 for the chat template's markers
    assert usage.completion_tokens == len(text.split()) == sum(c.tokens for c in chunks)
    assert usage.prompt_tokens == 10
    assert 16 <= usage.completion_tokens <= 256
    assert chunks[-1].finish_reason == "stop"
    core = backend.engine.core
    assert core.generated_tokens == 2 * usage.completion_tokens + other_usage.completion_tokens
    assert (core.requests, core.completed, core.aborted, len(core.running)) == (3, 3, 0, 0)
    await backend.stop()


async def test_max_tokens_and_ignore_eos() -> None:
    backend = _backend(output_tokens_min=50, output_tokens_max=50)
    _, chunks, usage = await _run(backend, _req(max_tokens=7))
    assert usage.completion_tokens == 7 and chunks[-1].finish_reason == "length"
    _, chunks, usage = await _run(backend, _req(max_tokens=80))
    assert usage.completion_tokens == 50 and chunks[-1].finish_reason == "stop"
    _, chunks, usage = await _run(backend, _req(max_tokens=80, ignore_eos=True))
    assert usage.completion_tokens == 80 and chunks[-1].finish_reason == "length"
    await backend.stop()


async def test_context_window_caps_output() -> None:
    backend = _backend(max_model_len=20, output_tokens_min=100, output_tokens_max=100)
    # 11 prompt tokens: "user", ":", "one", "two", "three", the line break, 2 + 3 markers
    _, _, usage = await _run(backend, _req("one two three"))
    assert usage.prompt_tokens == 11 and usage.completion_tokens == 9
    await backend.stop()


@pytest.mark.parametrize("split", [1, 2, 3])
async def test_stop_strings_are_cut_and_never_leak(split: int) -> None:
    backend = _backend()
    full, _, _ = await _run(backend, _req(seed=9, max_tokens=40, ignore_eos=True))
    words = full.split(" ")
    stop = " " + " ".join(words[10 : 10 + split])  # spans word boundaries
    text, chunks, usage = await _run(backend, _req(seed=9, max_tokens=40, ignore_eos=True, stop=stop))
    assert text == full.split(stop)[0]
    assert chunks[-1].finish_reason == "stop"
    assert all(stop not in c.text for c in chunks)
    assert usage.completion_tokens == 10 + split
    core = backend.engine.core
    assert core.aborted == 0 and not core.running  # ended early, not counted as an abort
    await backend.stop()


async def test_pacing_and_ttft() -> None:
    backend = _backend(ttft_ms=50, tokens_per_s=100, prefill_tokens_per_s=0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    first_at = None
    async for _chunk in backend.stream(_req(max_tokens=11, ignore_eos=True)):
        if first_at is None:
            first_at = loop.time()
    end = loop.time()
    assert first_at is not None
    assert first_at - start >= 0.05 + 0.01  # admission delay + one iteration
    assert end - first_at >= 0.1  # 10 more tokens at 100 tokens/s
    await backend.stop()


async def test_abort_frees_the_slot_and_counts() -> None:
    backend = _backend(tokens_per_s=1000, max_num_seqs=1)
    core = backend.engine.core
    gen = backend.stream(_req(max_tokens=1000, ignore_eos=True))
    await gen.__anext__()
    assert len(core.running) == 1
    waiting = asyncio.ensure_future(_run(backend, _req("other", max_tokens=3)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert core.num_waiting == 1
    await gen.aclose()
    assert core.aborted == 1 and not core.running and core.pool.used == 0
    _, _, usage = await waiting
    assert usage.completion_tokens == 3
    assert not core.running and core.num_waiting == 0
    assert core.generated_tokens < 1000
    await backend.stop()
