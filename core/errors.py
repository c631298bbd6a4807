"""Errors a client can cause or see, rendered as OpenAI-style JSON.

Every error that leaves the gateway goes through :class:`GatewayError`, so clients always
get ``{"error": {"message", "type", "param", "code"}}`` with a meaningful status, and never
a traceback.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "PROTOCOL_ERROR",
    "ConfigError",
    "GatewayError",
    "Problem",
    "bad_request",
    "context_too_long",
    "method_not_allowed",
    "model_not_found",
    "no_healthy_endpoint",
    "not_found",
    "payload_too_large",
    "protocol_error",
    "unsupported_modality",
    "upstream_error",
]


class _ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class _Envelope(msgspec.Struct):
    error: _ErrorBody


_encode = msgspec.json.Encoder().encode


class GatewayError(Exception):
    """An error with an HTTP status, rendered as an OpenAI error object."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        return _encode(_Envelope(_ErrorBody(self.message, self.type, self.param, self.code)))

    def sse_event(self) -> bytes:
        """The error as an SSE event, for failures after the first streamed byte."""
        return b"data: " + self.body() + b"\n\n"


def unsupported_modality(model: str, pool: str, missing: list[str], accepts: list[str]) -> GatewayError:
    """A request with input (images, audio, ...) that the model serving it does not take."""
    served = f"`{model}`" if model == pool else f"`{model}` (served by `{pool}`)"
    takes = ", ".join(["text", *accepts])
    return GatewayError(
        400,
        f"Model {served} does not take {' or '.join(missing)} input (it takes {takes}); send "
        "text only, or use a model that does.",
        param="messages",
        code="unsupported_modality",
    )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def not_found(path: str) -> GatewayError:
    return GatewayError(404, f"No route for {path}.", code="not_found")


def method_not_allowed(method: str, path: str) -> GatewayError:
    return GatewayError(405, f"Method {method} is not allowed on {path}.", code="method_not_allowed")


def model_not_found(model: str) -> GatewayError:
    return GatewayError(
        404,
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def payload_too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"Request body is larger than this gateway accepts ({limit} bytes).",
        code="request_too_large",
    )


def context_too_long(max_model_len: int, prompt: int, completion: int) -> GatewayError:
    return GatewayError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, you "
        f"requested {prompt + completion} tokens ({prompt} in the prompt, {completion} in the "
        "completion). Please reduce the length of the prompt or of max_tokens.",
        param="max_tokens",
        code="context_length_exceeded",
    )


def input_too_long(max_model_len: int, index: int, tokens: int, param: str) -> GatewayError:
    """An embeddings input (or a rerank pair) longer than the pooling model's context."""
    return GatewayError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, {param}[{index}] "
        f"has about {tokens} tokens. Please shorten it, or ask the engine to truncate.",
        param=f"{param}[{index}]",
        code="context_length_exceeded",
    )


_ROUTES = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "rerank": "/v1/rerank",
    "score": "/v1/score",
}


def api_not_served(model: str, pool: str, api: str, serves: list[str], others: list[str]) -> GatewayError:
    """A request for an API (embeddings, chat, rerank) the model does not serve."""
    served = f"`{model}`" if model == pool else f"`{model}` (served by `{pool}`)"
    where = f"; models that do: {', '.join(others)}" if others else "; no model of this gateway does"
    return GatewayError(
        400,
        f"Model {served} does not serve {api} ({_ROUTES.get(api, api)}); it serves "
        f"{', '.join(serves)}{where}.",
        param="model",
        code="model_not_supported",
    )


def no_healthy_endpoint(model: str) -> GatewayError:
    return GatewayError(
        503,
        f"No healthy endpoint is serving `{model}` right now; try again shortly.",
        type="server_error",
        code="no_healthy_endpoint",
        headers={"retry-after": "1"},
    )


def upstream_error(message: str, status: int = 502) -> GatewayError:
    return GatewayError(status, message, type="server_error", code="upstream_error")


PROTOCOL_ERROR = "upstream_protocol_error"
"""The code of an engine answer the gateway cannot read (a malformed or oversized event)."""


def protocol_error(message: str) -> GatewayError:
    """A 502 for an engine answer that breaks the protocol (malformed JSON, an event larger
    than the gateway reads). It is the answer's fault, not the endpoint's health: it is not
    retried elsewhere and not counted toward ejecting the endpoint."""
    return GatewayError(502, message, type="server_error", code=PROTOCOL_ERROR)


class Problem(msgspec.Struct, frozen=True):
    """One problem found in a deployment file."""

    path: str
    """Dotted field path, e.g. ``models.chat.endpoints[0].kind``."""
    message: str
    line: int | None = None
    """1-based line in the YAML file, when the parser knows it."""

    def __str__(self) -> str:
        where = f"{self.path or '<root>'}"
        if self.line is not None:
            where += f" (line {self.line})"
        return f"{where}: {self.message}"


class ConfigError(Exception):
    """A deployment file (or plugin set-up) that cannot be used, with every problem found.

    Subclasses for other kinds of input (workloads, profiles) only change :attr:`what`.
    """

    what = "deployment"
    """What kind of input the problems are in, for the message."""

    def __init__(self, problems: list[Problem], source: str | None = None) -> None:
        self.problems = problems
        self.source = source
        head = f"{source}: " if source else ""
        lines = "\n".join(f"  - {p}" for p in problems)
        what = "plugin set-up" if source == "plugins" else self.what
        super().__init__(f"{head}{len(problems)} problem(s) in the {what}:\n{lines}")
