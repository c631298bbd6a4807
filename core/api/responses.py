"""OpenAI's Responses API (``POST /v1/responses``), stateless, translated onto chat.

The request becomes an OpenAI chat body: ``instructions`` a first system message; ``input``
(a string, or items) the messages: ``message`` items with ``input_text``, ``input_image``
and ``output_text`` parts, ``function_call`` items an assistant's ``tool_calls``,
``function_call_output`` items ``tool`` messages; ``tools`` (functions) their chat form;
``max_output_tokens`` ``max_tokens``; ``text.format`` ``response_format``;
``reasoning.effort`` ``reasoning_effort``. The answer is a ``response`` object whose
``output`` holds a ``message`` item (``output_text``) and a ``function_call`` item per tool
call; ``status`` is ``incomplete`` (``max_output_tokens``) when the engine stopped at the
length limit. Streamed, it is the ``response.*`` events, each with its ``sequence_number``.

Nothing is stored: ``store: true``, ``previous_response_id``, ``conversation`` and
``background: true`` are refused with 400 until stored responses exist (a request that does
not set ``store`` is answered and not stored). Built-in tools (web search, file search,
computer use) are refused: only ``function`` tools reach an engine.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from shuniu.core.api.openai import StreamTally, decode_body, parse_body, tool_calls_of
from shuniu.core.errors import GatewayError, bad_request
from shuniu.core.types import Chunk, Completion, InferenceRequest, Usage

__all__ = ["ResponsesStream", "encode_response", "parse_responses", "to_chat_body"]

_encode = msgspec.json.Encoder().encode

_UNSTORED = {
    "previous_response_id": "previous_response_id needs stored responses, which this gateway does not keep",
    "conversation": "conversations need stored responses, which this gateway does not keep",
}


def _fail(message: str, param: str, code: str = "invalid_value") -> GatewayError:
    return bad_request(message, param, code)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise _fail(f"Invalid type for '{where}': expected a string.", where, "invalid_type")
    return value


def _parts(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message item's content as chat content: a string, or parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail(f"Invalid type for '{where}': expected a string or an array.", where, "invalid_type")
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise _fail(f"Invalid type for '{at}': expected an object.", at, "invalid_type")
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": _string(part.get("text"), f"{at}.text")})
        elif kind == "input_image":
            url = part.get("image_url")
            if not isinstance(url, str):
                raise _fail(f"'{at}.image_url' is required (file ids need stored files).", f"{at}.image_url")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "refusal":
            parts.append({"type": "text", "text": _string(part.get("refusal"), f"{at}.refusal")})
        else:
            raise _fail(
                f"Unsupported content part type {kind!r} in '{at}'.", f"{at}.type", "unsupported_value"
            )
    return parts


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        out.append({"role": "system", "content": _string(instructions, "instructions")})
    items = body.get("input")
    if items is None:
        raise _fail("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    if isinstance(items, str):
        out.append({"role": "user", "content": items})
        return out
    if not isinstance(items, list) or not items:
        raise _fail("'input' must be a string or a non-empty array of items.", "input")
    for i, item in enumerate(items):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise _fail(f"Invalid type for '{at}': expected an object.", at, "invalid_type")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _fail(
                    f"Invalid value for '{at}.role': {role!r}; "
                    "expected one of assistant, developer, system, user.",
                    f"{at}.role",
                )
            if "content" not in item:
                raise _fail(
                    f"Missing required parameter: '{at}.content'.",
                    f"{at}.content",
                    "missing_required_parameter",
                )
            out.append({"role": role, "content": _parts(item["content"], f"{at}.content")})
        elif kind == "function_call":
            call = {
                "id": _string(item.get("call_id"), f"{at}.call_id"),
                "type": "function",
                "function": {
                    "name": _string(item.get("name"), f"{at}.name"),
                    "arguments": _string(item.get("arguments", "{}"), f"{at}.arguments"),
                },
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and not last.get("content"):
                last.setdefault("tool_calls", []).append(call)  # parallel calls share one turn
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _encode(output).decode()
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item.get("call_id"), f"{at}.call_id"),
                    "content": text,
                }
            )
        elif kind == "reasoning":
            continue  # earlier reasoning: engines are not shown it again
        else:
            raise _fail(f"Unsupported input item type {kind!r} in '{at}'.", f"{at}.type", "unsupported_value")
    return out


def _tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise _fail("Invalid type for 'tools': expected an array.", "tools", "invalid_type")
    out = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _fail(f"Invalid type for '{at}': expected an object.", at, "invalid_type")
        if tool.get("type") != "function":
            raise _fail(
                f"Tool type {tool.get('type')!r} in '{at}' is not served here: "
                "only function tools reach an engine.",
                f"{at}.type",
                "unsupported_value",
            )
        function: dict[str, Any] = {"name": _string(tool.get("name"), f"{at}.name")}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": _string(choice.get("name"), "tool_choice.name")}}
    raise _fail("'tool_choice' must be 'auto', 'none', 'required' or a function.", "tool_choice")


def _response_format(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, dict) or not isinstance(text.get("format"), dict):
        return None
    fmt = text["format"]
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if kind == "json_object":
        return {"type": "json_object"}
    return None


def to_chat_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat body of a Responses request (400 with the parameter named when it is bad)."""
    if body.get("store") is True:
        raise _fail(
            "'store: true' needs stored responses, which this gateway does not keep; send 'store: false'.",
            "store",
            "unsupported_value",
        )
    for key, why in _UNSTORED.items():
        if body.get(key) is not None:
            raise _fail(f"'{key}' is not supported: {why}.", key, "unsupported_parameter")
    if body.get("background") is True:
        raise _fail(
            "'background: true' is not supported: responses are answered as they run.",
            "background",
            "unsupported_value",
        )
    model = body.get("model")
    if not isinstance(model, str):
        raise _fail("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    out: dict[str, Any] = {"model": model, "messages": _messages(body)}
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise _fail(
                f"'max_output_tokens' must be an integer of at least 1, got {limit!r}.", "max_output_tokens"
            )
        out["max_tokens"] = limit
    if body.get("stream") is True:
        out["stream"] = True
    for key in ("temperature", "top_p", "parallel_tool_calls", "user", "seed"):
        if body.get(key) is not None:
            out[key] = body[key]
    if body.get("tools"):
        out["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = _response_format(body.get("text"))
    if fmt is not None:
        out["response_format"] = fmt
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        out["reasoning_effort"] = reasoning["effort"]
    return out


class _Echo(msgspec.Struct):
    """What a response repeats of its request."""

    created_at: int
    instructions: Any = None
    max_output_tokens: Any = None
    temperature: Any = None
    top_p: Any = None
    tools: Any = None
    tool_choice: Any = "auto"
    parallel_tool_calls: Any = True
    metadata: Any = None
    text: Any = None


def parse_responses(raw: bytes, request_id: str, now: float, estimate: bool = True) -> InferenceRequest:
    """A Responses request as a chat request in the ``responses`` wire format (``estimate``: as
    in :func:`~shuniu.core.api.openai.parse_body`)."""
    body = decode_body(raw)
    req = parse_body(to_chat_body(body), "chat", request_id, now, estimate)
    req.wire = "responses"
    req.wire_state = _Echo(
        int(time.time()),
        **{k: body[k] for k in _Echo.__struct_fields__ if k != "created_at" and body.get(k) is not None},
    )
    return req


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


def _response(req: InferenceRequest, status: str, output: list[Any], usage: Usage | None) -> dict[str, Any]:
    echo = req.wire_state if isinstance(req.wire_state, _Echo) else _Echo(int(time.time()))
    return {
        "id": "resp_" + req.id,
        "object": "response",
        "created_at": echo.created_at,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": echo.instructions,
        "max_output_tokens": echo.max_output_tokens,
        "model": req.model,
        "output": output,
        "parallel_tool_calls": echo.parallel_tool_calls,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": echo.temperature,
        "text": echo.text or {"format": {"type": "text"}},
        "tool_choice": echo.tool_choice,
        "tools": echo.tools or [],
        "top_p": echo.top_p,
        "truncation": "disabled",
        "usage": _usage(usage) if usage is not None else None,
        "metadata": echo.metadata or {},
    }


def _status(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def _message_item(req: InferenceRequest, text: str, status: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": "msg_" + req.id,
        "status": status,
        "role": "assistant",
        "content": [part],
    }


def _call_item(
    req: InferenceRequest, n: int, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{req.id}_{n}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def encode_response(req: InferenceRequest, result: Completion) -> bytes:
    """A whole answer as a ``response`` object."""
    output: list[dict[str, Any]] = []
    status = _status(result.finish_reason)
    if result.text:
        output.append(_message_item(req, result.text, "completed"))
    for n, call in enumerate(tool_calls_of(result.extra)):
        function = call.get("function") or {}
        call_id = call.get("id") or f"call_{n}"
        arguments = function.get("arguments") or ""
        output.append(_call_item(req, n, call_id, function.get("name", ""), arguments, "completed"))
    return _encode(_response(req, status, output, result.usage))


class ResponsesStream(StreamTally):
    """A streamed answer as the ``response.*`` events: one ``message`` item with one
    ``output_text`` part for the text, one ``function_call`` item per tool call."""

    __slots__ = ("_calls", "_items", "_open", "_seq")

    def __init__(self, req: InferenceRequest) -> None:
        super().__init__(req)
        self._seq = 0
        self._items: list[dict[str, Any]] = []  # output items so far (their final form)
        self._open: int | None = None  # the index of the item still receiving deltas
        self._calls: dict[int, int] = {}  # the engine's tool-call index -> output index

    def _event(self, kind: str, **data: Any) -> bytes:
        body = {"type": kind, "sequence_number": self._seq, **data}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + _encode(body) + b"\n\n"

    def start(self) -> bytes:
        head = _response(self._req, "in_progress", [], None)
        return self._event("response.created", response=head) + self._event(
            "response.in_progress", response=head
        )

    def _close(self) -> bytes:
        index = self._open
        if index is None:
            return b""
        self._open = None
        item = self._items[index]
        item["status"] = "completed"
        out = b""
        if item["type"] == "message":
            part = item["content"][0]
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out += self._event("response.output_text.done", **ids, text=part["text"], logprobs=[])
            out += self._event("response.content_part.done", **ids, part=part)
        else:
            ids = {"item_id": item["id"], "output_index": index}
            out += self._event("response.function_call_arguments.done", **ids, arguments=item["arguments"])
        return out + self._event("response.output_item.done", output_index=index, item=item)

    def _add(self, item: dict[str, Any]) -> bytes:
        out = self._close()
        self._items.append(item)
        index = self._open = len(self._items) - 1
        shown = {**item, "status": "in_progress"}
        if item["type"] == "message":
            shown["content"] = []
        else:
            shown["arguments"] = ""
        out += self._event("response.output_item.added", output_index=index, item=shown)
        if item["type"] == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out += self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=part,
            )
        return out

    def chunk(self, c: Chunk) -> bytes:
        self.note(c)
        out = b""
        if c.text:
            open_item = self._items[self._open] if self._open is not None else None
            if open_item is None or open_item["type"] != "message":
                out += self._add(_message_item(self._req, "", "in_progress"))
            index = self._open
            assert index is not None
            item = self._items[index]
            item["content"][0]["text"] += c.text
            out += self._event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                delta=c.text,
                logprobs=[],
            )
        for call in tool_calls_of(c.extra):
            out += self._call_delta(call)
        return out

    def _call_delta(self, call: dict[str, Any]) -> bytes:
        out = b""
        position = call.get("index", 0)
        function = call.get("function") or {}
        if position not in self._calls:
            n = len(self._calls)
            call_id = call.get("id") or f"call_{n}"
            out += self._add(_call_item(self._req, n, call_id, function.get("name", ""), "", "in_progress"))
            self._calls[position] = len(self._items) - 1
        index = self._calls[position]
        piece = function.get("arguments")
        if piece:
            item = self._items[index]
            item["arguments"] += piece
            out += self._event(
                "response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=piece
            )
        return out

    def end(self) -> bytes:
        out = self._close()
        status = _status(self.finish_reason)
        final = _response(self._req, status, self._items, self.final_usage())
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(kind, response=final)

    def error(self, err: GatewayError) -> bytes:
        failed = _response(self._req, "failed", self._items, None)
        failed["error"] = {"code": err.code or err.type, "message": err.message}
        return self._event("response.failed", response=failed)
