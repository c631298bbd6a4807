"""Serving through Triton Inference Server's generate extension, in front of a TensorRT-LLM
model repository (``ensemble`` / ``tensorrt_llm_bls`` of the inflight-batcher repository,
or the LLM-API ``tensorrt_llm`` model).

Triton's generate endpoint takes text and returns text: the backend maps the OpenAI
request onto the model's inputs (``max_tokens``, ``temperature``, ``stop_words`` ...),
renders chat messages with the configured template, and maps the answer back. What
Triton does not return is estimated, and the docs say so: token counts (unless the model
returns ``num_input_tokens``/``num_output_tokens``) and the finish reason (unless the model
returns ``finish_reason``, as the LLM-API model does).

``generate_stream`` sends ``data: {json}`` events and ends with the HTTP body (there is no
``[DONE]``); an error after the first event arrives as ``data: {"error": "..."}``, which
raises so that the gateway ends the client's stream with an SSE error event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar, Literal
from urllib.parse import quote

import aiohttp
import msgspec

from shuniu.backends.http import (
    PROBE_ERRORS,
    STREAM_BREAKS,
    ProbeError,
    Prober,
    SseLines,
    data_payload,
    describe_error,
    end_stream,
    open_session,
    post_or_raise,
    probe_headers,
    read_whole,
    short_body,
    stream_broken,
)
from shuniu.backends.trtllm.metrics import parse_triton_metrics
from shuniu.backends.trtllm.options import ChatTemplate, TrtllmOptions
from shuniu.core.contracts import BackendBase, EndpointSpec
from shuniu.core.errors import GatewayError, bad_request, protocol_error, upstream_error
from shuniu.core.tokens import count_tokens
from shuniu.core.types import Chunk, Completion, EndpointLoad, Health, InferenceRequest, Usage

__all__ = ["StopTrimmer", "TritonBackend", "render_chat"]

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode

_UNSUPPORTED = ("tools", "functions", "response_format", "logprobs", "top_logprobs", "logit_bias", "echo")
"""OpenAI fields with no counterpart in Triton's generate inputs: refused rather than
silently ignored."""


def _flatten(content: Any, i: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise bad_request(
                "Only text content parts can be sent to this model (Triton's generate endpoint takes text).",
                f"messages[{i}].content[{j}]",
                "unsupported_value",
            )
    return "".join(texts)


def render_chat(template: ChatTemplate, messages: list[Any]) -> str:
    """The prompt text of ``messages`` under ``template``."""
    parts = [template.prefix]
    for i, msg in enumerate(messages):
        role = str(msg.get("role", "")) if isinstance(msg, dict) else ""
        content = _flatten(msg.get("content") if isinstance(msg, dict) else None, i)
        shape = template.roles.get(role, template.message)
        parts.append(shape.replace("{role}", role).replace("{content}", content))
    parts.append(template.generation_prompt)
    return "".join(parts)


class StopTrimmer:
    """OpenAI stop semantics on streamed text: TensorRT-LLM stops on a stop word but keeps
    it in the output; OpenAI leaves it out. Text that may be the start of a stop string is
    held back until the next piece decides."""

    __slots__ = ("_held", "_stops", "stopped")

    def __init__(self, stops: list[str]) -> None:
        self._stops = [s for s in stops if s]
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """The part of ``text`` that can be sent now."""
        if self.stopped or not text:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        cut = min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(buf)), 0, -1):
                if buf.endswith(s[:n]):
                    keep = max(keep, n)
                    break
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """What is still held at the end of the output."""
        held, self._held = self._held, ""
        return "" if self.stopped else held


class _Prepared(msgspec.Struct):
    payload: bytes
    prompt: str
    max_tokens: int
    stops: list[str]


class TritonBackend(BackendBase):
    kind: ClassVar[str] = "trtllm"

    def __init__(self, spec: EndpointSpec) -> None:
        opts = spec.options
        assert isinstance(opts, TrtllmOptions)
        self.name = spec.name
        self.options = opts
        self.max_model_len = spec.max_model_len
        model = quote(opts.triton_model, safe="")
        root = f"{opts.base_url}/v2/models/{model}"
        self._urls = {True: f"{root}/generate_stream", False: f"{root}/generate"}
        self._metadata_url = root
        self._model_ready_url = f"{root}/ready"
        self._health_url = opts.health_url
        self._metrics_url = opts.prometheus_url
        self._headers = {"content-type": "application/json", **opts.headers}
        if opts.api_key:
            self._headers["authorization"] = f"Bearer {opts.api_key}"
        self._session: aiohttp.ClientSession | None = None
        headers = probe_headers(opts.headers, opts.api_key)
        self.prober = Prober(lambda: self._session, headers, opts.probe_timeout_s)
        self.inputs: frozenset[str] | None = None
        """The model's input names, once its metadata was read."""
        self.schema: Literal["ensemble", "llmapi"] = (
            "ensemble" if opts.triton_inputs == "auto" else opts.triton_inputs
        )
        self.metadata_problem: str | None = None
        """Why the model's metadata could not be read (``triton_inputs: auto`` waits for it)."""

    # -- lifecycle and probes ---------------------------------------------------------------

    async def start(self) -> None:
        opts = self.options
        self._session = open_session(
            max_connections=opts.max_connections,
            timeout_s=opts.timeout_s,
            connect_timeout_s=opts.connect_timeout_s,
        )
        try:
            await self.read_metadata()
        except ProbeError as exc:
            self.metadata_problem = str(exc)
        except PROBE_ERRORS as exc:
            self.metadata_problem = f"GET /v2/models/{opts.triton_model}: {describe_error(exc)}"

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def read_metadata(self) -> None:
        """Read the model's metadata (``GET /v2/models/{model}``): its input names, which
        settle ``triton_inputs: auto`` and which optional inputs are sent."""
        status, raw = await self.prober.get(self._metadata_url)
        if status != 200:
            raise ProbeError(f"GET /v2/models/{self.options.triton_model}: HTTP {status}: {_error_text(raw)}")
        data = _decode(raw)
        inputs = data.get("inputs") if isinstance(data, dict) else None
        names = frozenset(
            i["name"] for i in inputs or () if isinstance(i, dict) and isinstance(i.get("name"), str)
        )
        if not names:
            raise ProbeError(f"the metadata of {self.options.triton_model!r} lists no inputs")
        self.inputs = names
        if self.options.triton_inputs == "auto":
            self.schema = "llmapi" if "sampling_param_max_tokens" in names else "ensemble"
        self.metadata_problem = None

    async def health(self) -> Health:
        """Triton is ready (``/v2/health/ready``), the model is ready
        (``/v2/models/{model}/ready``), and, with ``triton_inputs: auto``, its metadata
        has been read."""
        if self._session is None:
            return Health(False, "not started")
        model = self.options.triton_model
        try:
            status, body = await self.prober.get(self._health_url)
            if status != 200:
                text = _error_text(body)
                return Health(False, f"server not ready: HTTP {status}" + (f": {text}" if text else ""))
            status, body = await self.prober.get(self._model_ready_url)
            if status != 200:
                text = _error_text(body)
                detail = f"model {model} not ready: HTTP {status}"
                return Health(False, f"{detail}: {text}" if text else detail)
            if self.inputs is None and self.options.triton_inputs == "auto":
                await self.read_metadata()
        except ProbeError as exc:
            self.metadata_problem = str(exc)
            return Health(False, str(exc))
        except PROBE_ERRORS as exc:
            return Health(False, describe_error(exc))
        return Health(True, f"model {model} ready")

    async def load(self) -> EndpointLoad | None:
        """The load from Triton's metrics port (``load_from: prometheus``), or ``None``
        (``none``). Raises when the page cannot be read or has no TensorRT-LLM series."""
        if self.options.load_source == "none":
            return None
        raw = await self.prober.fetch(self._metrics_url, f"GET {self._metrics_url}")
        return parse_triton_metrics(raw, self.options.metrics_model)

    # -- requests ---------------------------------------------------------------------------

    def _has(self, name: str) -> bool:
        """Whether the model takes input ``name`` (assumed so until its metadata is read:
        the current repositories declare every input sent here)."""
        return self.inputs is None or name in self.inputs

    def prepare(self, req: InferenceRequest, stream: bool) -> _Prepared:
        """The generate request for ``req``; raises 400 for what Triton cannot do."""
        body = req.body
        opts = self.options
        for name in _UNSUPPORTED:
            value = body.get(name)
            if value in (None, False) or (name == "response_format" and value == {"type": "text"}):
                continue  # absent, off, or plain text (what the model gives anyway)
            raise bad_request(
                f"'{name}' is not supported by this model (served through Triton's generate endpoint).",
                name,
                "unsupported_parameter",
            )
        stops = list(req.stop)
        if req.api == "chat":
            template = opts.chat_template
            if template is None:
                raise bad_request(
                    "This model takes completions only: it is served through Triton's generate "
                    "endpoint, which takes raw text, and no chat template is configured for it "
                    "(options.chat_template).",
                    "messages",
                    "unsupported_api",
                )
            prompt = render_chat(template, body.get("messages") or [])
            stops += [s for s in template.stop if s not in stops]
        else:
            p = body.get("prompt")
            if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):
                p = p[0]
            if not isinstance(p, str):
                raise bad_request(
                    "This model takes a text prompt: Triton's generate endpoint does not take token ids.",
                    "prompt",
                    "unsupported_value",
                )
            prompt = p
        max_tokens = req.max_tokens or opts.default_max_tokens
        fields = self._inputs_llmapi if self.schema == "llmapi" else self._inputs_ensemble
        payload = fields(req, prompt, max_tokens, stops, stream)
        return _Prepared(_encode(payload), prompt, max_tokens, stops)

    def _inputs_ensemble(
        self, req: InferenceRequest, prompt: str, max_tokens: int, stops: list[str], stream: bool
    ) -> dict[str, Any]:
        body = req.body
        out: dict[str, Any] = {"text_input": prompt, "max_tokens": max_tokens, "stream": stream}
        if self._has("exclude_input_in_output"):
            out["exclude_input_in_output"] = True
        for name in ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty"):
            value = body.get(name)
            if value is not None and self._has(name):
                out[name] = value
        if body.get("repetition_penalty") is not None and self._has("repetition_penalty"):
            out["repetition_penalty"] = body["repetition_penalty"]
        if req.seed is not None:
            # "seed" in current repositories, "random_seed" before.
            out["seed" if self._has("seed") or not self._has("random_seed") else "random_seed"] = req.seed
        min_tokens = max_tokens if req.ignore_eos else body.get("min_tokens")
        if isinstance(min_tokens, int) and min_tokens > 0:
            # TensorRT-LLM has no ignore_eos; a minimum length equal to the maximum has the
            # same effect (what Triton's own benchmark client does).
            out["min_tokens" if self._has("min_tokens") or not self._has("min_length") else "min_length"] = (
                min_tokens
            )
        if stops:
            out["stop_words"] = stops
        if self.inputs is not None:
            # Exact token counts, where the model can return them (declared inputs only:
            # Triton rejects an input a model does not declare).
            for name in ("return_num_input_tokens", "return_num_output_tokens"):
                if name in self.inputs:
                    out[name] = True
        return out

    def _inputs_llmapi(
        self, req: InferenceRequest, prompt: str, max_tokens: int, stops: list[str], stream: bool
    ) -> dict[str, Any]:
        body = req.body
        if req.ignore_eos:
            raise bad_request(
                "'ignore_eos' is not supported by this model (TensorRT-LLM's LLM-API model in Triton).",
                "ignore_eos",
                "unsupported_parameter",
            )
        out: dict[str, Any] = {
            "text_input": prompt,
            "streaming": stream,
            "sampling_param_max_tokens": max_tokens,
            "sampling_param_exclude_input_from_output": True,
            "return_finish_reason": True,
        }
        for name in ("temperature", "top_p", "top_k", "presence_penalty", "frequency_penalty"):
            value = body.get(name)
            if value is not None:
                out[f"sampling_param_{name}"] = value
        if req.seed is not None:
            out["sampling_param_seed"] = req.seed
        if stops:
            out["sampling_param_stop"] = stops
        return {k: v for k, v in out.items() if self._has(k)}

    async def _post(self, stream: bool, payload: bytes, req: InferenceRequest) -> aiohttp.ClientResponse:
        headers = self._headers if req.trace_headers is None else {**self._headers, **req.trace_headers}
        url = self._urls[stream]
        return await post_or_raise(self._session, url, payload, headers, self.name, self._error)

    def _error(self, status: int, raw: bytes) -> GatewayError:
        message = _error_text(raw) or f"HTTP {status}"
        if status == 400:
            # Triton's invalid-argument errors: a bad value the client sent, as Triton saw it
            # (an input this model does not declare reads the same way).
            return GatewayError(400, message, param=None, code="invalid_value")
        return upstream_error(f"The engine endpoint {self.name} answered HTTP {status}: {message}")

    def _finish(self, reason: Any, stopped: bool, out_tokens: int, max_tokens: int) -> str:
        if isinstance(reason, list):
            reason = reason[0] if reason else None
        if isinstance(reason, str) and reason:
            return reason  # the LLM-API model's own: stop, length, timeout, cancelled
        if stopped:
            return "stop"
        return "length" if out_tokens >= max_tokens else "stop"

    async def stream(self, req: InferenceRequest) -> AsyncIterator[Chunk]:  # type: ignore[override]
        prep = self.prepare(req, stream=True)
        resp = await self._post(True, prep.payload, req)
        trim = StopTrimmer(prep.stops)
        accumulate = self.options.accumulate_tokens
        seen = ""  # the whole text so far (accumulate_tokens)
        sent_tokens = 0
        exact_out: int | None = None
        exact_in: int | None = None
        reason: Any = None
        complete = False
        try:
            async for line in SseLines(resp.content):
                data = data_payload(line)
                if not data:
                    continue
                try:
                    event = _decode(data)
                except msgspec.DecodeError:
                    raise protocol_error(f"The engine endpoint {self.name} sent a malformed event.") from None
                if not isinstance(event, dict):
                    continue
                if "error" in event:
                    raise upstream_error(f"The engine endpoint {self.name} failed: {event['error']}")
                text = _text(event.get("text_output"))
                if accumulate:
                    text, seen = (text[len(seen) :] if text.startswith(seen) else text), text
                n_out, n_in = _count(event.get("num_output_tokens")), _count(event.get("num_input_tokens"))
                if n_out is not None:
                    exact_out = (exact_out or 0) + n_out
                if n_in is not None:
                    exact_in = n_in
                if event.get("finish_reason") is not None:
                    reason = event["finish_reason"]
                piece = trim.feed(text)
                if piece:
                    n = count_tokens(piece)
                    sent_tokens += n
                    yield Chunk(piece, n)
            complete = True
            tail = trim.flush()
            if tail:
                n = count_tokens(tail)
                sent_tokens += n
                yield Chunk(tail, n)
            out = exact_out if exact_out is not None else sent_tokens
            prompt_tokens = exact_in if exact_in is not None else count_tokens(prep.prompt)
            finish = self._finish(reason, trim.stopped, out, prep.max_tokens)
            yield Chunk(finish_reason=finish, usage=Usage(prompt_tokens, out, prompt_tokens + out))
        except STREAM_BREAKS as exc:
            raise stream_broken(self.name, exc) from None
        finally:
            # Dropping an unfinished stream's connection makes Triton cancel the request.
            end_stream(resp, complete)

    async def complete(self, req: InferenceRequest) -> Completion:
        prep = self.prepare(req, stream=False)
        resp = await self._post(False, prep.payload, req)
        raw = await read_whole(resp, self.name)
        try:
            body = _decode(raw)
        except msgspec.DecodeError:
            raise protocol_error(f"The engine endpoint {self.name} sent a malformed response.") from None
        if not isinstance(body, dict) or "text_output" not in body:
            detail = body.get("error") if isinstance(body, dict) else None
            raise upstream_error(
                f"The engine endpoint {self.name} sent no text_output" + (f": {detail}" if detail else ".")
            )
        text = _text(body["text_output"])
        if not self._has("exclude_input_in_output") and text.startswith(prep.prompt):
            text = text[len(prep.prompt) :]  # an old ensemble echoes the prompt
        trim = StopTrimmer(prep.stops)
        text = trim.feed(text) + trim.flush()
        exact_out, exact_in = _count(body.get("num_output_tokens")), _count(body.get("num_input_tokens"))
        out = exact_out if exact_out is not None else count_tokens(text)
        prompt_tokens = exact_in if exact_in is not None else count_tokens(prep.prompt)
        finish = self._finish(body.get("finish_reason"), trim.stopped, out, prep.max_tokens)
        return Completion(text, finish, Usage(prompt_tokens, out, prompt_tokens + out))


def _text(value: Any) -> str:
    # A one-element output tensor arrives as a scalar, a longer one as an array.
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(v for v in value if isinstance(v, str))
    return ""


def _count(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if len(value) == 1 else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error_text(raw: bytes) -> str:
    """The message of Triton's ``{"error": "..."}`` body, or the start of the body."""
    try:
        data = _decode(raw)
    except msgspec.DecodeError:
        return short_body(raw)
    if isinstance(data, dict) and isinstance(data.get("error"), str):
        return str(data["error"])
    return short_body(raw)
