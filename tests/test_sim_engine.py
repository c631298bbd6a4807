"""The simulated engine: exact usage, determinism, stop strings, limits, aborts."""

from __future__ import annotations

import asyncio

import pytest

from shuniu.backends.sim.engine import SimEngine
from shuniu.backends.sim.options import SimOptions
from shuniu.core.openai_api import parse_request
from shuniu.core.tokens import count_tokens


def _req(content: str = "hello there", **fields: object):  # type: ignore[no-untyped-def]
    import json

    body = {"model": "m", "messages": [{"role": "user", "content": content}], **fields}
    return parse_request(json.dumps(body).encode(), "chat", "r1", 0.0)


def _engine(**opts: object) -> SimEngine:
    return SimEngine(SimOptions(**{"ttft_ms": 0, "tokens_per_s": 0, **opts}))  # type: ignore[arg-type]


async def _run(engine: SimEngine, req) -> tuple[str, list, object]:  # type: ignore[no-untyped-def]
    chunks = [c async for c in engine.generate(req)]
    return "".join(c.text for c in chunks), chunks, chunks[-1].usage


async def test_usage_is_exact_and_deterministic() -> None:
    engine = _engine()
    text, chunks, usage = await _run(engine, _req(seed=5))
    again, _, _ = await _run(engine, _req(seed=5))
    other, _, other_usage = await _run(engine, _req(seed=6))
    assert text == again and text != other
    assert usage.completion_tokens == count_tokens(text) == sum(c.tokens for c in chunks)
    assert usage.prompt_tokens == count_tokens("user: hello there\n")
    assert 16 <= usage.completion_tokens <= 256
    assert chunks[-1].finish_reason == "stop"
    assert engine.generated_tokens == 2 * usage.completion_tokens + other_usage.completion_tokens
    assert (engine.requests, engine.aborted, engine.running) == (3, 0, 0)


async def test_max_tokens_and_ignore_eos() -> None:
    engine = _engine(output_tokens_min=50, output_tokens_max=50)
    _, chunks, usage = await _run(engine, _req(max_tokens=7))
    assert usage.completion_tokens == 7 and chunks[-1].finish_reason == "length"
    _, chunks, usage = await _run(engine, _req(max_tokens=80))
    assert usage.completion_tokens == 50 and chunks[-1].finish_reason == "stop"
    _, chunks, usage = await _run(engine, _req(max_tokens=80, ignore_eos=True))
    assert usage.completion_tokens == 80 and chunks[-1].finish_reason == "length"


async def test_context_window_caps_output() -> None:
    engine = _engine(max_model_len=20, output_tokens_min=100, output_tokens_max=100)
    req = _req("one two three")  # "user: one two three\n" = 5 tokens
    _, _, usage = await _run(engine, req)
    assert usage.prompt_tokens == 5 and usage.completion_tokens == 15


@pytest.mark.parametrize("split", [1, 2, 3])
async def test_stop_strings_are_cut_and_never_leak(split: int) -> None:
    engine = _engine()
    full, _, _ = await _run(engine, _req(seed=9, max_tokens=40, ignore_eos=True))
    words = full.split(" ")
    # A stop string spanning word boundaries: it must not leak into any streamed chunk.
    stop = " " + " ".join(words[10 : 10 + split])
    text, chunks, usage = await _run(engine, _req(seed=9, max_tokens=40, ignore_eos=True, stop=stop))
    assert text == full.split(stop)[0]
    assert chunks[-1].finish_reason == "stop"
    assert all(stop not in c.text for c in chunks)
    assert usage.completion_tokens == 10 + split


async def test_pacing_and_ttft() -> None:
    engine = SimEngine(SimOptions(ttft_ms=50, tokens_per_s=100, prefill_tokens_per_s=0))
    loop = asyncio.get_running_loop()
    start = loop.time()
    first_at = None
    async for _chunk in engine.generate(_req(max_tokens=11, ignore_eos=True)):
        if first_at is None:
            first_at = loop.time()
    end = loop.time()
    assert first_at is not None
    assert first_at - start >= 0.05
    assert end - first_at >= 0.1  # 10 more tokens at 100 tokens/s


async def test_abort_frees_the_slot_and_counts() -> None:
    engine = SimEngine(SimOptions(ttft_ms=0, tokens_per_s=1000, max_num_seqs=1))
    gen = engine.generate(_req(max_tokens=1000, ignore_eos=True))
    await gen.__anext__()
    assert engine.running == 1
    waiting = asyncio.ensure_future(_run(engine, _req(max_tokens=3)))
    await asyncio.sleep(0)
    assert engine.waiting == 1
    await gen.aclose()
    assert engine.aborted == 1
    _, _, usage = await waiting
    assert usage.completion_tokens == 3
    assert engine.running == 0 and engine.waiting == 0
    assert engine.generated_tokens < 1000
