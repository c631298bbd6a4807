"""Anthropic's Messages API (``POST /v1/messages``), translated onto the chat pipeline.

A Messages request becomes an OpenAI chat body (which every chat engine takes): ``system``
becomes a system message; text and image blocks become content parts; an assistant's
``tool_use`` blocks become ``tool_calls`` and a user's ``tool_result`` blocks ``tool``
messages (placed first, as OpenAI wants them right after the calls); ``tools`` and
``tool_choice`` their OpenAI forms; ``stop_sequences`` ``stop``; ``metadata.user_id``
``user``. The answer goes back the other way: text and ``tool_use`` content blocks, a
``stop_reason`` (``end_turn``, ``max_tokens``, ``tool_use``), ``usage`` in input and output
tokens; a stream as Anthropic's events (``message_start``, ``content_block_start``/
``delta``/``stop``, ``message_delta``, ``message_stop``; ``error`` after the first byte).
Errors on this route are in Anthropic's shape, ``{"type": "error", "error": {...}}``.

Not translated: ``thinking`` (engines' reasoning output is not surfaced as thinking blocks),
documents and citations, prompt-caching ``cache_control`` marks (accepted, ignored).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from shuniu.core.api.openai import StreamTally, decode_body, parse_body, tool_calls_of
from shuniu.core.errors import GatewayError, bad_request
from shuniu.core.types import Chunk, Completion, InferenceRequest, Usage

__all__ = ["MessagesStream", "encode_message", "error_body", "parse_count", "parse_messages", "to_chat_body"]

_encode = msgspec.json.Encoder().encode

_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "content_filter": "refusal",
}
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def _fail(message: str, param: str) -> GatewayError:
    return bad_request(f"{param}: {message}", param, "invalid_request")


def _text_of(content: Any, where: str) -> str:
    """The text of ``content``: a string, or text blocks (joined one per line)."""
    if isinstance(content, str):
        return content
    return "\n".join(
        _string(block.get("text"), f"{at}.text")
        for at, block in _blocks(content, where)
        if block.get("type") == "text"
    )


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _fail("Input should be a valid string", where)
    return value


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any]:
    source = block.get("source")
    if not isinstance(source, dict):
        raise _fail("Field required", f"{where}.source")
    if source.get("type") == "base64":
        media = _string(source.get("media_type"), f"{where}.source.media_type")
        data = _string(source.get("data"), f"{where}.source.data")
        return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if source.get("type") == "url":
        return {"type": "image_url", "image_url": {"url": _string(source.get("url"), f"{where}.source.url")}}
    raise _fail("source.type must be 'base64' or 'url'", f"{where}.source.type")


def _blocks(content: list[Any] | Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(path, block)`` for each content block of a list (400 for anything else)."""
    if not isinstance(content, list):
        raise _fail("must be a string or a list of content blocks", where)
    for j, block in enumerate(content):
        if not isinstance(block, dict):
            raise _fail("must be an object", f"{where}.{j}")
        yield f"{where}.{j}", block


def _user_messages(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn as chat messages: its tool results first (``tool`` messages), then the
    rest as one user message."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for at, block in _blocks(content, where):
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": _string(block.get("text"), f"{at}.text")})
        elif kind == "image":
            parts.append(_image_part(block, at))
        elif kind == "tool_result":
            call = _string(block.get("tool_use_id"), f"{at}.tool_use_id")
            result = block.get("content", "")
            text = _text_of(result, f"{at}.content")
            tools.append({"role": "tool", "tool_call_id": call, "content": text})
        else:
            raise _fail(f"unsupported content block type {kind!r} in a user message", f"{at}.type")
    out = tools
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant_message(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for at, block in _blocks(content, where):
        kind = block.get("type")
        if kind == "text":
            texts.append(_string(block.get("text"), f"{at}.text"))
        elif kind == "tool_use":
            name = _string(block.get("name"), f"{at}.name")
            call = _string(block.get("id"), f"{at}.id")
            arguments = _encode(block.get("input", {})).decode()
            calls.append({"id": call, "type": "function", "function": {"name": name, "arguments": arguments}})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # earlier reasoning: engines are not shown it again
        else:
            raise _fail(f"unsupported content block type {kind!r} in an assistant message", f"{at}.type")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _fail("Input should be a valid list", "tools")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _fail("must be an object", f"tools.{i}")
        function: dict[str, Any] = {"name": _string(tool.get("name"), f"tools.{i}.name")}
        if "description" in tool:
            function["description"] = _string(tool["description"], f"tools.{i}.description")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise _fail("Field required", f"tools.{i}.input_schema")
        function["parameters"] = schema
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        raise _fail("must be an object", "tool_choice")
    kind = choice.get("type")
    if kind == "auto":
        return "auto"
    if kind == "any":
        return "required"
    if kind == "none":
        return "none"
    if kind == "tool":
        return {"type": "function", "function": {"name": _string(choice.get("name"), "tool_choice.name")}}
    raise _fail("type must be one of 'auto', 'any', 'tool', 'none'", "tool_choice.type")


def to_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI chat body of a Messages request (400 with the field named when it is bad)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("Field required" if model is None else "must be a non-empty string", "model")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise _fail("Field required", "max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise _fail("must be an integer of at least 1", "max_tokens")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _fail("Field required" if messages is None else "Input should be a valid list", "messages")
    if not messages:
        raise _fail("at least one message is required", "messages")
    chat: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        chat.append({"role": "system", "content": _text_of(system, "system")})
    for i, message in enumerate(messages):
        at = f"messages.{i}"
        if not isinstance(message, dict):
            raise _fail("must be an object", at)
        role = message.get("role")
        if "content" not in message:
            raise _fail("Field required", f"{at}.content")
        if role == "user":
            chat.extend(_user_messages(message["content"], f"{at}.content"))
        elif role == "assistant":
            chat.append(_assistant_message(message["content"], f"{at}.content"))
        else:
            raise _fail("Input should be 'user' or 'assistant'", f"{at}.role")
    out: dict[str, Any] = {"model": model, "messages": chat, "max_tokens": max_tokens}
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _fail("Input should be a valid boolean", "stream")
    if stream:
        out["stream"] = True
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _fail("Input should be a list of strings", "stop_sequences")
        if stops:
            out["stop"] = stops
    temperature = body.get("temperature")
    if temperature is not None:
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not 0 <= temperature <= 1
        ):
            raise _fail("must be a number between 0 and 1", "temperature")
        out["temperature"] = temperature
    for key in ("top_p", "top_k"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("tools") is not None:
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        out["user"] = metadata["user_id"]
    return out


def parse_messages(raw: bytes, request_id: str, now: float, estimate: bool = True) -> InferenceRequest:
    """A Messages request as a chat request in the ``anthropic`` wire format (``estimate``: as
    in :func:`~shuniu.core.api.openai.parse_body`)."""
    req = parse_body(to_chat_body(decode_body(raw)), "chat", request_id, now, estimate)
    req.wire = "anthropic"
    return req


def parse_count(raw: bytes, request_id: str, now: float, estimate: bool = True) -> InferenceRequest:
    """A ``/v1/messages/count_tokens`` request: a Messages request without ``max_tokens``
    (and without streaming), to count."""
    body = decode_body(raw)
    body.setdefault("max_tokens", 1)
    body.pop("stream", None)
    req = parse_body(to_chat_body(body), "chat", request_id, now, estimate)
    req.wire = "anthropic"
    return req


def _message_id(req: InferenceRequest) -> str:
    return "msg_" + req.id


def _stop_reason(finish: str | None) -> str:
    return _STOP_REASONS.get(finish or "stop", "end_turn")


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    try:
        arguments = msgspec.json.decode(function.get("arguments") or "{}")
    except msgspec.DecodeError:
        arguments = {"_raw": function.get("arguments")}  # the engine's malformed JSON, kept
    return {
        "type": "tool_use",
        "id": call.get("id") or "toolu_0",
        "name": function.get("name", ""),
        "input": arguments if isinstance(arguments, dict) else {"value": arguments},
    }


def _usage(usage: Usage) -> dict[str, Any]:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens not read from the prefix
    cache, ``cache_read_input_tokens`` those that were (when the engine says)."""
    cached = usage.cached_tokens
    if cached is None:
        return {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens}
    return {
        "input_tokens": usage.prompt_tokens - cached,
        "cache_read_input_tokens": cached,
        "output_tokens": usage.completion_tokens,
    }


def encode_message(req: InferenceRequest, result: Completion) -> bytes:
    """A whole answer as a Messages response."""
    content: list[dict[str, Any]] = []
    if result.text:
        content.append({"type": "text", "text": result.text})
    content.extend(_tool_use(call) for call in tool_calls_of(result.extra))
    usage = result.usage
    return _encode(
        {
            "id": _message_id(req),
            "type": "message",
            "role": "assistant",
            "model": req.model,
            "content": content,
            "stop_reason": _stop_reason(result.finish_reason),
            "stop_sequence": None,
            "usage": _usage(usage),
        }
    )


def error_body(err: GatewayError) -> bytes:
    kind = _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return _encode({"type": "error", "error": {"type": kind, "message": err.message}})


def _event(name: bytes, data: dict[str, Any]) -> bytes:
    return b"event: " + name + b"\ndata: " + _encode(data) + b"\n\n"


class MessagesStream(StreamTally):
    """A streamed answer as Anthropic's events: text becomes one text block, each tool call a
    ``tool_use`` block whose input arrives as ``input_json_delta`` pieces."""

    __slots__ = ("_block", "_index", "_kind", "_tools")

    def __init__(self, req: InferenceRequest) -> None:
        super().__init__(req)
        self._index = -1  # the open block's index (-1: none yet)
        self._kind: str | None = None  # "text" or "tool", while a block is open
        self._block = b""  # the open text block's delta prefix
        self._tools: dict[int, int] = {}  # the engine's tool-call index -> block index

    def start(self) -> bytes:
        message = {
            "id": _message_id(self._req),
            "type": "message",
            "role": "assistant",
            "model": self._req.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self._req.prompt_tokens, "output_tokens": 0},
        }
        return _event(b"message_start", {"type": "message_start", "message": message})

    def _close(self) -> bytes:
        if self._kind is None:
            return b""
        self._kind = None
        return _event(b"content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._index += 1
        self._kind = kind
        if kind == "text":
            self._block = (
                b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
                + str(self._index).encode()
                + b',"delta":{"type":"text_delta","text":'
            )
        start = {"type": "content_block_start", "index": self._index, "content_block": block}
        return out + _event(b"content_block_start", start)

    def chunk(self, c: Chunk) -> bytes:
        self.note(c)
        out = b""
        if c.text:
            if self._kind != "text":
                out += self._open("text", {"type": "text", "text": ""})
            out += self._block + _encode(c.text) + b"}}\n\n"
        for call in tool_calls_of(c.extra):
            out += self._tool_delta(call)
        return out

    def _tool_delta(self, call: dict[str, Any]) -> bytes:
        out = b""
        position = call.get("index", 0)
        function = call.get("function") or {}
        if position not in self._tools:  # a new call: its own block
            block = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{position}",
                "name": function.get("name", ""),
                "input": {},
            }
            out += self._open("tool", block)
            self._tools[position] = self._index
        piece = function.get("arguments")
        if piece:
            delta = {
                "type": "content_block_delta",
                "index": self._tools[position],
                "delta": {"type": "input_json_delta", "partial_json": piece},
            }
            out += _event(b"content_block_delta", delta)
        return out

    def end(self) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(self.finish_reason), "stop_sequence": None},
            "usage": _usage(self.final_usage()),
        }
        return (
            self._close()
            + _event(b"message_delta", delta)
            + _event(b"message_stop", {"type": "message_stop"})
        )

    def error(self, err: GatewayError) -> bytes:
        return b"event: error\ndata: " + error_body(err) + b"\n\n"
