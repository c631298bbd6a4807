"""OpenTelemetry tracing of the request path.

One ``SERVER`` span per inference request (named ``"{operation} {model}"`` as OpenTelemetry's
GenAI conventions ask, e.g. ``chat llama``), with child spans for the steps that take
time — ``shuniu.auth``, ``shuniu.rate_limit``, ``shuniu.cache``, ``shuniu.queue`` (waiting for
the scheduler and picking an endpoint; the pick is an event on it) and ``shuniu.upstream``
(a ``CLIENT`` span around the engine call, whose context goes to the engine in a W3C
``traceparent`` header). Attributes follow the GenAI semantic conventions
(``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.usage.input_tokens``,
``gen_ai.response.finish_reasons``, ...).

**Zero cost when off.** Tracing is on only when the deployment configures an exporter
(``gateway.tracing``) or the process already has an SDK tracer provider (e.g. started
under ``opentelemetry-instrument``). Otherwise no tracer exists, the request path takes no
tracing branch, and a client's ``traceparent`` is passed to the engine unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from shuniu.core.config import TracingConfig
from shuniu.core.errors import GatewayError
from shuniu.core.extras import require

if TYPE_CHECKING:
    from shuniu.core.types import InferenceRequest, RequestRecord

__all__ = ["RequestTrace", "Tracing", "setup_tracing", "traced"]

T = TypeVar("T")

_TRACEPARENT = b"traceparent"
_TRACESTATE = b"tracestate"


class Tracing:
    """The tracer of one gateway and what it needs to start request spans."""

    def __init__(self, tracer: Any, provider: Any | None) -> None:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self.provider = provider
        """The SDK provider shuniu created (shut down with the gateway), or ``None``."""
        self._propagator = TraceContextTextMapPropagator()
        self._kind_server = trace.SpanKind.SERVER
        self._kind_client = trace.SpanKind.CLIENT
        self._kind_internal = trace.SpanKind.INTERNAL
        self._set_span_in_context = trace.set_span_in_context
        self._status_error = trace.Status(trace.StatusCode.ERROR)

    def start(self, api: str, headers: Any, arrival_ns: int) -> RequestTrace:
        """The root span of a request, continuing the client's trace when it sent one."""
        carrier: dict[str, str] = {}
        for key, value in headers:
            if key == _TRACEPARENT or key == _TRACESTATE:
                carrier[key.decode()] = value.decode("latin-1")
        parent = self._propagator.extract(carrier) if carrier else None
        operation = "chat" if api == "chat" else "text_completion"
        span = self.tracer.start_span(
            operation,
            context=parent,
            kind=self._kind_server,
            start_time=arrival_ns,
            attributes={"gen_ai.operation.name": operation},
        )
        return RequestTrace(self, span, operation)

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


class RequestTrace:
    """The spans of one request."""

    __slots__ = ("_open", "operation", "root", "tracing")

    def __init__(self, tracing: Tracing, root: Any, operation: str) -> None:
        self.tracing = tracing
        self.root = root
        self.operation = operation
        self._open: Any = None

    def child(self, name: str, kind: Any = None, start_ns: int | None = None) -> Any:
        """Start a child span of the root (end it with ``span.end()``)."""
        t = self.tracing
        return t.tracer.start_span(
            name,
            context=t._set_span_in_context(self.root),
            kind=kind if kind is not None else t._kind_internal,
            start_time=start_ns,
        )

    def request(self, req: InferenceRequest) -> None:
        """Name the root span after the model and record the request's parameters."""
        root = self.root
        root.update_name(f"{self.operation} {req.model}")
        attrs: dict[str, Any] = {"gen_ai.request.model": req.model, "shuniu.request_id": req.id}
        body = req.body
        if req.max_tokens is not None:
            attrs["gen_ai.request.max_tokens"] = req.max_tokens
        for key, attr in (("temperature", "gen_ai.request.temperature"), ("top_p", "gen_ai.request.top_p")):
            value = body.get(key)
            if isinstance(value, int | float):
                attrs[attr] = value
        if req.seed is not None:
            attrs["gen_ai.request.seed"] = req.seed
        attrs["shuniu.tenant"] = req.principal.tenant
        attrs["shuniu.tier"] = req.principal.tier
        root.set_attributes(attrs)

    def upstream(self, req: InferenceRequest, endpoint: str) -> Any:
        """The engine call's span; its context travels to the engine in ``traceparent``."""
        span = self.child("shuniu.upstream", kind=self.tracing._kind_client)
        span.set_attribute("shuniu.endpoint", endpoint)
        carrier: dict[str, str] = {}
        self.tracing._propagator.inject(carrier, context=self.tracing._set_span_in_context(span))
        req.trace_headers = carrier
        return span

    def finish(self, record: RequestRecord, finish_reason: str | None = None) -> None:
        root = self.root
        attrs: dict[str, Any] = {
            "http.response.status_code": record.status,
            "gen_ai.usage.input_tokens": record.prompt_tokens,
            "gen_ai.usage.output_tokens": record.completion_tokens,
            "shuniu.outcome": record.outcome.value,
            "shuniu.cached": record.cached,
        }
        if record.pool is not None:
            attrs["gen_ai.response.model"] = record.pool
        if record.endpoint is not None:
            attrs["shuniu.endpoint"] = record.endpoint
        if finish_reason is not None:
            attrs["gen_ai.response.finish_reasons"] = (finish_reason,)
        if record.error_code is not None:
            attrs["error.type"] = record.error_code
        root.set_attributes(attrs)
        if record.status >= 500:
            root.set_status(self.tracing._status_error)
        root.end()

    def fail(self, span: Any, code: str | None) -> None:
        if code is not None:
            span.set_attribute("error.type", code)
        span.set_status(self.tracing._status_error)


def setup_tracing(config: TracingConfig | None) -> Tracing | None:
    """The gateway's tracing, or ``None`` (off: nothing configured, no SDK in the process)."""
    if config is None or config.exporter == "auto":
        try:
            from opentelemetry import trace
        except ImportError:
            return None
        provider = trace.get_tracer_provider()
        # The API's default provider is a proxy to a no-op one until an SDK is installed.
        if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider"):
            return None
        return Tracing(provider.get_tracer("shuniu"), None)
    if config.exporter == "none":
        return None
    require("opentelemetry.sdk", "otel", "Tracing (gateway.tracing)")
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio

    provider = TracerProvider(
        resource=Resource.create({"service.name": config.service_name}),
        sampler=ParentBasedTraceIdRatio(config.sample_ratio),
    )
    if config.exporter == "otlp":
        require("opentelemetry.exporter.otlp.proto.http", "otel", "The OTLP trace exporter")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter: Any = OTLPSpanExporter(endpoint=config.endpoint, timeout=config.timeout_s)
    else:
        exporter = ConsoleSpanExporter()
    # Spans are exported from a background thread in batches: the request path only
    # appends to a queue.
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider.get_tracer("shuniu"), provider)


def now_ns() -> int:
    return time.time_ns()


async def traced(trace: RequestTrace, name: str, step: Awaitable[T]) -> T:
    """Await ``step`` inside a child span ``name`` of the request's trace; a refusal
    (:class:`~shuniu.core.errors.GatewayError`) marks the span failed with its code."""
    span = trace.child(name)
    try:
        return await step
    except GatewayError as err:
        trace.fail(span, err.code)
        raise
    finally:
        span.end()
