"""The OpenAI wire format: request parsing/validation and response/SSE encoding.

Requests are decoded once with msgspec, checked against typed structs, and kept as the
decoded dict for pass-through. Streamed chunks are written from per-request byte templates,
so the per-token cost is one JSON string encode and two byte concatenations.
"""

from __future__ import annotations

import re
import time
from typing import Any

import msgspec

from shuniu.core.errors import GatewayError, bad_request
from shuniu.core.tokens import count_chat, count_tokens
from shuniu.core.types import Api, Chunk, Completion, InferenceRequest, Usage

__all__ = [
    "UNCOUNTED",
    "StreamEncoder",
    "StreamTally",
    "decode_body",
    "encode_completion",
    "estimate_prompt",
    "parse_body",
    "parse_request",
    "stream_usage",
    "tool_calls_of",
    "usage_object",
]

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


class _StreamOptions(msgspec.Struct):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Message(msgspec.Struct):
    role: str
    content: str | list[dict[str, Any]] | None = None


class _Common(msgspec.Struct):
    model: str
    stream: bool = False
    stream_options: _StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    user: str | None = None
    n: int | None = None
    ignore_eos: bool = False
    priority: int = 0


class _ChatBody(_Common):
    messages: list[_Message] = msgspec.field(default_factory=list)


class _CompletionBody(_Common):
    # str | list[str] | list[int] | list[list[int]]: msgspec cannot express a union of several
    # array types, so the shape is checked by hand in parse_request.
    prompt: str | list[Any] | None = None


_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_MSGSPEC_PATH = re.compile(r"^(.*?) - at `\$(.*)`$")
_MISSING = re.compile(r"^Object missing required field `(.+)`$")


def _validation_error(exc: msgspec.ValidationError) -> GatewayError:
    text = str(exc)
    m = _MSGSPEC_PATH.match(text)
    message, path = (m.group(1), m.group(2).lstrip(".")) if m else (text, "")
    missing = _MISSING.match(message)
    if missing:
        param = f"{path}.{missing.group(1)}" if path else missing.group(1)
        return bad_request(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")
    param = path or None
    where = f" for '{param}'" if param else ""
    return bad_request(f"Invalid value{where}: {message}.", param, "invalid_type")


_TEXT_ONLY: frozenset[str] = frozenset()

MODALITY_OF_PART = {
    "image_url": "image",
    "image": "image",
    "input_image": "image",
    "input_audio": "audio",
    "audio_url": "audio",
    "audio": "audio",
    "video_url": "video",
    "video": "video",
    "file": "file",
    "input_file": "file",
}
"""Content part types that are not text, and the input modality each is (OpenAI's parts and
vLLM's extensions)."""


def _flatten_content(content: str | list[dict[str, Any]] | None, i: int, seen: set[str]) -> str:
    """The text of a message's content; the non-text modalities its parts carry go in ``seen``."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if not isinstance(kind, str):
            raise bad_request("Each content part needs a string 'type'.", f"messages[{i}].content[{j}].type")
        modality = MODALITY_OF_PART.get(kind)
        if modality is not None:
            seen.add(modality)
        elif kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise bad_request(
                    "A text content part needs a string 'text'.",
                    f"messages[{i}].content[{j}].text",
                    "invalid_type",
                )
            texts.append(text)
    return "".join(texts)


MAX_DEPTH = 64
"""Deepest nesting of JSON arrays and objects a body may have. Real requests (tool schemas
included) stay far below; a deeper one is refused with 400, because every later step that
walks the body (validation, the cache key, the body forwarded to the engine) recurses."""


def _too_deep(raw: bytes, body: Any) -> bool:
    """Whether ``body`` nests deeper than :data:`MAX_DEPTH`. Counting brackets in the raw
    bytes (in C) bounds the depth from above, so the walk runs only for bodies with many
    containers (long conversations), and it visits containers only."""
    if raw.count(b"{") + raw.count(b"[") <= MAX_DEPTH:
        return False
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return True
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


def _nested_too_deep() -> GatewayError:
    return bad_request(
        f"The JSON body of your request is nested more than {MAX_DEPTH} levels deep.", None, "invalid_json"
    )


def decode_body(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object; 400 when it is not JSON, not UTF-8, not an object, or
    nested deeper than :data:`MAX_DEPTH`."""
    try:
        body = _decode(raw)
    except RecursionError:  # deeper than the decoder goes (about a thousand levels)
        raise _nested_too_deep() from None
    except msgspec.DecodeError as exc:
        raise bad_request(
            f"We could not parse the JSON body of your request ({exc}).", None, "invalid_json"
        ) from None
    except UnicodeDecodeError:
        # msgspec checks UTF-8 inside strings lazily and raises this rather than DecodeError.
        raise bad_request(
            "We could not parse the JSON body of your request (it is not valid UTF-8).", None, "invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", None, "invalid_json")
    if _too_deep(raw, body):
        raise _nested_too_deep()
    return body


UNCOUNTED = -1
"""``InferenceRequest.prompt_tokens`` of a text prompt parsed with ``estimate=False``: not
counted yet (:func:`estimate_prompt` counts it)."""


def parse_request(
    raw: bytes, api: Api, request_id: str, now: float, estimate: bool = True
) -> InferenceRequest:
    """Decode and validate a request body; raise a 400 :class:`GatewayError` if it is bad."""
    return parse_body(decode_body(raw), api, request_id, now, estimate)


def parse_body(
    body: dict[str, Any], api: Api, request_id: str, now: float, estimate: bool = True
) -> InferenceRequest:
    """Validate a decoded OpenAI request body (chat or completions) into a request.

    ``estimate=False`` leaves a text prompt's ``prompt_tokens`` at :data:`UNCOUNTED`: the
    request path counts it with the model's tokenizer when the model has one, and estimates
    (:func:`estimate_prompt`) only when it has not (on a ~2,000-token prompt the estimate
    costs about as much CPU as the tokenizer)."""
    try:
        parsed: _ChatBody | _CompletionBody = msgspec.convert(
            body, _ChatBody if api == "chat" else _CompletionBody
        )
    except msgspec.ValidationError as exc:
        raise _validation_error(exc) from None

    token_ids: list[int] | None = None
    modalities: frozenset[str] = _TEXT_ONLY
    if api == "chat":
        assert isinstance(parsed, _ChatBody)
        if "messages" not in body:
            raise bad_request(
                "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
            )
        if not parsed.messages:
            raise bad_request("'messages' must contain at least one message.", "messages", "empty_array")
        lines = []
        seen: set[str] = set()
        for i, msg in enumerate(parsed.messages):
            if msg.role not in _ROLES:
                raise bad_request(
                    f"Invalid value for 'messages[{i}].role': {msg.role!r}; expected one of "
                    + ", ".join(sorted(_ROLES))
                    + ".",
                    f"messages[{i}].role",
                    "invalid_value",
                )
            lines.append(f"{msg.role}: {_flatten_content(msg.content, i, seen)}\n")
        prompt = "".join(lines)
        prompt_tokens = UNCOUNTED
        if seen:
            modalities = frozenset(seen)
    else:
        assert isinstance(parsed, _CompletionBody)
        p = parsed.prompt
        if p is None:
            raise bad_request("Missing required parameter: 'prompt'.", "prompt", "missing_required_parameter")
        if isinstance(p, list) and not p:
            raise bad_request("'prompt' must not be empty.", "prompt", "invalid_value")
        if isinstance(p, list) and isinstance(p[0], list | str):
            if len(p) != 1:
                raise bad_request(
                    "Batched prompts (a list of several prompts) are not supported; send one "
                    "request per prompt.",
                    "prompt",
                    "unsupported_value",
                )
            p = p[0]
        if isinstance(p, str):
            prompt, prompt_tokens = p, UNCOUNTED
        elif p and all(type(t) is int for t in p):
            # The ids are the prompt exactly: counts and block_tokens prefix hashing use them.
            prompt, prompt_tokens, token_ids = " ".join(map(str, p)), len(p), list(p)
        else:
            raise bad_request(
                "'prompt' must be a string, a list of token ids, or a list with one of those.",
                "prompt",
                "invalid_type",
            )

    if not parsed.model:
        raise bad_request("'model' must be a non-empty string.", "model", "invalid_value")
    max_tokens = (
        parsed.max_completion_tokens if parsed.max_completion_tokens is not None else parsed.max_tokens
    )
    if max_tokens is not None and max_tokens < 1:
        param = "max_completion_tokens" if parsed.max_completion_tokens is not None else "max_tokens"
        raise bad_request(f"'{param}' must be at least 1, got {max_tokens}.", param, "invalid_value")
    if parsed.temperature is not None and not 0 <= parsed.temperature <= 2:
        raise bad_request(
            f"'temperature' must be between 0 and 2, got {parsed.temperature}.",
            "temperature",
            "invalid_value",
        )
    if parsed.top_p is not None and not 0 < parsed.top_p <= 1:
        raise bad_request(f"'top_p' must be in (0, 1], got {parsed.top_p}.", "top_p", "invalid_value")
    if parsed.n is not None and parsed.n != 1:
        raise bad_request("Only n=1 is supported; send n requests instead.", "n", "unsupported_value")
    stop = parsed.stop
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if any(not s for s in stops):
        raise bad_request("'stop' sequences must be non-empty strings.", "stop", "invalid_value")
    if parsed.stream_options is not None and not parsed.stream:
        raise bad_request(
            "'stream_options' is only allowed when 'stream' is true.", "stream_options", "invalid_value"
        )
    req = InferenceRequest(
        id=request_id,
        api=api,
        model=parsed.model,
        body=body,
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        stream=parsed.stream,
        include_usage=bool(parsed.stream_options and parsed.stream_options.include_usage),
        modalities=modalities,
        continuous_usage=bool(
            parsed.stream_options
            and parsed.stream_options.include_usage
            and parsed.stream_options.continuous_usage_stats
        ),
        max_tokens=max_tokens,
        stop=stops,
        ignore_eos=parsed.ignore_eos,
        seed=parsed.seed,
        priority=parsed.priority,
        arrival=now,
        token_ids=token_ids,
    )
    if estimate and prompt_tokens == UNCOUNTED:  # a text prompt: estimated here or by the caller
        req.prompt_tokens = estimate_prompt(req)
    return req


def _response_id(req: InferenceRequest) -> str:
    return ("chatcmpl-" if req.api == "chat" else "cmpl-") + req.id


def usage_object(usage: Usage) -> dict[str, Any]:
    """``usage`` as OpenAI writes it (``prompt_tokens_details.cached_tokens`` when the engine
    said how many prompt tokens its prefix cache served)."""
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return out


def estimate_prompt(req: InferenceRequest) -> int:
    """The estimated token count of a request parsed with ``estimate=False`` (the count
    :func:`parse_body` would have made)."""
    if req.api == "chat":
        return count_chat(req.prompt, len(req.body["messages"]))
    return count_tokens(req.prompt)


def encode_completion(req: InferenceRequest, result: Completion, created: int | None = None) -> bytes:
    """The non-streamed response body."""
    created = int(time.time()) if created is None else created
    usage = result.usage
    if req.api == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": result.text}
        if result.extra:
            message.update(result.extra)
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": result.finish_reason,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
        obj = "text_completion"
    return _encode(
        {
            "id": _response_id(req),
            "object": obj,
            "created": created,
            "model": req.model,
            "choices": [choice],
            "usage": usage_object(usage),
        }
    )


def stream_usage(req: InferenceRequest, reported: Usage | None, completion_tokens: int) -> Usage:
    """A stream's usage: the engine's when it reported one, else the prompt's count and the
    chunks' tokens."""
    if reported is not None:
        return reported
    return Usage(req.prompt_tokens, completion_tokens, req.prompt_tokens + completion_tokens)


def tool_calls_of(extra: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The tool calls (or tool-call deltas) in a message's or chunk's extra fields."""
    calls = (extra or {}).get("tool_calls")
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


class StreamTally:
    """What every wire format's stream writer keeps of the chunks it wrote: the tokens, the
    engine's usage and the finish reason (:meth:`note`), and the usage at the end."""

    __slots__ = ("_req", "completion_tokens", "finish_reason", "usage")

    def __init__(self, req: InferenceRequest) -> None:
        self._req = req
        self.completion_tokens = 0
        self.usage: Usage | None = None
        self.finish_reason: str | None = None

    def note(self, c: Chunk) -> None:
        self.completion_tokens += c.tokens
        if c.usage is not None:
            self.usage = c.usage
        if c.finish_reason is not None:
            self.finish_reason = c.finish_reason

    def final_usage(self) -> Usage:
        return stream_usage(self._req, self.usage, self.completion_tokens)


class StreamEncoder:
    """Turns backend chunks into OpenAI SSE events for one request."""

    __slots__ = (
        "_base",
        "_chat",
        "_continuous",
        "_head",
        "_raw_end",
        "_raw_head",
        "_req",
        "_tail",
        "_usage_null",
        "completion_tokens",
        "finish_reason",
        "usage",
    )

    def __init__(self, req: InferenceRequest, created: int | None = None) -> None:
        created = int(time.time()) if created is None else created
        self._req = req
        self._chat = req.api == "chat"
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        self._usage_null = b',"usage":null' if req.include_usage else b""
        self._continuous = req.continuous_usage
        self._base = (
            b'{"id":'
            + _encode(_response_id(req))
            + b',"object":"'
            + obj.encode()
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + _encode(req.model)
        )
        if self._chat:
            self._head = b"data: " + self._base + b',"choices":[{"index":0,"delta":{"content":'
        else:
            self._head = b"data: " + self._base + b',"choices":[{"index":0,"text":'
        self._tail = b"}" if self._chat else b""
        self._raw_head = b"data: " + self._base + b","
        self._raw_end = self._usage_null + b"}\n\n"
        self.completion_tokens = 0
        self.usage: Usage | None = None
        self.finish_reason: str | None = None

    def start(self) -> bytes:
        """The first event: chat streams announce the assistant role, as OpenAI does."""
        if not self._chat:
            return b""
        return (
            b"data: "
            + self._base
            + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
            b'"finish_reason":null}]'
            + (self._usage_null if not self._continuous else self._running())
            + b"}\n\n"
        )

    def chunk(self, c: Chunk) -> bytes:
        self.completion_tokens += c.tokens
        raw = c.raw
        if raw is not None:
            # The engine's own event: its choices (and any fields after them) as they came,
            # under this answer's id, created and model.
            if c.finish_reason is not None:
                self.finish_reason = c.finish_reason
            return self._raw_head + raw + self._raw_end
        if c.usage is not None:
            self.usage = c.usage
        if c.finish_reason is None:
            finish = b"null"
        else:
            finish = _encode(c.finish_reason)
            self.finish_reason = c.finish_reason
        usage = self._usage_null if not self._continuous else self._running()
        if c.extra:
            return self._generic(c, finish, usage)
        if not c.text and c.finish_reason is None:
            return b""
        if self._chat and not c.text:
            return (
                b"data: " + self._base + b',"choices":[{"index":0,"delta":{},"logprobs":null,'
                b'"finish_reason":' + finish + b"}]" + usage + b"}\n\n"
            )
        return (
            self._head
            + _encode(c.text)
            + self._tail
            + b',"logprobs":null,"finish_reason":'
            + finish
            + b"}]"
            + usage
            + b"}\n\n"
        )

    def _running(self) -> bytes:
        """The usage so far, for ``continuous_usage_stats``."""
        p = self._req.prompt_tokens
        n = self.completion_tokens
        return b',"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}' % (p, n, p + n)

    def _generic(self, c: Chunk, finish: bytes, usage: bytes) -> bytes:
        if self._chat:
            delta: dict[str, Any] = dict(c.extra or {})
            if c.text:
                delta["content"] = c.text
            choice = b'{"index":0,"delta":' + _encode(delta)
        else:
            choice = b'{"index":0,"text":' + _encode(c.text)
        return (
            b"data: "
            + self._base
            + b',"choices":['
            + choice
            + b',"logprobs":null,"finish_reason":'
            + finish
            + b"}]"
            + usage
            + b"}\n\n"
        )

    def final_usage(self) -> Usage:
        return stream_usage(self._req, self.usage, self.completion_tokens)

    def end(self) -> bytes:
        """The usage chunk (when asked for) and ``[DONE]``."""
        if not self._req.include_usage:
            return b"data: [DONE]\n\n"
        return (
            b"data: "
            + self._base
            + b',"choices":[],"usage":'
            + _encode(usage_object(self.final_usage()))
            + b"}\n\ndata: [DONE]\n\n"
        )

    @staticmethod
    def error(err: GatewayError) -> bytes:
        """A failure after the first byte: an error event, then ``[DONE]``."""
        return err.sse_event() + b"data: [DONE]\n\n"
