"""Forwarding to a Text Generation Inference (TGI) server and reading its load.

Completions go to TGI's native ``/generate_stream`` (``/generate`` when not streamed), with
OpenAI's parameters mapped to TGI's (:mod:`shuniu.backends.tgi.protocol`); chat goes to
TGI's OpenAI-compatible Messages API (``/v1/chat/completions``), whose request path is the
``openai`` backend's. ``/info`` gives the context window, ``/health`` liveness and
``/metrics`` the engine's own load.

The ``text-generation`` client package (0.7.0) speaks the same protocol but is not used on
the request path: its ``AsyncClient`` opens a new aiohttp session (a new connection pool, so
a new TCP handshake) for every request, builds each request and each streamed token through
pydantic models (``.dict()`` warns on every call under pydantic 2), has no ``adapter_id``,
and turns the Messages API's error events into ``UnknownError`` with the kind lost. This
module keeps one pooled keep-alive session per endpoint (TCP_NODELAY, as aiohttp sets it),
decodes events with msgspec, and needs no extra installed (docs/backends/tgi.md).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any, ClassVar

import aiohttp
import msgspec

from shuniu.backends.http import (
    STREAM_BREAKS,
    H1Response,
    OpenAIEngine,
    OpenAIOptions,
    ProbeError,
    Prober,
    SseData,
    delta_extras,
    end_stream,
    post_json,
    post_or_raise,
    probe_headers,
    read_whole,
    stream_broken,
)
from shuniu.backends.tgi import protocol
from shuniu.backends.tgi.metrics import parse_tgi_metrics
from shuniu.backends.tgi.options import TgiOptions
from shuniu.core.contracts import GENERATION, EndpointSpec
from shuniu.core.errors import GatewayError, protocol_error, upstream_error
from shuniu.core.types import Chunk, Completion, EndpointLoad, Health, InferenceRequest, Usage

__all__ = ["TgiBackend"]

_encode = msgspec.json.Encoder().encode


class _Token(msgspec.Struct):
    text: str = ""
    special: bool = False


class _StreamDetails(msgspec.Struct):
    finish_reason: str | None = None
    generated_tokens: int | None = None
    input_length: int | None = None


class _StreamEvent(msgspec.Struct):
    # generated_text is not declared: the final event repeats the text the tokens already
    # carried, and msgspec skips undeclared fields without building them.
    token: _Token | None = None
    details: _StreamDetails | None = None
    error: Any = None
    error_type: str | None = None


class _Details(msgspec.Struct):
    finish_reason: str | None = None
    generated_tokens: int | None = None
    prefill: list[msgspec.Raw] = msgspec.field(default_factory=list)


class _Generated(msgspec.Struct):
    generated_text: str = ""
    details: _Details | None = None


class _ChatChoice(msgspec.Struct):
    delta: dict[str, Any] | None = None
    finish_reason: str | None = None


class _ChatEvent(msgspec.Struct):
    choices: list[_ChatChoice] = msgspec.field(default_factory=list)
    usage: Usage | None = None
    error: Any = None


class _ErrorBody(msgspec.Struct):
    error: Any = None
    error_type: str | None = None


_decode_event = msgspec.json.Decoder(_StreamEvent).decode
_decode_generated = msgspec.json.Decoder(_Generated).decode
_decode_chat = msgspec.json.Decoder(_ChatEvent).decode
_decode_error = msgspec.json.Decoder(_ErrorBody).decode


def _int_header(resp: aiohttp.ClientResponse, name: str) -> int | None:
    value = resp.headers.get(name)
    return int(value) if value is not None and value.isdigit() else None


class TgiBackend(OpenAIEngine):
    serves: frozenset[str] = GENERATION
    kind: ClassVar[str] = "tgi"
    discovery: ClassVar[str | None] = "GET /info"

    def __init__(self, spec: EndpointSpec) -> None:
        opts = spec.options
        assert isinstance(opts, TgiOptions)
        # The Messages API is OpenAI's chat API under /v1: the openai backend's request path
        # serves it, with "tgi" (or the adapter) as the model, since TGI reads any other
        # model name as a LoRA adapter id.
        api = OpenAIOptions(
            base_url=f"{opts.base_url}/v1",
            model=opts.adapter_id or "tgi",
            api_key=opts.api_key,
            headers=opts.headers,
            connect_timeout_s=opts.connect_timeout_s,
            timeout_s=opts.timeout_s,
            max_connections=opts.max_connections,
            http_client=opts.http_client,
        )
        super().__init__(replace(spec, options=api))
        self.tgi_options = opts
        self._adapter = opts.adapter_id
        self._send_model = opts.adapter_id or "tgi"
        root = opts.base_url
        self._generate_url = f"{root}/generate"
        self._stream_url = f"{root}/generate_stream"
        self._info_url = f"{root}/info"
        self._tokenize_urls = {"chat": f"{root}/chat_tokenize", "completions": f"{root}/tokenize"}
        self.tokenizes = True
        self._health_url = root + opts.health_path
        self._metrics_url = root + opts.metrics_path
        headers = probe_headers(opts.headers, opts.api_key)
        self.prober = Prober(lambda: self._session, headers, opts.probe_timeout_s)
        self.info: dict[str, Any] | None = None
        """TGI's ``/info`` answer once read (model id, version, limits)."""
        self.info_problem: str | None = None
        """Why ``/info`` has not been read (health reports it)."""
        self.max_input_tokens: int | None = None
        """``max_input_tokens`` from ``/info`` (``max_input_length`` before TGI 2.1)."""
        self.max_batch_total_tokens: int | None = None
        """``max_batch_total_tokens`` from ``/info`` (TGI up to 2.2; from 2.4 it is on
        ``/metrics`` as ``tgi_batch_max_total_tokens``)."""

    # -- lifecycle and probes ---------------------------------------------------------------

    # start() (the openai backend's) runs discover() once: /info, with the context window.

    def _discovery_failed(self, problem: str) -> None:
        self.info_problem = problem

    async def discover(self) -> None:
        """Read ``/info``: the context window (``max_total_tokens``, which becomes
        ``max_model_len`` unless configured), ``max_input_tokens`` and, on older servers,
        ``max_batch_total_tokens``. Raises on transport errors and non-200 answers."""
        data = await self.prober.fetch_json(self._info_url, "GET /info")
        if not isinstance(data, dict):
            raise ProbeError("GET /info: not a JSON object")

        def number(*names: str) -> int | None:
            for name in names:
                value = data.get(name)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
            return None

        self.max_input_tokens = number("max_input_tokens", "max_input_length")
        self.max_batch_total_tokens = number("max_batch_total_tokens")
        total = number("max_total_tokens")
        if self.max_model_len is None and total is not None:
            self.max_model_len = total
        self.info = data
        self.info_problem = None

    async def health(self) -> Health:
        """``/health`` answers 200 (TGI checks its model shards), and ``/info`` has been
        read (it is read here until it has)."""
        pending = self._read_info if self.info is None else None
        return await self.prober.health(self._health_url, started=self._session is not None, pending=pending)

    async def _read_info(self) -> None:
        await self.discover()

    async def load(self) -> EndpointLoad:
        """The engine's load from ``/metrics`` (see
        :func:`~shuniu.backends.tgi.metrics.parse_tgi_metrics`). Raises when the page cannot
        be read or holds no TGI series; the gateway then ages the last snapshot."""
        raw = await self.prober.fetch(self._metrics_url, f"GET {self.tgi_options.metrics_path}")
        return parse_tgi_metrics(raw, self.max_batch_total_tokens)

    # -- requests ---------------------------------------------------------------------------

    async def count_tokens(self, req: InferenceRequest) -> int | None:
        """The prompt's length from TGI's own tokenizer: ``/chat_tokenize`` (the chat
        template applied, TGI 2.2 and later) or ``/tokenize``. A server without them (404)
        answers ``None``."""
        if self._session is None:
            return None
        if req.api == "chat":
            body = req.body
            payload: dict[str, Any] = {"model": self._send_model, "messages": body["messages"]}
            if "tools" in body:
                payload["tools"] = body["tools"]
        else:
            payload = {"inputs": req.prompt}
        data = await post_json(
            self._session,
            self._tokenize_urls[req.api],
            payload,
            self._headers,
            self.tgi_options.probe_timeout_s,
        )
        if isinstance(data, dict):  # /chat_tokenize: {"tokenize_response": [...], "templated_text": ...}
            data = data.get("tokenize_response")
        return len(data) if isinstance(data, list) else None

    def _payload(self, req: InferenceRequest, stream: bool) -> bytes:
        # The openai backend's body hook, used for the Messages API (chat) only.
        body = protocol.chat_body(req)
        body["model"] = self._send_model
        if stream:
            body["stream"] = True
            # Always ask for usage (TGI's prompt length comes only with it); the gateway
            # strips it from the client's stream unless the client asked too.
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        return _encode(body)

    def _generate_payload(self, req: InferenceRequest) -> bytes:
        return _encode({"inputs": req.prompt, "parameters": protocol.generate_parameters(req, self._adapter)})

    def _error(self, status: int, raw: bytes) -> GatewayError:
        """A non-200 answer: TGI's ``{"error", "error_type"}`` body, or (from axum, which
        rejects a body before TGI sees it, or a proxy) plain text."""
        message = raw[:500].decode("utf-8", "replace").strip() or f"HTTP {status}"
        error_type = None
        try:
            body = _decode_error(raw)
        except msgspec.DecodeError:
            pass
        else:
            if isinstance(body.error, str):
                message, error_type = body.error, body.error_type
            elif isinstance(body.error, dict) and isinstance(body.error.get("message"), str):
                message = body.error["message"]
        return protocol.tgi_error(self.name, message, error_type, status)

    async def _open(
        self, url: str, payload: bytes, req: InferenceRequest
    ) -> aiohttp.ClientResponse | H1Response:
        return await post_or_raise(
            self._client, url, payload, self._request_headers(req), self.name, self._error
        )

    async def complete(self, req: InferenceRequest) -> Completion:
        if req.api == "chat":
            result = await super().complete(req)
            result.finish_reason = protocol.finish_reason(result.finish_reason)
            return result
        protocol.check_completion(req)
        resp = await self._open(self._generate_url, self._generate_payload(req), req)
        raw = await read_whole(resp, self.name)
        try:
            body = _decode_generated(raw)
        except msgspec.DecodeError:
            raise protocol_error(f"The engine endpoint {self.name} sent a malformed response.") from None
        details = body.details
        completion = details.generated_tokens if details is not None else None
        if completion is None:
            completion = _int_header(resp, "x-generated-tokens") or 0
        # TGI sends the prompt length as a header on /generate; its details list the prompt
        # tokens only when decoder_input_details is asked for (costly, so it is not).
        prompt = _int_header(resp, "x-prompt-tokens")
        if prompt is None:
            prompt = len(details.prefill) if details is not None and details.prefill else req.prompt_tokens
        finish = protocol.finish_reason(details.finish_reason if details is not None else None)
        return Completion(body.generated_text, finish, Usage(prompt, completion, prompt + completion))

    def stream(self, req: InferenceRequest) -> AsyncIterator[Chunk]:  # type: ignore[override]
        return self._stream_chat(req) if req.api == "chat" else self._stream_generate(req)

    async def _stream_generate(self, req: InferenceRequest) -> AsyncIterator[Chunk]:
        """``/generate_stream``: one event per token, the last with ``details`` (finish
        reason, token counts), or an error event. TGI answers 200 before it validates, so
        validation and overload errors arrive as the first event; the gateway has sent
        nothing yet then, and the client gets an ordinary HTTP error."""
        protocol.check_completion(req)
        resp = await self._open(self._stream_url, self._generate_payload(req), req)
        done = False
        try:
            async for data in SseData(resp.content):
                if done:
                    continue  # nothing follows the final event; read to the end regardless
                try:
                    event = _decode_event(data)
                except msgspec.DecodeError:
                    raise protocol_error(f"The engine endpoint {self.name} sent a malformed event.") from None
                if event.error is not None:
                    raise protocol.tgi_error(self.name, str(event.error), event.error_type)
                token = event.token
                special = token is None or token.special
                text = "" if special or token is None else token.text
                details = event.details
                if details is None:
                    if not special:
                        yield Chunk(text, 1)
                    continue
                done = True
                generated = details.generated_tokens or 0
                prompt = details.input_length if details.input_length is not None else req.prompt_tokens
                yield Chunk(
                    text,
                    0 if special else 1,
                    protocol.finish_reason(details.finish_reason),
                    Usage(prompt, generated, prompt + generated),
                )
            if not done:
                raise upstream_error(
                    f"The engine endpoint {self.name} ended the stream before its last token."
                )
        except STREAM_BREAKS as exc:
            raise stream_broken(self.name, exc) from None
        finally:
            # Dropping the connection is how TGI learns the client went away: it stops
            # generating and counts the request as dropped.
            end_stream(resp, done)

    async def _stream_chat(self, req: InferenceRequest) -> AsyncIterator[Chunk]:
        """The Messages API stream: OpenAI chunks, a usage chunk, ``[DONE]``. TGI reports
        every error, before or after the first token, as an event
        ``{"error": {"message", "http_status_code": 422}}`` (the status is 422 whatever
        the error), so the kind is read from the message."""
        resp = await self._post(req, stream=True)
        done = False
        try:
            async for data in SseData(resp.content):
                if done:
                    continue
                if data == b"[DONE]":
                    done = True
                    continue
                try:
                    event = _decode_chat(data)
                except msgspec.DecodeError:
                    raise protocol_error(f"The engine endpoint {self.name} sent a malformed event.") from None
                if event.error is not None:
                    err = event.error
                    message = err.get("message") if isinstance(err, dict) else err
                    raise protocol.tgi_error(self.name, str(message or err), None)
                if not event.choices:
                    if event.usage is not None:
                        yield Chunk(usage=event.usage)
                    continue
                choice = event.choices[0]
                delta = choice.delta or {}
                text = delta.get("content") or ""
                extra = delta_extras(delta)
                finish = protocol.finish_reason(choice.finish_reason)
                if text or extra or finish is not None or event.usage is not None:
                    yield Chunk(text, 1 if text else 0, finish, event.usage, extra)
            if not done:
                raise upstream_error(f"The engine endpoint {self.name} ended the stream before [DONE].")
        except STREAM_BREAKS as exc:
            raise stream_broken(self.name, exc) from None
        finally:
            end_stream(resp, done)
