"""TGI's wire protocol as the ``tgi`` backend speaks it: OpenAI request fields mapped to
TGI's ``/generate_stream`` parameters, the body sent to its Messages API, finish reasons, and
TGI's error bodies and events mapped to the gateway's errors.

Pure functions on plain data (no I/O), so every mapping is tested without a server. The
field names and rules follow TGI's published OpenAPI document (``docs/openapi.json``) and
its router (``router/src/validation.rs``, ``server.rs``, ``infer/mod.rs``), v3.3.
"""

from __future__ import annotations

from typing import Any

from shuniu.core.errors import GatewayError, bad_request, upstream_error
from shuniu.core.types import InferenceRequest

__all__ = [
    "FINISH_REASONS",
    "chat_body",
    "check_completion",
    "classify_message",
    "finish_reason",
    "generate_parameters",
    "tgi_error",
]

FINISH_REASONS: dict[str, str] = {"length": "length", "eos_token": "stop", "stop_sequence": "stop"}
"""TGI's ``details.finish_reason`` values as OpenAI's ``finish_reason``."""

# OpenAI completion fields TGI's /generate has nothing for. They are refused rather than
# dropped: each changes what the client gets back, so silently ignoring one would hand the
# client a different answer than it asked for.
_UNSUPPORTED = (
    ("suffix", "TGI has no insertion (suffix) mode"),
    ("echo", "TGI's streaming API cannot echo the prompt"),
    ("logprobs", "log probabilities of completions are not forwarded by this backend"),
    ("best_of", "TGI cannot stream best_of sequences"),
)

# The Display strings of TGI's InferError (router/src/infer/mod.rs), which is all a Messages
# API stream error event says about its kind: the event's http_status_code is 422 whatever
# the error was.
_MESSAGE_KINDS = (
    ("Input validation error", "validation"),
    ("Model is overloaded", "overloaded"),
    ("Request failed during generation", "generation"),
    ("Incomplete generation stream", "incomplete_generation_stream"),
    ("Incomplete generation", "incomplete_generation"),
    ("Template error", "template_error"),
    ("Missing template vatiable", "missing_template_variable"),  # sic, as TGI spells it
    ("Tool error", "tool_error"),
)
# error_types that are the client's mistake (TGI answers 422): the gateway says 400.
_CLIENT_KINDS = frozenset(
    {
        "validation",
        "template_error",
        "missing_template_variable",
        "tool_error",
        "suffix not supported",
        "batch size exceeded",
    }
)
# ValidationError texts (router/src/validation.rs) that mean the prompt and max_tokens do
# not fit the context window: OpenAI clients look for this code.
_TOO_LONG = ("`inputs` tokens + `max_new_tokens` must be <=", "`inputs` must have less than")


def finish_reason(reason: str | None) -> str | None:
    """TGI's finish reason (``length``, ``eos_token``, ``stop_sequence``; the Messages API
    already says ``stop``) as OpenAI's."""
    if reason is None:
        return None
    return FINISH_REASONS.get(reason, reason)


def check_completion(req: InferenceRequest) -> None:
    """Refuse (400) what a completion request asks for that TGI cannot do: prompts given as
    token ids (TGI tokenizes text itself and takes no ids) and the fields in
    ``_UNSUPPORTED``."""
    prompt = req.body.get("prompt")
    if req.token_ids is not None or (isinstance(prompt, list) and prompt and not isinstance(prompt[0], str)):
        raise bad_request(
            "This model is served by Text Generation Inference, which takes the prompt as text "
            "only; send 'prompt' as a string instead of token ids.",
            "prompt",
            "unsupported_value",
        )
    body = req.body
    for field, why in _UNSUPPORTED:
        value = body.get(field)
        if value is None or value is False or value == "" or (field == "best_of" and value == 1):
            continue
        if field == "logprobs" and value == 0:
            continue
        raise bad_request(
            f"'{field}' is not supported by this model's engine ({why}).", field, "unsupported_value"
        )


def generate_parameters(req: InferenceRequest, adapter_id: str | None = None) -> dict[str, Any]:
    """The ``parameters`` object of a ``/generate_stream`` (or ``/generate``) request.

    - ``max_tokens`` → ``max_new_tokens``; absent stays absent (TGI then generates until
      EOS or the context window is full, as its own ``/v1/completions`` does).
    - ``stop`` → ``stop`` (the wire name; the ``text-generation`` client calls it
      ``stop_sequences``).
    - ``temperature``: 0 → ``do_sample: false`` (greedy; TGI rejects a temperature of 0),
      otherwise ``do_sample: true`` and the temperature if given (OpenAI samples at 1 by
      default, TGI would decode greedily without ``do_sample``).
    - ``top_p`` below 1 passes; 1 (no nucleus filtering, OpenAI's default) is left out
      because TGI rejects ``top_p >= 1``.
    - ``seed``, ``frequency_penalty`` pass; the vLLM-style extras ``repetition_penalty`` and
      ``top_k`` (when above 0) pass too, under the same names.
    - ``details: true`` always: the final event then carries the token counts.
    """
    body = req.body
    params: dict[str, Any] = {"details": True}
    if req.max_tokens is not None:
        params["max_new_tokens"] = req.max_tokens
    if req.stop:
        params["stop"] = req.stop
    temperature = body.get("temperature")
    if temperature == 0:
        params["do_sample"] = False
    else:
        params["do_sample"] = True
        if temperature is not None:
            params["temperature"] = temperature
    top_p = body.get("top_p")
    if top_p is not None and top_p < 1:
        params["top_p"] = top_p
    if req.seed is not None:
        params["seed"] = req.seed
    for name in ("frequency_penalty", "repetition_penalty"):
        value = body.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            params[name] = value
    top_k = body.get("top_k")
    if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > 0:
        params["top_k"] = top_k
    if adapter_id is not None:
        params["adapter_id"] = adapter_id
    return params


def chat_body(req: InferenceRequest) -> dict[str, Any]:
    """The client's chat body as TGI's Messages API takes it (a shallow copy; ``model`` and
    ``stream_options`` are set by the caller):

    - ``stop`` as a list (OpenAI also takes a string, TGI only a list);
    - ``top_p`` of 1 or more left out (TGI rejects ``top_p >= 1``; 1 is OpenAI's default);
    - ``max_completion_tokens`` sent as ``max_tokens`` (TGI takes either name, but refuses
      a body with both);
    - ``logit_bias`` left out (TGI ignores it and expects a list where OpenAI sends a map).

    Everything else (``tools``, ``response_format``, ``logprobs`` ...) is forwarded as sent.
    """
    body = dict(req.body)
    if "stop" in body:
        if req.stop:
            body["stop"] = req.stop
        else:
            del body["stop"]
    top_p = body.get("top_p")
    if isinstance(top_p, int | float) and top_p >= 1:
        del body["top_p"]
    if "max_completion_tokens" in body:
        del body["max_completion_tokens"]
        if req.max_tokens is not None:
            body["max_tokens"] = req.max_tokens
    body.pop("logit_bias", None)
    return body


def classify_message(message: str) -> str | None:
    """The ``error_type`` of a TGI error known only by its message (Messages API events)."""
    for prefix, kind in _MESSAGE_KINDS:
        if message.startswith(prefix):
            return kind
    return None


def tgi_error(endpoint: str, message: str, error_type: str | None, status: int | None = None) -> GatewayError:
    """A TGI error (``{"error": ..., "error_type": ...}`` with its HTTP status, or an error
    event in a stream) as the error the gateway sends.

    - ``validation`` and TGI's other client errors (422): 400 with TGI's own message; the
      code is ``context_length_exceeded`` when the prompt and ``max_tokens`` do not fit the
      context window, else the ``error_type``.
    - ``overloaded`` (429: TGI's ``--max-concurrent-requests`` is reached): 503 with
      ``Retry-After: 1``, code ``upstream_overloaded``; the engine is busy, nothing is wrong
      with the request, and another try (or another endpoint) may succeed.
    - ``generation`` (424), ``incomplete_generation`` (500) and anything else: 502
      ``upstream_error``.
    """
    kind = error_type or classify_message(message)
    if kind is None and status == 429:
        kind = "overloaded"
    if kind is None and status == 422:
        # A 422 without TGI's error body is axum rejecting the JSON body (a field of the
        # wrong type): the client's request, as forwarded.
        kind = "validation"
    if kind in _CLIENT_KINDS:
        code = kind.replace(" ", "_")
        param = None
        if _TOO_LONG[0] in message:
            code, param = "context_length_exceeded", "max_tokens"
        elif _TOO_LONG[1] in message:
            code = "context_length_exceeded"
        return GatewayError(400, message, param=param, code=code)
    if kind == "overloaded":
        return GatewayError(
            503,
            f"The engine endpoint {endpoint} is overloaded ({message}); try again shortly.",
            type="server_error",
            code="upstream_overloaded",
            headers={"retry-after": "1"},
        )
    where = f"HTTP {status}" if status is not None else "an error event"
    return upstream_error(f"The engine endpoint {endpoint} failed ({where}): {message}")
