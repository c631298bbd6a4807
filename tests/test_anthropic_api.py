"""Anthropic's Messages API (``/v1/messages``) on the chat pipeline, driven by the official
``anthropic`` SDK: plain and streamed answers from the simulator, tool use through an
OpenAI-compatible upstream written here (so the answers carry tool calls), errors in
Anthropic's shape, and the ``x-api-key`` header the SDK authenticates with."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shuniu.core.api.anthropic import to_chat_body
from shuniu.core.errors import GatewayError
from tests.conftest import GatewayProcess, start_gateway
from tests.tool_upstream import ToolCallingUpstream

anthropic = pytest.importorskip("anthropic", reason="needs the anthropic SDK (the test extra)")


def _client(url: str, key: str = "unused") -> Any:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=30)


# --------------------------------------------------------------------------- the simulator


def test_a_message_and_its_usage(gateway: GatewayProcess) -> None:
    client = _client(gateway.url)
    msg = client.messages.create(
        model="tiny",
        max_tokens=7,
        system="be brief",
        messages=[{"role": "user", "content": "Say something"}],
    )
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "tiny"
    assert msg.id.startswith("msg_")
    (block,) = msg.content
    assert block.type == "text" and block.text
    assert msg.stop_reason in ("end_turn", "max_tokens")
    # The simulator reports the gateway's count: two messages of three and four pieces
    # ("system", ":", "be", "brief", line break; "user", ":", "Say", "something", line
    # break), 2 template markers each and 3 for the reply: 5 + 5 + 4 + 3.
    assert msg.usage.input_tokens == 17
    assert msg.usage.output_tokens == len(block.text.split()) <= 7


def test_a_streamed_message_follows_anthropics_event_order(gateway: GatewayProcess) -> None:
    client = _client(gateway.url)
    with client.messages.stream(
        model="tiny",
        max_tokens=12,
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"ignore_eos": True},
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 12

    body = {"model": "tiny", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    with httpx.stream("POST", f"{gateway.url}/v1/messages", json=body, timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    names = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    datas = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]
    assert [d["type"] for d in datas] == names  # every event's name is its data's type
    assert names[0] == "message_start" and names[1] == "content_block_start"
    assert set(names[2:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert datas[0]["message"]["usage"]["input_tokens"] == 9  # "user", ":", "x", line break, 2 + 3
    assert datas[-2]["usage"]["output_tokens"] == len(names) - 5


def test_errors_come_in_anthropics_shape(gateway: GatewayProcess) -> None:
    client = _client(gateway.url)
    with pytest.raises(anthropic.BadRequestError) as bad:  # the engine-side limit, through the SDK
        client.messages.create(
            model="tiny",
            max_tokens=5,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"temperature": 3},
        )
    assert bad.value.body["type"] == "error"
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "temperature" in bad.value.body["error"]["message"]
    r = httpx.post(
        f"{gateway.url}/v1/messages", json={"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("max_tokens: Field required")
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert missing.value.body["error"]["type"] == "not_found_error"
    r = httpx.post(f"{gateway.url}/v1/messages", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "error"
    r = httpx.get(f"{gateway.url}/v1/messages", timeout=10)
    assert r.status_code == 405 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.post(
        f"{gateway.url}/v1/messages",
        json={"model": "tiny", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
        timeout=10,
    )
    assert r.status_code == 400 and "messages.0.role" in r.json()["error"]["message"]


def test_the_sdk_authenticates_with_x_api_key(tmp_path: Path) -> None:
    key = "sk-anthropic-client-0123456789"
    config = f"""
    auth:
      authenticators:
        - kind: api_keys
          options:
            keys: [{{id: k1, hash: "sha256:{hashlib.sha256(key.encode()).hexdigest()}", tenant: t1}}]
    models:
      tiny:
        endpoints: [{{kind: sim, options: {{ttft_ms: 0, tokens_per_s: 0}}}}]
    """
    gw = start_gateway(config, tmp_path)
    try:
        ok = _client(gw.url, key).messages.create(
            model="tiny", max_tokens=3, messages=[{"role": "user", "content": "x"}]
        )
        assert ok.content
        with pytest.raises(anthropic.AuthenticationError) as denied:
            _client(gw.url, "sk-wrong-key-0000000000").messages.create(
                model="tiny", max_tokens=3, messages=[{"role": "user", "content": "x"}]
            )
        assert denied.value.body["error"]["type"] == "authentication_error"
    finally:
        gw.stop()


# --------------------------------------------------------------------------- translation


def test_a_conversation_with_tools_becomes_an_openai_chat_body() -> None:
    chat = to_chat_body(
        {
            "model": "m",
            "max_tokens": 100,
            "system": [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Use tools."}],
            "stop_sequences": ["END"],
            "metadata": {"user_id": "u-1"},
            "tools": [{"name": "weather", "description": "Weather now", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "weather"},
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Weather in Paris?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_1",
                            "content": [{"type": "text", "text": "18C"}],
                        },
                        {"type": "text", "text": "And tomorrow?"},
                    ],
                },
            ],
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "You are terse.\nUse tools."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather in Paris?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "weather", "description": "Weather now", "parameters": {"type": "object"}},
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}
    assert chat["stop"] == ["END"] and chat["user"] == "u-1" and chat["max_tokens"] == 100


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_tokens": 5, "messages": []}, "model"),
        ({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 5, "messages": [{"role": "user"}]}, "messages.0.content"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]},
            "messages.0.content.0.type",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "temperature": 2},
            "temperature",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "t"}],
            },
            "tools.0.input_schema",
        ),
    ],
)
def test_a_bad_field_is_named(body: dict[str, Any], field: str) -> None:
    with pytest.raises(GatewayError) as err:
        to_chat_body(body)
    assert err.value.status == 400 and err.value.message.startswith(f"{field}:")


# --------------------------------------------------------------------------- tool use


@pytest.fixture(scope="module")
def tool_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, ToolCallingUpstream]]:
    upstream = ToolCallingUpstream(
        "weather", '{"city": "Paris"}', call_id="call_7", text="Let me check.", usage=(11, 6)
    ).start()
    config = f"""
    models:
      claude-ish:
        endpoints:
          - kind: openai
            options: {{base_url: "http://127.0.0.1:{upstream.port}/v1", model: up}}
    """
    gw = start_gateway(config, tmp_path_factory.mktemp("tools"))
    yield gw.url, upstream
    gw.stop()
    upstream.stop()


TOOLS = [
    {
        "name": "weather",
        "description": "Weather now",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def test_tool_use_whole(tool_gateway: tuple[str, ToolCallingUpstream]) -> None:
    url, upstream = tool_gateway
    msg = _client(url).messages.create(
        model="claude-ish",
        max_tokens=50,
        tools=TOOLS,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    assert [b.type for b in msg.content] == ["text", "tool_use"]
    tool = msg.content[1]
    assert tool.id == "call_7" and tool.name == "weather" and tool.input == {"city": "Paris"}
    assert msg.stop_reason == "tool_use"
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (11, 6)  # the engine's usage
    sent = upstream.bodies[-1]
    assert sent["model"] == "up" and sent["tools"][0]["function"]["name"] == "weather"


def test_tool_use_streamed(tool_gateway: tuple[str, ToolCallingUpstream]) -> None:
    url, _ = tool_gateway
    with _client(url).messages.stream(
        model="claude-ish", max_tokens=50, tools=TOOLS, messages=[{"role": "user", "content": "Weather?"}]
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[0].text == "Let me check."
    assert final.content[1].input == {"city": "Paris"}  # the SDK joined the input_json_delta pieces
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 6


def test_a_cached_answer_is_replayed_as_a_message(tmp_path: Path) -> None:
    config = """
    cache: {store: memory}
    models:
      tiny:
        endpoints: [{kind: sim, options: {ttft_ms: 0, tokens_per_s: 0}}]
    """
    gw = start_gateway(config, tmp_path)
    try:
        body = {
            "model": "tiny",
            "max_tokens": 6,
            "temperature": 0,
            "messages": [{"role": "user", "content": "x"}],
        }
        first = httpx.post(f"{gw.url}/v1/messages", json=body, timeout=30)
        again = httpx.post(f"{gw.url}/v1/messages", json=body, timeout=30)
        assert first.headers["x-shuniu-cache"] == "miss" and again.headers["x-shuniu-cache"] == "hit"
        assert again.json()["type"] == "message"
        assert again.json()["content"] == first.json()["content"]
        with httpx.stream("POST", f"{gw.url}/v1/messages", json={**body, "stream": True}, timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("event: ")]
        assert r.headers["x-shuniu-cache"] == "hit"
        assert events[0] == "event: message_start" and events[-1] == "event: message_stop"
    finally:
        gw.stop()


def test_count_tokens_counts_as_the_gateway_does(gateway: GatewayProcess) -> None:
    client = _client(gateway.url)
    counted = client.messages.count_tokens(
        model="tiny", system="be brief", messages=[{"role": "user", "content": "Say something"}]
    )
    assert counted.input_tokens == 17  # the same count as the message's usage above
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.count_tokens(model="nope", messages=[{"role": "user", "content": "x"}])
    assert missing.value.body["error"]["type"] == "not_found_error"
    r = httpx.get(f"{gateway.url}/v1/messages/count_tokens", timeout=10)
    assert r.status_code == 405 and r.json()["type"] == "error"
