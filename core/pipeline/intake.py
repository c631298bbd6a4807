"""Intake: the request as it arrives. Header size, the body (read only after the
credential was checked), parsing it into an :class:`~shuniu.core.types.InferenceRequest`,
the gateway's size limits, and the shuniu headers (a deadline, identity headers on a
gateway that trusts them, the client's trace context passed through).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shuniu.core.api.wire import Wire
from shuniu.core.config import GatewayConfig
from shuniu.core.errors import GatewayError
from shuniu.core.http.asgi import Receive, Scope, read_body
from shuniu.core.types import Api, InferenceRequest, Principal

__all__ = ["Intake"]

_INF = float("inf")


class Intake:
    """Reads, parses and checks requests against the gateway's limits."""

    __slots__ = ("_max_body", "_max_header_bytes", "_max_messages", "_max_prompt_tokens", "_pass_trace")

    def __init__(self, cfg: GatewayConfig, *, pass_trace: bool) -> None:
        """``pass_trace``: the gateway makes no spans of its own, so the client's trace
        context goes to the engine unchanged."""
        self._max_body = cfg.max_body_bytes
        self._max_header_bytes = cfg.max_header_bytes
        self._max_messages = cfg.max_messages
        self._max_prompt_tokens = cfg.max_prompt_tokens
        self._pass_trace = pass_trace

    def check_headers(self, headers: Any) -> None:
        """431 when the request's headers are larger than the gateway accepts."""
        size = 0
        for key, value in headers:
            size += len(key) + len(value) + 4
        if size > self._max_header_bytes:
            raise GatewayError(
                431,
                f"The request headers are larger than this gateway accepts ({self._max_header_bytes} bytes).",
                code="headers_too_large",
            )

    async def read(
        self,
        api: Api,
        wire: Wire,
        scope: Scope,
        receive: Receive,
        request_id: str,
        arrival: float,
        estimate: bool = True,
        header_map: Mapping[bytes, bytes] | None = None,
    ) -> InferenceRequest:
        """The body, parsed in ``wire``'s format: 413 too large, 400 malformed.
        ``estimate=False``: a text prompt's count is left to the caller (``Wire.parse``).
        ``header_map``: the request's headers by name, when the caller has made it."""
        raw = await read_body(scope, receive, self._max_body, header_map)
        return wire.parse(raw, api, request_id, arrival, estimate)

    def check_size(self, req: InferenceRequest) -> None:
        """400 when the request has more messages or prompt tokens than the gateway takes."""
        if req.api == "chat":
            count = len(req.body["messages"])
            if count > self._max_messages:
                raise GatewayError(
                    400,
                    f"The request has {count} messages; this gateway accepts at most {self._max_messages}.",
                    param="messages",
                    code="too_many_messages",
                )
        limit = self._max_prompt_tokens
        if limit is not None and req.prompt_tokens > limit:
            raise GatewayError(
                400,
                f"The prompt is about {req.prompt_tokens} tokens; this gateway accepts at most {limit}.",
                param="messages" if req.api == "chat" else "prompt" if req.api == "completions" else "input",
                code="prompt_too_long",
            )

    def apply_headers(
        self,
        req: InferenceRequest,
        headers: Any,
        arrival: float,
        identity: bool,
        header_map: dict[bytes, bytes] | None = None,
    ) -> None:
        """Read the shuniu headers into ``req``: ``x-shuniu-deadline-ms`` (400 when it is not
        a positive number), ``x-shuniu-tenant``/``x-shuniu-tier`` when ``identity`` (the
        deployment trusts them), and the client's ``traceparent``/``tracestate``.
        ``header_map``: the same headers by name (:func:`~shuniu.core.http.asgi.header_map`),
        kept on ``req`` for every later look-up."""
        req.headers = headers
        req.header_map = header_map
        if self._pass_trace:
            parent = req.header(b"traceparent")
            if parent is not None:
                state = req.header(b"tracestate")
                req.trace_headers = {"traceparent": parent.decode("latin-1")}
                if state is not None:
                    req.trace_headers["tracestate"] = state.decode("latin-1")
        deadline = req.header(b"x-shuniu-deadline-ms")
        if deadline is not None:
            try:
                budget_ms = float(deadline)
            except ValueError:
                budget_ms = -1.0
            if not budget_ms > 0 or budget_ms == _INF:
                raise GatewayError(
                    400,
                    "Header x-shuniu-deadline-ms must be a positive number of milliseconds.",
                    param="x-shuniu-deadline-ms",
                    code="invalid_value",
                )
            req.deadline = arrival + budget_ms / 1000.0
        if identity:
            tenant = req.header(b"x-shuniu-tenant")
            tier = req.header(b"x-shuniu-tier")
            if tenant is not None or tier is not None:
                req.principal = Principal(
                    tenant=tenant.decode("latin-1") if tenant else "anonymous",
                    tier=tier.decode("latin-1") if tier else "default",
                )
