"""The OpenAI-protocol engine client every OpenAI-compatible backend builds on: chat,
completions, embeddings and rerank (``/embeddings``, and ``/rerank`` and ``/score`` as vLLM
serves them) over one pooled keep-alive session, the client's body forwarded as sent (with
``model`` rewritten, so fields shuniu does not know reach engines that do), usage always
asked for, the engine's errors mapped, SSE events of any size.

``openai`` registers it as it is; ``vllm``, ``trtllm`` (``trtllm-serve``), ``tgi`` (its
Messages API) and ``ascend`` subclass it and change the body (:meth:`OpenAIEngine._payload`),
the error mapping (:meth:`OpenAIEngine._error`), and what they read beside the OpenAI API
(:meth:`OpenAIEngine.discover`, ``health``, ``load``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

import aiohttp
import msgspec

from shuniu.backends.http.errors import (
    PROBE_ERRORS,
    STREAM_BREAKS,
    ProbeError,
    describe_error,
    openai_error,
    post_or_raise,
    read_whole,
    stream_broken,
)
from shuniu.backends.http.h1 import H1Pool, H1Response
from shuniu.backends.http.options import OpenAIOptions, server_root
from shuniu.backends.http.passthrough import RawEvents
from shuniu.backends.http.session import end_stream, open_session, post_json
from shuniu.backends.http.sse import LineSplitter, data_payload
from shuniu.core.contracts import BackendBase, EndpointSpec
from shuniu.core.errors import GatewayError, protocol_error, upstream_error
from shuniu.core.types import Chunk, Completion, Embeddings, Health, InferenceRequest, Scores, Usage

__all__ = ["EventStream", "OpenAIEngine", "delta_extras"]

_encode = msgspec.json.Encoder().encode


class _Choice(msgspec.Struct):
    delta: dict[str, Any] | None = None
    message: dict[str, Any] | None = None
    text: str | None = None
    finish_reason: str | None = None


class _Details(msgspec.Struct):
    cached_tokens: int | None = None


class _EngineUsage(msgspec.Struct):
    """``usage`` as OpenAI-compatible engines write it (vLLM adds ``prompt_tokens_details``
    with ``--enable-prompt-tokens-details``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: _Details | None = None

    def usage(self) -> Usage:
        details = self.prompt_tokens_details
        cached = details.cached_tokens if details is not None else None
        return Usage(self.prompt_tokens, self.completion_tokens, self.total_tokens, cached)


class _Body(msgspec.Struct):
    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: _EngineUsage | None = None
    error: dict[str, Any] | None = None


_decode_body = msgspec.json.Decoder(_Body).decode


class _FloatVector(msgspec.Struct):
    index: int
    embedding: msgspec.Raw
    """Kept as the engine's JSON: written to the client as it came."""


class _Base64Vector(msgspec.Struct):
    index: int
    embedding: str


class _Vectors(msgspec.Struct):
    data: list[_FloatVector]
    usage: _EngineUsage | None = None


class _Base64Vectors(msgspec.Struct):
    data: list[_Base64Vector]
    usage: _EngineUsage | None = None


class _Ranked(msgspec.Struct):
    index: int
    relevance_score: float


class _RankUsage(msgspec.Struct):
    prompt_tokens: int | None = None
    total_tokens: int | None = None


class _Ranking(msgspec.Struct):
    results: list[_Ranked]
    usage: _RankUsage | None = None


class _Scored(msgspec.Struct):
    index: int
    score: float


class _ScoreList(msgspec.Struct):
    data: list[_Scored]
    usage: _RankUsage | None = None


_DECODERS: dict[str, Any] = {
    "float": msgspec.json.Decoder(_Vectors).decode,
    "base64": msgspec.json.Decoder(_Base64Vectors).decode,
    "rerank": msgspec.json.Decoder(_Ranking).decode,
    "score": msgspec.json.Decoder(_ScoreList).decode,
}
_RANK_FIELDS = frozenset({"query", "documents", "top_n", "return_documents", "text_1", "text_2"})
_DROP = frozenset({"role", "content"})
_DONE = b"[DONE]"


def delta_extras(fields: dict[str, Any] | None) -> dict[str, Any] | None:
    """The fields of a chat message or delta beyond its role and content (``tool_calls``,
    ``reasoning_content``), passed through to the client; ``None`` when there are none."""
    if not fields or fields.keys() <= _DROP:
        return None  # the common delta: content (and a role) only
    out = {k: v for k, v in fields.items() if k not in _DROP and v is not None and v != []}
    return out or None


class OpenAIEngine(BackendBase):
    """An OpenAI-compatible server (subclasses set ``kind``)."""

    kind: ClassVar[str] = "openai"
    serves: frozenset[str] = frozenset({"chat", "completions", "embeddings", "rerank"})
    discovery: ClassVar[str | None] = None
    """What :meth:`discover` reads from the engine at start-up, for problem messages (e.g.
    ``"GET /v1/models"``); ``None``: the backend has no discovery step. Subclasses that set
    it implement :meth:`discover` and :meth:`_discovery_failed`."""

    def __init__(self, spec: EndpointSpec) -> None:
        assert isinstance(spec.options, OpenAIOptions)
        self.name = spec.name
        self.options = spec.options
        self.max_model_len = spec.max_model_len
        self._upstream_model = spec.options.model
        self._public_model = spec.model
        self._headers = {"content-type": "application/json", **spec.options.headers}
        if spec.options.api_key:
            self._headers["authorization"] = f"Bearer {spec.options.api_key}"
        base = spec.options.base_url
        self._urls = {
            "chat": f"{base}/chat/completions",
            "completions": f"{base}/completions",
            "embeddings": f"{base}/embeddings",
            "rerank": f"{base}/rerank",
            "score": f"{base}/score",
        }
        path = spec.options.tokenize_path
        self._tokenize_url = server_root(base) + path if path is not None else None
        self.tokenizes = path is not None
        self._session: aiohttp.ClientSession | None = None
        self._client: aiohttp.ClientSession | H1Pool | None = None
        """What the engine calls on the request path go through (the session, or a lean pool)."""
        self._discovered = False

    async def start(self) -> None:
        opts = self.options
        self._session = open_session(
            max_connections=opts.max_connections,
            timeout_s=opts.timeout_s,
            connect_timeout_s=opts.connect_timeout_s,
        )
        self._client = self._session
        if opts.http_client == "shuniu" and opts.base_url.startswith("http://"):
            self._client = H1Pool(
                opts.base_url,
                max_connections=opts.max_connections,
                timeout_s=opts.timeout_s,
                connect_timeout_s=opts.connect_timeout_s,
            )
        # A server that is not up yet is not an error: health checks keep the endpoint out of
        # balancing, and backends with a discovery step repeat it once the server answers.
        self._discovered = False
        if self.max_model_len is None:
            self.max_model_len = await self._probe_max_model_len()
        if self.discovery is not None and not self._discovered:
            await self._discover_quietly()

    async def discover(self) -> None:
        """Read what the engine says about itself (see :attr:`discovery`). Raises on transport
        errors and unusable answers (:class:`ProbeError`)."""
        raise NotImplementedError

    def _discovery_failed(self, problem: str) -> None:
        """Keep a failed discovery's reason where the backend's health check reads it."""
        raise NotImplementedError

    async def _discover_quietly(self) -> None:
        self._discovered = True
        try:
            await self.discover()
        except ProbeError as exc:
            self._discovery_failed(str(exc))
        except PROBE_ERRORS as exc:
            self._discovery_failed(f"{self.discovery}: {describe_error(exc)}")

    async def stop(self) -> None:
        if isinstance(self._client, H1Pool):
            await self._client.close()
        self._client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _probe_max_model_len(self) -> int | None:
        """vLLM and others report ``max_model_len`` in ``/v1/models``; use it if present.
        A backend with a discovery step reads it there instead."""
        if self.discovery is not None:
            await self._discover_quietly()
            return self.max_model_len
        try:
            data = await self._get_json(self.options.health_path, limit_s=2.0)
        except Exception:
            return None
        entries = [
            e
            for e in (data.get("data", []) if isinstance(data, dict) else [])
            if isinstance(e, dict) and isinstance(e.get("max_model_len"), int)
        ]
        wanted = self._upstream_model or self._public_model
        for entry in entries:
            if entry.get("id") == wanted:
                return int(entry["max_model_len"])
        # With one model upstream, that is the one this endpoint serves.
        return int(entries[0]["max_model_len"]) if len(entries) == 1 else None

    async def _get_json(self, path: str, limit_s: float) -> Any:
        assert self._session is not None
        async with self._session.get(
            self.options.base_url + path,
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=limit_s),
        ) as resp:
            resp.raise_for_status()
            return msgspec.json.decode(await resp.read())

    async def health(self) -> Health:
        if self._session is None:
            return Health(False, "not started")
        try:
            async with self._session.get(
                self.options.base_url + self.options.health_path,
                headers=self._headers,
                timeout=aiohttp.ClientTimeout(total=self.options.connect_timeout_s),
            ) as resp:
                await resp.read()
                return Health(200 <= resp.status < 300, f"HTTP {resp.status}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            return Health(False, f"{type(exc).__name__}: {exc}")

    def _model_name(self) -> str:
        """The model name the engine knows this endpoint's model by."""
        return self._upstream_model or self._public_model

    async def count_tokens(self, req: InferenceRequest) -> int | None:
        """The prompt's length from a vLLM-style ``/tokenize`` (``tokenize_path``): chat
        messages with the engine's template and the generation prompt, or the completion
        prompt with special tokens, as the engine itself counts them."""
        if self._tokenize_url is None or self._session is None:
            return None
        body = req.body
        model = self._model_name()
        payload: dict[str, Any]
        if req.api == "chat":
            payload = {
                "model": model,
                "messages": body["messages"],
                "add_generation_prompt": body.get("add_generation_prompt", True),
            }
            for key in ("tools", "chat_template_kwargs", "continue_final_message"):
                if key in body:
                    payload[key] = body[key]
        else:
            payload = {"model": model, "prompt": req.prompt}
        data = await post_json(
            self._session, self._tokenize_url, payload, self._headers, self.options.connect_timeout_s
        )
        if isinstance(data, dict):
            count = data.get("count")
            if type(count) is int:
                return count
            tokens = data.get("tokens")
            if isinstance(tokens, list):
                return len(tokens)
        return None

    def _payload(self, req: InferenceRequest, stream: bool) -> bytes:
        body = dict(req.body)
        if self._upstream_model is not None:
            body["model"] = self._upstream_model
        if stream:
            body["stream"] = True
            # Always ask for usage so the gateway can account tokens; it is stripped from the
            # client's stream unless the client asked for it too.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return _encode(body)

    def _error(self, status: int, raw: bytes) -> GatewayError:
        """A non-200 answer as the gateway's error (subclasses read their engine's body)."""
        return openai_error(self.name, status, raw)

    def _request_headers(self, req: InferenceRequest) -> dict[str, str]:
        """The headers of an engine call: the endpoint's, plus the request's trace context."""
        return self._headers if req.trace_headers is None else {**self._headers, **req.trace_headers}

    async def _post(self, req: InferenceRequest, stream: bool) -> aiohttp.ClientResponse | H1Response:
        return await post_or_raise(
            self._client,
            self._urls[req.api],
            self._payload(req, stream),
            self._request_headers(req),
            self.name,
            self._error,
        )

    async def complete(self, req: InferenceRequest) -> Completion:
        resp = await self._post(req, stream=False)
        raw = await read_whole(resp, self.name)
        try:
            body = _decode_body(raw)
        except msgspec.DecodeError:
            raise protocol_error(f"The engine endpoint {self.name} sent a malformed response.") from None
        if not body.choices:
            raise upstream_error(f"The engine endpoint {self.name} sent no choices.")
        choice = body.choices[0]
        if req.api == "chat":
            message = choice.message or {}
            text = message.get("content") or ""
            extra = delta_extras(message)
        else:
            text, extra = choice.text or "", None
        usage = (
            body.usage.usage() if body.usage is not None else Usage(req.prompt_tokens, 0, req.prompt_tokens)
        )
        return Completion(text, choice.finish_reason, usage, extra)

    async def _pooled(self, req: InferenceRequest, route: str, payload: dict[str, Any], decoder: str) -> Any:
        """POST a pooling request and decode the answer (502 when it is not what was asked)."""
        if self._upstream_model is not None:
            payload["model"] = self._upstream_model
        resp = await post_or_raise(
            self._client,
            self._urls[route],
            _encode(payload),
            self._request_headers(req),
            self.name,
            self._error,
        )
        raw = await read_whole(resp, self.name)
        try:
            return _DECODERS[decoder](raw)
        except msgspec.DecodeError:
            raise protocol_error(
                f"The engine endpoint {self.name} sent a malformed {route} response."
            ) from None

    async def embed(self, req: InferenceRequest) -> Embeddings:
        """``POST /embeddings`` with the client's body (its inputs, ``dimensions``,
        ``encoding_format`` and the engine's own fields, such as vLLM's
        ``truncate_prompt_tokens``)."""
        job = req.pooling
        assert job is not None
        body = await self._pooled(req, "embeddings", dict(req.body), job.encoding_format)
        items = sorted(body.data, key=lambda item: item.index)
        tokens = body.usage.prompt_tokens if body.usage is not None else sum(job.tokens)
        return Embeddings([item.embedding for item in items], tokens)

    async def score(self, req: InferenceRequest) -> Scores:
        """``POST /rerank`` with one query (every document scored: ``top_n`` is the number
        of documents), or vLLM's ``POST /score`` for pairs of queries and documents."""
        job = req.pooling
        assert job is not None and job.texts is not None
        payload = {k: v for k, v in req.body.items() if k not in _RANK_FIELDS}
        scores = [0.0] * len(job.texts)
        if len(job.queries) == 1:
            payload.update(query=job.queries[0], documents=job.texts, top_n=len(job.texts))
            ranking = await self._pooled(req, "rerank", payload, "rerank")
            for item in ranking.results:
                if 0 <= item.index < len(scores):
                    scores[item.index] = item.relevance_score
            usage = ranking.usage
            count = len(ranking.results)
        else:
            payload.update(text_1=job.queries, text_2=job.texts)
            listed = await self._pooled(req, "score", payload, "score")
            for scored in listed.data:
                if 0 <= scored.index < len(scores):
                    scores[scored.index] = scored.score
            usage = listed.usage
            count = len(listed.data)
        if count != len(scores):
            raise upstream_error(
                f"The engine endpoint {self.name} scored {count} of {len(scores)} documents."
            )
        tokens = None if usage is None else usage.prompt_tokens or usage.total_tokens
        return Scores(scores, tokens if tokens is not None else sum(job.tokens))

    def _event_chunk(self, payload: bytes, chat: bool) -> Chunk | None:
        """One SSE event's JSON (an OpenAI chunk) as a :class:`Chunk`; ``None`` for an event
        that carries nothing; raises for a malformed event or an error event."""
        try:
            body = _decode_body(payload)
        except msgspec.DecodeError:
            raise protocol_error(f"The engine endpoint {self.name} sent a malformed event.") from None
        if body.error is not None:
            raise upstream_error(
                f"The engine endpoint {self.name} failed: {body.error.get('message', body.error)}"
            )
        if not body.choices:
            return Chunk(usage=body.usage.usage()) if body.usage is not None else None
        choice = body.choices[0]
        if chat:
            delta = choice.delta or {}
            text = delta.get("content") or ""
            extra = delta_extras(delta)
        else:
            text, extra = choice.text or "", None
        usage = body.usage.usage() if body.usage is not None else None
        if text or extra or choice.finish_reason is not None or usage is not None:
            return Chunk(text, 1 if text else 0, choice.finish_reason, usage, extra)
        return None

    def stream(self, req: InferenceRequest) -> EventStream:
        return EventStream(self, req)


class EventStream:
    """One streamed answer of an OpenAI-compatible engine as :class:`Chunk` objects.

    Every network read is split into lines and turned into chunks at once, so
    :meth:`ready` can tell the gateway's delivery that the next chunk is already here:
    events that arrived together leave in one write to the client, as they came. A plain
    class rather than an async generator: no generator frame per chunk, and closing it half-way
    (:meth:`aclose`) closes the engine connection, which is how the engine learns the client
    went away.
    """

    __slots__ = (
        "_chat",
        "_chunks",
        "_done",
        "_engine",
        "_failure",
        "_over",
        "_raw",
        "_req",
        "_resp",
        "_split",
    )

    def __init__(self, engine: OpenAIEngine, req: InferenceRequest) -> None:
        self._engine = engine
        self._req = req
        self._chat = req.api == "chat"
        self._raw = RawEvents(self._chat) if req.raw_events else None
        """Ordinary content deltas forwarded as the engine wrote them, when the request allows."""
        self._resp: aiohttp.ClientResponse | H1Response | None = None
        self._split = LineSplitter()
        self._chunks: deque[Chunk] = deque()
        self._done = False
        """``[DONE]`` was read: nothing after it counts."""
        self._failure: BaseException | None = None
        """What ends the stream once the chunks before it are taken."""
        self._over = False
        """The engine connection was let go."""

    def __aiter__(self) -> EventStream:
        return self

    def ready(self) -> bool:
        """Whether the next :meth:`__anext__` answers without waiting for the network (a
        chunk, the end, or the error that ends the stream)."""
        return bool(self._chunks) or self._done or self._failure is not None

    async def __anext__(self) -> Chunk:
        chunks = self._chunks
        if chunks:
            return chunks.popleft()
        try:
            while True:
                if self._failure is not None:
                    raise self._failure
                if self._done:
                    if self._resp is not None:
                        await self._resp.read()  # the end of the chunked body: the connection is reusable
                        self._release(complete=True)
                    raise StopAsyncIteration
                resp = self._resp
                if resp is None:
                    resp = self._resp = await self._engine._post(self._req, stream=True)
                block = await resp.content.readany()
                if block:
                    self._parse(self._split.feed(block))
                else:
                    last = self._split.end()
                    if last is not None:
                        self._parse([last])
                    if not self._done and self._failure is None:
                        # The body ended without [DONE]: the engine stopped mid-answer (a crash,
                        # a proxy cutting the connection). Say so rather than end as if complete.
                        self._failure = upstream_error(
                            f"The engine endpoint {self._engine.name} ended the stream without [DONE]."
                        )
                if chunks:
                    return chunks.popleft()
        except STREAM_BREAKS as exc:
            self._release(complete=False)
            raise stream_broken(self._engine.name, exc) from None
        except BaseException:
            self._release(complete=False)
            raise

    def _parse(self, lines: list[bytes]) -> None:
        """The chunks of complete lines, up to ``[DONE]`` or the first bad event."""
        event_chunk = self._engine._event_chunk
        chat = self._chat
        append = self._chunks.append
        raw_line = self._raw.take_line if self._raw is not None else None
        raw = self._raw.take if self._raw is not None else None
        for line in lines:
            if not line:
                continue  # the blank line after each event
            if raw_line is not None:
                chunk = raw_line(line)
                if chunk is not None:
                    append(chunk)
                    continue
            payload = data_payload(line)
            if payload is None:
                continue  # comments, other SSE fields, the blank lines between events
            if payload == _DONE:
                self._done = True
                return
            if raw is not None:
                chunk = raw(payload)
                if chunk is not None:
                    append(chunk)
                    continue
            try:
                chunk = event_chunk(payload, chat)
            except GatewayError as exc:
                self._failure = exc
                return
            if chunk is not None:
                append(chunk)

    def _release(self, complete: bool) -> None:
        if not self._over and self._resp is not None:
            self._over = True
            end_stream(self._resp, complete)

    async def aclose(self) -> None:
        """Stop reading: an unfinished answer's connection is closed (the engine aborts)."""
        self._release(complete=False)
