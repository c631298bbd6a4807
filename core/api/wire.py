"""Wire formats: how one API's requests are read and its answers and errors written.

Every inference request travels the same pipeline as an OpenAI chat or completions request
(``InferenceRequest``, whose ``body`` engines receive); a wire format translates at both
ends. ``InferenceRequest.wire`` names the request's format, and delivery, the response cache
and error replies write in it:

- ``openai`` (:mod:`.openai`): ``/v1/chat/completions`` and ``/v1/completions``;
- ``anthropic`` (:mod:`.anthropic`): Anthropic's Messages API, ``/v1/messages``;
- ``responses`` (:mod:`.responses`): OpenAI's Responses API, ``/v1/responses`` (stateless);
- ``embeddings``, ``rerank``, ``score`` (:mod:`.pooling`): the pooling APIs, answered in one
  piece (never streamed) from an engine's vectors or scores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from shuniu.core.api.anthropic import MessagesStream, encode_message, error_body, parse_count, parse_messages
from shuniu.core.api.openai import StreamEncoder, encode_completion, parse_request
from shuniu.core.api.pooling import (
    encode_embeddings,
    encode_rerank,
    encode_score,
    parse_embeddings,
    parse_rerank,
    parse_score,
)
from shuniu.core.api.responses import ResponsesStream, encode_response, parse_responses
from shuniu.core.errors import GatewayError
from shuniu.core.types import Api, Chunk, InferenceRequest, Usage

__all__ = [
    "ANTHROPIC",
    "ANTHROPIC_COUNT",
    "EMBEDDINGS",
    "OPENAI",
    "RERANK",
    "RESPONSES",
    "SCORE",
    "WIRES",
    "StreamWriter",
    "Wire",
    "wire_of",
]


class StreamWriter(Protocol):
    """One streamed answer, written as its format's events."""

    finish_reason: str | None
    """The last finish reason a chunk carried (``stop``, ``length``, ``tool_calls``)."""

    def start(self) -> bytes:
        """What goes before the first chunk (may be empty)."""
        ...

    def chunk(self, c: Chunk) -> bytes:
        """One chunk's events (may be empty)."""
        ...

    def end(self) -> bytes:
        """What ends a stream that finished."""
        ...

    def error(self, err: GatewayError) -> bytes:
        """What ends a stream that failed after its first byte."""
        ...

    def final_usage(self) -> Usage:
        """The usage of the whole answer (the engine's, else counted)."""
        ...


@dataclass(frozen=True, slots=True)
class Wire:
    """One API's requests and answers."""

    name: str
    """Its name, the value of ``InferenceRequest.wire``."""
    parse: Callable[[bytes, Api, str, float, bool], InferenceRequest]
    """``(raw, api, request_id, now, estimate)`` → the request; a 400 :class:`GatewayError`
    when bad. ``estimate=False``: a text prompt's ``prompt_tokens`` is left
    :data:`~shuniu.core.api.openai.UNCOUNTED` for the caller to count (the pooling APIs, whose
    inputs no tokenizer recounts, always estimate)."""
    completion: Callable[[InferenceRequest, Any], bytes]
    """A whole answer's JSON body (from a :class:`~shuniu.core.types.Completion`; for the pooling APIs, from
    :class:`~shuniu.core.types.Embeddings` or :class:`~shuniu.core.types.Scores`)."""
    stream: Callable[[InferenceRequest], StreamWriter]
    """A writer for a streamed answer."""
    error: Callable[[GatewayError], bytes]
    """An error's JSON body."""


OPENAI = Wire("openai", parse_request, encode_completion, StreamEncoder, GatewayError.body)
ANTHROPIC = Wire(
    "anthropic",
    lambda raw, api, request_id, now, estimate=True: parse_messages(raw, request_id, now, estimate),
    encode_message,
    MessagesStream,
    error_body,
)
ANTHROPIC_COUNT = Wire(
    "anthropic",
    lambda raw, api, request_id, now, estimate=True: parse_count(raw, request_id, now, estimate),
    encode_message,
    MessagesStream,
    error_body,
)
"""``/v1/messages/count_tokens``: Anthropic's format, a request without ``max_tokens``."""
RESPONSES = Wire(
    "responses",
    lambda raw, api, request_id, now, estimate=True: parse_responses(raw, request_id, now, estimate),
    encode_response,
    ResponsesStream,
    GatewayError.body,
)


def _not_streamed(req: InferenceRequest) -> StreamWriter:
    raise TypeError(f"the {req.api} API is never streamed")  # parsing refuses stream: true


EMBEDDINGS = Wire(
    "embeddings",
    lambda raw, api, request_id, now, estimate=True: parse_embeddings(raw, request_id, now),
    encode_embeddings,
    _not_streamed,
    GatewayError.body,
)
RERANK = Wire(
    "rerank",
    lambda raw, api, request_id, now, estimate=True: parse_rerank(raw, request_id, now),
    encode_rerank,
    _not_streamed,
    GatewayError.body,
)
SCORE = Wire(
    "score",
    lambda raw, api, request_id, now, estimate=True: parse_score(raw, request_id, now),
    encode_score,
    _not_streamed,
    GatewayError.body,
)
WIRES: MappingProxyType[str, Wire] = MappingProxyType(
    {w.name: w for w in (OPENAI, ANTHROPIC, RESPONSES, EMBEDDINGS, RERANK, SCORE)}
)
"""Every wire format by name (built in; fixed at import)."""


def wire_of(req: InferenceRequest) -> Wire:
    """The wire format ``req`` arrived in."""
    return WIRES[req.wire]
