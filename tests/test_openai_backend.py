"""The ``openai`` backend against a scripted OpenAI-compatible upstream: forwarding, error
mapping, mid-stream failures and cancellation reaching the upstream.

The upstream here is a small aiohttp server written for these tests, so it can misbehave
on purpose; the gateway is a real ``shuniu serve`` process and the client the ``openai`` SDK.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from aiohttp import web

from tests.conftest import wait_until
from tests.threaded_app import ThreadedApp


class ScriptedUpstream(ThreadedApp):
    """An OpenAI-style server whose behaviour each test picks through the prompt text."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.aborted = 0
        self.finished = 0

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": "up-model", "object": "model", "max_model_len": 4096}]}
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.headers.append(dict(request.headers))
        script = body["messages"][-1]["content"]
        if script == "bad-request":
            return web.json_response(
                {
                    "error": {
                        "message": "prompt too long for upstream",
                        "type": "BadRequestError",
                        "param": "messages",
                        "code": 400,
                    }
                },
                status=400,
            )
        if script == "crash":
            return web.Response(status=500, text="engine exploded")
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": "x",
                    "object": "chat.completion",
                    "created": 1,
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": "fine",
                                "reasoning_content": "because",
                            },
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                }
            )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        if script.startswith("compact"):
            await self.compact(resp, body["model"], with_usage=script == "compact usage")
            return resp

        def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
            chunk = {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return b"data: " + json.dumps(chunk).encode() + b"\n\n"

        count = 500 if script == "slow" else 3
        try:
            await resp.write(event({"role": "assistant", "content": ""}))
            for i in range(count):
                await resp.write(event({"content": f"w{i} "}))
                if script == "break" and i == 1:
                    request.transport.close()  # type: ignore[union-attr]
                    return resp
                if script == "slow":
                    await asyncio.sleep(0.02)
                if script == "nodone" and i == 1:
                    return resp  # a clean end of the body, without [DONE]
            await resp.write(event({}, "stop"))
            usage = {
                "id": "x",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": body["model"],
                "choices": [],
                "usage": {"prompt_tokens": 2, "completion_tokens": count, "total_tokens": 2 + count},
            }
            await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
            self.finished += 1
        except (ConnectionResetError, ConnectionError):
            self.aborted += 1
        return resp

    async def compact(self, resp: web.StreamResponse, model: str, with_usage: bool) -> None:
        """Compact JSON, as vLLM, SGLang and OpenAI write it, with logprobs on every token
        (as vLLM adds them when asked); usage only ``with_usage``."""
        head = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 7, "model": model}

        async def send(choices: list[dict[str, Any]], **rest: Any) -> None:
            event = json.dumps({**head, "choices": choices, **rest}, separators=(",", ":"))
            await resp.write(b"data: " + event.encode() + b"\n\n")

        await send([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        for word in ("Once ", "upon ", 'a "time"'):
            logprobs = {"content": [{"token": word, "logprob": -0.5, "bytes": None, "top_logprobs": []}]}
            await send(
                [{"index": 0, "delta": {"content": word}, "logprobs": logprobs, "finish_reason": None}]
            )
        await send([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}])
        if with_usage:
            await send([], usage={"prompt_tokens": 4, "completion_tokens": 30, "total_tokens": 34})
        await resp.write(b"data: [DONE]\n\n")
        self.finished += 1


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    up = ScriptedUpstream().start()
    yield up
    up.stop()


def _deploy(port: int) -> str:
    return f"""
    models:
      chat:
        health: {{interval_s: 0.1}}
        endpoints:
          - kind: openai
            options:
              base_url: http://127.0.0.1:{port}/v1
              model: up-model
              api_key: sk-upstream-secret
              headers: {{x-team: gateway}}
    """


def _msg(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_forwarding_rewrites_model_and_passes_unknown_fields(
    gateway_factory, upstream: ScriptedUpstream
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deploy(upstream.port))
    client = openai.OpenAI(base_url=gw.base_url, api_key="client-key", max_retries=0)
    resp = client.chat.completions.create(
        model="chat", messages=_msg("hello"), extra_body={"engine_knob": 7, "top_k": 3}
    )
    assert resp.choices[0].message.content == "fine"
    assert resp.choices[0].message.model_extra == {"reasoning_content": "because"}
    assert resp.model == "chat" and resp.usage is not None and resp.usage.total_tokens == 4
    sent = upstream.bodies[-1]
    assert sent["model"] == "up-model" and sent["engine_knob"] == 7 and sent["top_k"] == 3
    headers = upstream.headers[-1]
    assert headers["Authorization"] == "Bearer sk-upstream-secret"
    assert headers["x-team"] == "gateway"
    # A stream always asks the upstream for usage (for accounting) but the client, who did
    # not ask, gets no usage chunk.
    chunks = list(client.chat.completions.create(model="chat", messages=_msg("hello"), stream=True))
    assert upstream.bodies[-1]["stream_options"] == {"include_usage": True}
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "w0 w1 w2 "
    assert all(c.usage is None and c.choices for c in chunks)
    # max_model_len came from the upstream's /v1/models.
    assert [m.model_extra["max_model_len"] for m in client.models.list().data] == [4096]  # type: ignore[index]


def test_upstream_errors_are_mapped(gateway_factory, upstream: ScriptedUpstream) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deploy(upstream.port))
    client = openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="chat", messages=_msg("bad-request"))
    assert bad.value.body["message"] == "prompt too long for upstream"  # type: ignore[index]
    assert bad.value.body["param"] == "messages"  # type: ignore[index]
    with pytest.raises(openai.APIStatusError) as crash:
        client.chat.completions.create(model="chat", messages=_msg("crash"))
    assert crash.value.status_code == 502
    assert crash.value.body["code"] == "upstream_error"  # type: ignore[index]
    assert "sk-upstream-secret" not in json.dumps(crash.value.body)
    with pytest.raises(openai.APIStatusError) as crash_stream:
        client.chat.completions.create(model="chat", messages=_msg("crash"), stream=True)
    assert crash_stream.value.status_code == 502


def test_stream_broken_after_first_byte_ends_with_error_event(
    gateway_factory, upstream: ScriptedUpstream
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deploy(upstream.port))
    body = {"model": "chat", "messages": _msg("break"), "stream": True}
    resp = httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30)
    assert resp.status_code == 200
    events = [e for e in resp.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2][6:])["error"]
    assert error["code"] == "upstream_error" and "broke off the stream" in error["message"]
    contents = [json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events[:-2]]
    assert contents == ["", "w0 ", "w1 "]


def test_client_disconnect_aborts_the_upstream_request(gateway_factory, upstream: ScriptedUpstream) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deploy(upstream.port))
    body = {"model": "chat", "messages": _msg("slow"), "stream": True}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{gw.base_url}/chat/completions", json=body) as resp:
            lines = resp.iter_lines()
            got = [line for _, line in zip(range(6), lines, strict=False)]
            assert any("w1" in line for line in got)
    wait_until(lambda: upstream.aborted == 1, timeout=10)
    # The upstream saw the connection drop before it had sent its 500 events.
    assert upstream.finished == 0


def test_unreachable_upstream_is_502_before_health_notices(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    gw = gateway_factory(
        f"""
        models:
          chat:
            health: {{interval_s: 60, unhealthy_after: 3}}
            endpoints: [{{kind: openai, options: {{base_url: "http://127.0.0.1:{dead}/v1"}}}}]
        """
    )
    resp = httpx.post(f"{gw.base_url}/chat/completions", json={"model": "chat", "messages": _msg("x")})
    assert resp.status_code == 502
    assert resp.json()["error"]["code"] == "upstream_error"
    assert "Cannot reach" in resp.json()["error"]["message"]


def test_a_stream_that_ends_without_done_is_an_error_not_a_short_answer(
    gateway_factory, upstream: ScriptedUpstream
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deploy(upstream.port))
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(model="chat", messages=_msg("nodone"), stream=True)
    with pytest.raises(openai.APIError, match="without \\[DONE\\]"):
        list(stream)


def test_ordinary_events_reach_the_client_as_the_engine_wrote_them(
    gateway_factory, upstream: ScriptedUpstream
) -> None:  # type: ignore[no-untyped-def]
    # backends/http/passthrough.py: text events are not decoded, so what the engine adds
    # (streamed logprobs) comes through, under the gateway's id and model.
    gw = gateway_factory(_deploy(upstream.port))
    client = openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="chat", messages=_msg("compact usage"), stream=True, stream_options={"include_usage": True}
        )
    )
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(texts) == 'Once upon a "time"'
    tokens = [c.choices[0].logprobs.content[0].token for c in chunks if c.choices and c.choices[0].logprobs]
    assert tokens == ["Once ", "upon ", 'a "time"']
    assert {c.model for c in chunks} == {"chat"} and len({c.id for c in chunks}) == 1
    assert "chatcmpl-up" not in {c.id for c in chunks}
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 30
    assert chunks[-2].choices[0].finish_reason == "stop"


def test_forwarded_events_are_counted_when_the_engine_reports_no_usage(
    gateway_factory, upstream: ScriptedUpstream
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deploy(upstream.port))
    body = {
        "model": "chat",
        "messages": _msg("compact"),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    resp = httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30)
    events = [json.loads(e[6:]) for e in resp.text.split("\n\n") if e and e != "data: [DONE]"]
    assert all("usage" in e for e in events)  # null on every chunk, as OpenAI writes it
    assert events[-1]["usage"]["completion_tokens"] == 3
    # Without include_usage no event carries a usage member.
    del body["stream_options"]
    resp = httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=30)
    assert '"usage"' not in resp.text and resp.text.count('"logprobs":{') == 3
