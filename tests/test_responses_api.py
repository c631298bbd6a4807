"""OpenAI's Responses API (``/v1/responses``, stateless) on the chat pipeline, driven by the
``openai`` SDK's ``responses.create`` and ``responses.stream``: answers from the simulator,
function calls through an OpenAI-compatible upstream written here, and the refusals of
what needs stored responses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from shuniu.core.api.responses import to_chat_body
from shuniu.core.errors import GatewayError
from tests.conftest import GatewayProcess, start_gateway
from tests.tool_upstream import ToolCallingUpstream


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=30)


def test_a_response_from_the_simulator(gateway: GatewayProcess) -> None:
    resp = _client(gateway.url).responses.create(
        model="tiny", instructions="be brief", input="Say something", max_output_tokens=7, store=False
    )
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.model == "tiny"
    assert resp.status in ("completed", "incomplete")
    (item,) = resp.output
    assert item.type == "message" and item.role == "assistant"
    assert resp.output_text == item.content[0].text and resp.output_text
    assert resp.instructions == "be brief" and resp.max_output_tokens == 7 and resp.store is False
    # "system", ":", "be", "brief", line break; "user", ":", "Say", "something", line break;
    # 2 template markers per message, 3 for the reply
    assert resp.usage is not None and resp.usage.input_tokens == 17
    assert resp.usage.output_tokens == len(resp.output_text.split()) <= 7
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens


def test_a_response_cut_at_max_output_tokens_is_incomplete(gateway: GatewayProcess) -> None:
    resp = _client(gateway.url).responses.create(
        model="tiny", input="hi", max_output_tokens=4, extra_body={"ignore_eos": True}
    )
    assert resp.status == "incomplete" and resp.incomplete_details is not None
    assert resp.incomplete_details.reason == "max_output_tokens" and resp.usage.output_tokens == 4  # type: ignore[union-attr]


def test_a_streamed_response_and_its_events(gateway: GatewayProcess) -> None:
    client = _client(gateway.url)
    with client.responses.stream(model="tiny", input="hi", max_output_tokens=500) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas) and deltas
    assert final.status == "completed" and final.usage is not None
    assert final.usage.output_tokens == len(deltas)  # the simulator streams one token per delta

    # Cut at the limit, a stream ends with response.incomplete (the SDK's stream helper
    # only hands out a final response.completed, so read the events).
    cut = list(
        client.responses.create(
            model="tiny", input="hi", max_output_tokens=9, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert cut[-1].type == "response.incomplete"
    assert cut[-1].response.usage is not None and cut[-1].response.usage.output_tokens == 9  # type: ignore[union-attr]
    assert len([e for e in cut if e.type == "response.output_text.delta"]) == 9

    events = list(client.responses.create(model="tiny", input="x", max_output_tokens=3, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        kinds[-1],
    ] and kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_what_needs_storage_is_refused(gateway: GatewayProcess) -> None:
    client = _client(gateway.url)
    for extra, param in (
        ({"store": True}, "store"),
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"background": True}, "background"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="tiny", input="x", **extra)  # type: ignore[arg-type]
        assert err.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", input="x", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    assert "only function tools" in err.value.message
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="x")
    r = httpx.post(f"{gateway.url}/v1/responses", json={"model": "tiny"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_required_parameter"


def test_input_items_become_chat_messages() -> None:
    chat = to_chat_body(
        {
            "model": "m",
            "instructions": "Use tools.",
            "max_output_tokens": 50,
            "text": {
                "format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}
            },
            "reasoning": {"effort": "low"},
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "weather"},
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Paris?"},
                        {"type": "input_image", "image_url": "data:image/png;base64,AA"},
                    ],
                },
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "weather",
                    "arguments": '{"city":"Paris"}',
                },
                {"type": "function_call", "call_id": "c2", "name": "weather", "arguments": '{"city":"Lyon"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "18C"},
                {"type": "function_call_output", "call_id": "c2", "output": {"temp": 20}},
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Both mild."}],
                },
            ],
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "Use tools."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Paris?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
            ],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"Lyon"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"temp":20}'},
        {"role": "assistant", "content": [{"type": "text", "text": "Both mild."}]},
    ]
    assert chat["max_tokens"] == 50 and chat["reasoning_effort"] == "low"
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
    }
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "weather"}}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_audio"}]}]},
            "input[0].content[0].type",
        ),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ],
)
def test_a_bad_parameter_is_named(body: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as err:
        to_chat_body(body)
    assert err.value.status == 400 and err.value.param == param


@pytest.fixture(scope="module")
def calling_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    upstream = ToolCallingUpstream(
        "weather", '{"city": "Oslo"}', call_id="call_9", text=None, usage=(12, 5)
    ).start()
    config = f"""
    models:
      caller:
        endpoints:
          - kind: openai
            options: {{base_url: "{upstream.url}/v1"}}
    """
    gw = start_gateway(config, tmp_path_factory.mktemp("responses-tools"))
    yield gw.url
    gw.stop()
    upstream.stop()


TOOLS: Any = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]


def test_function_calls_whole_and_streamed(calling_gateway: str) -> None:
    client = _client(calling_gateway)
    resp = client.responses.create(model="caller", input="Weather in Oslo?", tools=TOOLS)
    (call,) = resp.output
    assert call.type == "function_call" and call.call_id == "call_9" and call.name == "weather"
    assert json.loads(call.arguments) == {"city": "Oslo"} and resp.status == "completed"
    assert resp.usage is not None and (resp.usage.input_tokens, resp.usage.output_tokens) == (12, 5)

    with client.responses.stream(model="caller", input="Weather in Oslo?", tools=TOOLS) as stream:
        pieces = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    (streamed,) = final.output
    assert streamed.type == "function_call" and streamed.arguments == "".join(pieces) == '{"city": "Oslo"}'
    assert final.usage is not None and final.usage.output_tokens == 5
