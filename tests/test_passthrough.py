"""Ordinary stream events forwarded as the engine wrote them (``backends/http/passthrough.py``):
:class:`RawEvents` fed the events engines write, which are forwarded, and what the gateway
then writes. Streams through a real gateway are in ``test_openai_backend.py`` (a scripted
upstream) and ``test_vllm_real.py`` (a real vLLM)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shuniu.backends.http import RawEvents
from shuniu.core.api.openai import StreamEncoder, parse_request
from shuniu.core.pipeline.delivery import raw_events_allowed
from shuniu.core.pipeline.response_cache import Filler
from shuniu.core.types import Chunk

_HEAD = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 7, "model": "up-model"}


def _compact(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _event(delta: dict[str, Any], finish: str | None = None, **rest: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return _compact({**_HEAD, "choices": [choice], **rest})


def test_an_ordinary_content_delta_is_forwarded_from_its_choices_on() -> None:
    raw = RawEvents(chat=True)
    chunk = raw.take(_event({"content": "Hi"}))
    assert chunk is not None and chunk.tokens == 1 and chunk.text == ""
    assert (
        chunk.raw == b'"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null}]'
    )
    # The second event of the stream is recognised by its head; fields after the choices stay.
    second = raw.take(_event({"content": "!"}, stop_reason=None))
    assert second is not None and second.raw is not None and second.raw.endswith(b',"stop_reason":null')
    # A "usage":null (OpenAI writes one on every chunk once usage is asked for) is left out:
    # the gateway writes usage as its own client asked.
    third = raw.take(_event({"content": "x"}, usage=None))
    assert third is not None and third.raw is not None and b"usage" not in third.raw


TEXTS = [
    "Hi",
    "a b",
    'say "x"',
    "back\\slash",
    "tab\tnew\nline",
    "\\",
    'ends with \\"',
    "中文",
    "\u2028",
    "x" * 300,
]


@pytest.mark.parametrize("usage", [False, True])
def test_the_streams_template_gives_what_the_keys_give(usage: bool) -> None:
    # After one plain delta, the stream's later deltas are recognised by its template (the
    # bytes before and after the text); the result is what reading the keys gives, for
    # texts with quotes, backslashes and escapes too.
    warm = RawEvents(chat=True)
    extra = {"usage": None} if usage else {}
    assert warm.take(_event({"content": "first"}, **extra)) is not None
    for text in TEXTS:
        payload = _event({"content": text}, **extra)
        cold = RawEvents(chat=True).take(payload)
        assert cold is not None and warm.take(payload) == cold, text
        assert warm.take_line(b"data: " + payload) in (None, cold), text
        assert json.loads(b"{" + cold.raw + b"}")["choices"][0]["delta"]["content"] == text  # type: ignore[operator]
    # a whole line is recognised by the template as it is; other spacing goes the payload's way
    line = b"data: " + _event({"content": "plain"}, **extra)
    chunk = warm.take_line(line)
    assert chunk is not None and chunk == RawEvents(chat=True).take(line[6:])
    assert warm.take_line(b"data:" + line[6:]) is None
    # events of another shape are never taken for the template's: here usage figures sit
    # between a delta that starts like the template's and one that ends like it
    if not usage:
        template = _event({"content": "\x00"}).split(b"\\u0000")
        crafted = (
            template[0]
            + b'x"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":1},'
            + b'"w":[{"delta":{"content":"y'
            + template[1]
        )
        assert json.loads(crafted)["usage"] == {"prompt_tokens": 1}
        assert warm.take(crafted) is None and warm.take_line(b"data: " + crafted) is None
    assert warm.take(_event({"content": "x"}, "stop", **extra)).finish_reason == "stop"  # type: ignore[union-attr]
    assert warm.take(_event({"role": "assistant", "content": ""}, **extra)) is None


@pytest.mark.parametrize(
    ("delta", "finish", "tokens"),
    [
        ({}, "stop", 0),
        ({"content": "end"}, "length", 1),
        ({"content": 'say "finish_reason":null'}, "stop", 1),
    ],
)
def test_the_last_event_is_forwarded_with_its_finish_reason(
    delta: dict[str, Any], finish: str, tokens: int
) -> None:
    logprobs = {"content": [{"token": "end", "logprob": -1.0}]} if delta else None
    payload = _compact(
        {**_HEAD, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
    )
    chunk = RawEvents(chat=True).take(payload)
    assert chunk is not None and chunk.raw is not None
    assert (chunk.finish_reason, chunk.tokens) == (finish, tokens)
    assert json.loads(b"{" + chunk.raw + b"}")["choices"][0]["logprobs"] == logprobs


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (_event({"role": "assistant", "content": ""}), "the role announcement has no text"),
        (_event({"content": None, "tool_calls": [{"index": 0, "id": "c"}]}), "a tool call without text"),
        (_compact({**_HEAD, "choices": [], "usage": {"prompt_tokens": 1}}), "usage figures"),
        (_event({"content": "a"}, usage={"prompt_tokens": 1, "completion_tokens": 1}), "usage figures"),
        (_compact({"error": {"message": "boom"}}), "an error"),
        (_compact({**_HEAD, "choices": [], "error": {"message": "boom"}}), "an error after the head"),
        (
            json.dumps({**_HEAD, "choices": [{"delta": {"content": "a"}, "finish_reason": None}]}).encode(),
            "spaces",
        ),
        (
            _compact({"choices": [{"delta": {"content": "a"}, "finish_reason": None}], **_HEAD}),
            "the id and model after the choices would be repeated",
        ),
        (
            _compact(
                {"id": "x", "choices": [{"delta": {"content": "a"}, "finish_reason": None}], "model": "m"}
            ),
            "part of the head after the choices",
        ),
        (_event({"content": "a"})[:-1], "not an object's end"),
    ],
)
def test_events_the_gateway_reads_are_decoded(payload: bytes, why: str) -> None:
    raw = RawEvents(chat=True)
    assert raw.take(_event({"content": "warm"})) is not None  # the head is known
    assert raw.take(payload) is None, why


def test_completions_events_are_recognised_by_their_text() -> None:
    raw = RawEvents(chat=False)
    head = {**_HEAD, "object": "text_completion"}
    text = _compact(
        {**head, "choices": [{"index": 0, "text": "Hi", "logprobs": None, "finish_reason": None}]}
    )
    empty = _compact({**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": None}]})
    chunk = raw.take(text)
    assert (
        chunk is not None
        and chunk.raw is not None
        and chunk.raw.startswith(b'"choices":[{"index":0,"text":"Hi"')
    )
    assert raw.take(empty) is None
    assert RawEvents(chat=True).take(text) is None  # a chat stream looks for "content"


@pytest.mark.parametrize("usage", [False, True])
def test_the_encoder_writes_a_forwarded_event_under_the_gateways_head(usage: bool) -> None:
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    req = parse_request(_compact(body), "chat", "req-1", 0.0)
    assert raw_events_allowed(req, None)
    enc = StreamEncoder(req, created=5)
    raw = RawEvents(chat=True).take(_event({"content": "Hi"}, usage=None))
    assert raw is not None
    written = enc.chunk(raw)
    assert written.startswith(b"data: ") and written.endswith(b"\n\n")
    event = json.loads(written[6:])
    expected: dict[str, Any] = {
        "id": "chatcmpl-req-1",
        "object": "chat.completion.chunk",
        "created": 5,
        "model": "chat",
        "choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": None, "finish_reason": None}],
    }
    if usage:
        expected["usage"] = None
    assert event == expected
    # The decoded path writes the same event for the same delta.
    assert json.loads(enc.chunk(Chunk("Hi", 1))[6:]) == expected
    assert enc.completion_tokens == 2


def test_only_an_openai_stream_without_running_usage_or_a_cache_fill_allows_raw_events() -> None:
    def allowed(filler: Filler | None = None, wire: str = "openai", **extra: Any) -> bool:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
        req = parse_request(_compact(body), "chat", "r", 0.0)
        req.wire = wire
        return raw_events_allowed(req, filler)

    assert allowed(stream=True)
    assert not allowed()
    assert not allowed(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    assert not allowed(Filler(), stream=True)
    assert not allowed(wire="anthropic", stream=True)
    # a request as any other caller of a backend builds it decodes every event
    assert not parse_request(
        _compact({"model": "m", "prompt": "x", "stream": True}), "completions", "r", 0.0
    ).raw_events
