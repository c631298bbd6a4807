"""The HTTP engine layer (``backends/http``): its SSE reader, and every HTTP backend's stream
passing an event far larger than aiohttp's own line limit (128 KiB), which used to fail the
request and count against a healthy endpoint.

Each backend streams from a small aiohttp server written for these tests, in the test's own
event loop; the last test puts a real ``shuniu serve`` between that server and the ``openai``
SDK.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any
from unittest import mock

import aiohttp
import httpx
import openai
import pytest
from aiohttp import web

from shuniu.backends.http import SseLines, data_payload
from shuniu.backends.http.sse import OversizedEvent
from shuniu.core.contracts import Backend, EndpointSpec
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.types import Chunk, InferenceRequest

BIG = "x" * (1024 * 1024)  # 1 MiB of text in one event


def _reader(body: bytes, block: int) -> aiohttp.StreamReader:
    reader = aiohttp.StreamReader(mock.Mock(_reading_paused=False), 2**16, loop=asyncio.get_running_loop())
    for i in range(0, len(body), block):
        reader.feed_data(body[i : i + block])
    reader.feed_eof()
    return reader


@pytest.mark.parametrize("block", [1, 7, 4096, 1 << 20])
async def test_lines_come_whole_however_the_body_is_cut(block: int) -> None:
    big = b"data: " + BIG[:200_000].encode()
    body = b"data: {}\r\n\n: keep-alive\n" + big + b"\n\nevent: x\ndata:[DONE]"
    lines = [line async for line in SseLines(_reader(body, block))]
    assert lines == [b"data: {}", b"", b": keep-alive", big, b"", b"event: x", b"data:[DONE]"]
    assert [data_payload(x) for x in lines if data_payload(x) is not None] == [b"{}", big[6:], b"[DONE]"]


async def test_a_line_over_the_limit_fails_the_stream() -> None:
    with pytest.raises(OversizedEvent, match="longer than 1000 bytes"):
        async for _ in SseLines(_reader(b"data: " + b"y" * 5000, 512), limit=1000):
            pass


# -- a 1 MiB event through every HTTP backend -------------------------------------------------


def _sse(events: list[Any], done: bool = True) -> bytes:
    out = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def _chat_events() -> list[Any]:
    return [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": BIG}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
    ]


async def _stream_reply(request: web.Request, body: bytes) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(0, len(body), 65536):  # as an engine writes: many socket writes per event
        await resp.write(body[i : i + 65536])
    await resp.write_eof()
    return resp


def _engine_app() -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body["messages"][-1]["content"] == "malformed":  # a first chunk, then garbage
            first = {"choices": [{"index": 0, "delta": {"content": "ok"}}]}
            return await _stream_reply(request, _sse([first], done=False) + b"data: {not json\n\n")
        if not body.get("stream"):
            message = {"role": "assistant", "content": BIG}
            usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response({"object": "chat.completion", "choices": [choice], "usage": usage})
        return await _stream_reply(request, _sse(_chat_events()))

    async def triton(request: web.Request) -> web.StreamResponse:
        events = [{"text_output": BIG}, {"text_output": "", "finish_reason": "stop"}]
        return await _stream_reply(request, _sse(events, done=False))

    async def tgi_generate(request: web.Request) -> web.StreamResponse:
        events = [
            {"token": {"id": 1, "text": BIG, "special": False}},
            {
                "token": {"id": 2, "text": "", "special": True},
                "generated_text": BIG,
                "details": {"finish_reason": "eos_token", "generated_tokens": 2, "input_length": 3},
            },
        ]
        return await _stream_reply(request, _sse(events, done=False))

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def not_found(request: web.Request) -> web.Response:
        return web.json_response({"error": "not here"}, status=404)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v2/models/ensemble/generate_stream", triton)
    app.router.add_post("/generate_stream", tgi_generate)
    app.router.add_get("/v1/models", models)
    app.router.add_route("*", "/{tail:.*}", not_found)
    return app


@pytest.fixture
async def engine() -> AsyncIterator[str]:
    runner = web.AppRunner(_engine_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


def _backend(kind: str, options: dict[str, Any]) -> Backend:
    reg = load_plugins().registered("backends")[kind]
    assert reg.options is not None
    return reg.factory(EndpointSpec(name=f"{kind}-0", model="m", options=reg.options.model_validate(options)))  # type: ignore[no-any-return]


def _request(api: str) -> InferenceRequest:
    body: dict[str, Any] = {"model": "m", "max_tokens": 4}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    return InferenceRequest(
        id="r",
        api=api,
        model="m",
        body=body,
        prompt="hi",
        prompt_tokens=3,
        max_tokens=4,
        stream=True,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("kind", "options", "api"),
    [
        ("openai", {"base_url": "{url}/v1"}, "chat"),
        ("vllm", {"base_url": "{url}"}, "chat"),
        ("ascend", {"engine": "mindie", "base_url": "{url}"}, "chat"),
        ("trtllm", {"api": "triton", "base_url": "{url}", "triton_inputs": "ensemble"}, "completions"),
        ("trtllm", {"base_url": "{url}", "load_from": "none"}, "chat"),
        ("tgi", {"base_url": "{url}"}, "completions"),
        ("tgi", {"base_url": "{url}"}, "chat"),
    ],
)
async def test_a_one_megabyte_event_passes_every_backend(
    engine: str, kind: str, options: dict[str, Any], api: str
) -> None:
    backend = _backend(
        kind, {k: v.format(url=engine) if isinstance(v, str) else v for k, v in options.items()}
    )
    await backend.start()
    try:
        chunks: list[Chunk] = [c async for c in backend.stream(_request(api))]
    finally:
        await backend.stop()
    assert "".join(c.text for c in chunks) == BIG
    assert any(c.finish_reason is not None for c in chunks)


# -- through a gateway, to the openai SDK --------------------------------------------------------


@pytest.fixture
def threaded_engine() -> Iterator[str]:
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = web.AppRunner(_engine_app())
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        holder["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{holder['port']}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_a_one_megabyte_event_reaches_the_client_through_the_gateway(
    gateway_factory, threaded_engine
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        f"""
        models:
          m:
            health: {{interval_s: 0.05}}
            endpoints:
              - kind: openai
                options: {{base_url: "{threaded_engine}/v1"}}
        """
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=4
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == BIG


def test_an_unreadable_event_is_the_answers_fault_not_the_endpoints(  # type: ignore[no-untyped-def]
    gateway_factory, threaded_engine
) -> None:
    """Outlier detection ejects after one failure here; three malformed streams must leave
    the endpoint in, and the client is told it was the engine's answer."""
    gw = gateway_factory(
        f"""
        models:
          m:
            health: {{interval_s: 0.05}}
            outlier: {{consecutive_failures: 1}}
            endpoints:
              - kind: openai
                replicas: 2
                options: {{base_url: "{threaded_engine}/v1"}}
        """
    )
    for _ in range(3):
        with httpx.stream(
            "POST",
            f"{gw.base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "malformed"}], "stream": True},
            timeout=10,
        ) as resp:
            events = [line for line in resp.iter_lines() if line.startswith("data: ")]
        assert resp.status_code == 200
        error = json.loads(events[-2][6:])["error"]
        assert error["code"] == "upstream_protocol_error" and "malformed event" in error["message"]
        assert events[-1] == "data: [DONE]"
    ready = httpx.get(f"{gw.url}/ready").json()
    assert [e["ejected"] for e in ready["models"]["m"]["endpoints"]] == [False, False]
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert answer.choices[0].message.content == BIG


def test_an_oversized_event_is_reported_as_a_protocol_error() -> None:
    from shuniu.backends.http import stream_broken
    from shuniu.backends.http.sse import OversizedEvent

    err = stream_broken("e0", OversizedEvent("an event line longer than 1000 bytes"))
    assert (err.status, err.code) == (502, "upstream_protocol_error")
    assert "e0 sent an event line longer than 1000 bytes" in err.message
