"""OpenTelemetry tracing through a real gateway process: spans exported over OTLP/HTTP to a
stub collector, the client's trace continued, and the context passed on to the engine."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from shuniu.plugins.auth.api_keys import hash_key, new_key
from tests.conftest import wait_until
from tests.otlp_collector import CollectorStub
from tests.test_openai_backend import ScriptedUpstream

pytest.importorskip("opentelemetry.sdk", reason="tracing tests need shuniu[otel]")

KEY = new_key()
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"


def _headers(upstream: ScriptedUpstream) -> dict[str, str]:
    """The last request's headers, names lower-cased."""
    return {k.lower(): v for k, v in upstream.headers[-1].items()}


@pytest.fixture
def collector() -> Iterator[CollectorStub]:
    c = CollectorStub().start()
    yield c
    c.stop()


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    up = ScriptedUpstream().start()
    yield up
    up.stop()


def _deployment(collector: CollectorStub | None, port: int) -> str:
    tracing = (
        f"tracing: {{exporter: otlp, endpoint: '{collector.endpoint}', service_name: shuniu-test}}"
        if collector is not None
        else "max_messages: 100"
    )
    return f"""
gateway:
  {tracing}
tiers:
  t: {{key_limits: {{rpm: 100}}}}
auth:
  authenticators:
    - kind: api_keys
      options:
        keys: [{{id: k, hash: "{hash_key(KEY)}", tenant: acme, tier: t}}]
cache: {{store: memory}}
models:
  chat:
    health: {{interval_s: 0.1}}
    endpoints:
      - kind: openai
        options: {{base_url: "http://127.0.0.1:{port}/v1", model: up-model}}
"""


def test_one_trace_per_request_with_child_spans_and_genai_attributes(
    gateway_factory, collector: CollectorStub, upstream: ScriptedUpstream
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deployment(collector, upstream.port))
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    chunks = list(
        client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=20,
            temperature=0.5,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers={"traceparent": traceparent},
        )
    )
    usage = chunks[-1].usage
    assert usage is not None
    roots = wait_until(lambda: [s for s in collector.spans if s.name == "chat chat"], timeout=15)
    root = roots[0]
    # The client's trace continues: same trace id, its span is the parent.
    assert root.trace_id == CLIENT_TRACE and root.parent_span_id == CLIENT_SPAN
    assert root.kind == 2  # SERVER
    a = root.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "chat"
    assert a["gen_ai.request.max_tokens"] == 20 and a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.usage.input_tokens"] == usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == usage.completion_tokens
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["http.response.status_code"] == 200 and a["shuniu.tenant"] == "acme"
    children = wait_until(
        lambda: (
            {s.name: s for s in collector.spans if s.trace_id == CLIENT_TRACE and s is not root}
            if len([s for s in collector.spans if s.trace_id == CLIENT_TRACE]) >= 6
            else None
        ),
        timeout=15,
    )
    assert set(children) == {
        "shuniu.auth",
        "shuniu.rate_limit",
        "shuniu.cache",
        "shuniu.queue",
        "shuniu.upstream",
    }
    for child in children.values():
        assert child.parent_span_id == root.span_id
        assert root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns
    assert "endpoint picked" in children["shuniu.queue"].events
    upstream_span = children["shuniu.upstream"]
    assert upstream_span.kind == 3  # CLIENT
    # The engine received the upstream span's context.
    sent = _headers(upstream)["traceparent"]
    assert sent == f"00-{CLIENT_TRACE}-{upstream_span.span_id}-01"


def test_refused_requests_are_traced_with_their_error(
    gateway_factory, collector: CollectorStub, upstream: ScriptedUpstream
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deployment(collector, upstream.port))
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.base_url, api_key="wrong", max_retries=0).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "x"}]
        )
    with pytest.raises(openai.BadRequestError):
        openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0).chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "bad-request"}]
        )
    spans = wait_until(lambda: collector.spans if len(collector.spans) >= 8 else None, timeout=15)
    auth = [s for s in spans if s.name == "shuniu.auth" and s.attributes.get("error.type")]
    assert auth and auth[0].attributes["error.type"] == "invalid_api_key" and auth[0].status_code == 2
    roots = [s for s in spans if s.attributes.get("http.response.status_code") == 400]
    assert roots and roots[0].name == "chat chat"


def test_without_tracing_the_client_traceparent_reaches_the_engine(
    gateway_factory, upstream: ScriptedUpstream
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_deployment(None, upstream.port))
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0).chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hi"}],
        extra_headers={"traceparent": traceparent, "tracestate": "k=v"},
    )
    assert _headers(upstream)["traceparent"] == traceparent
    assert _headers(upstream)["tracestate"] == "k=v"
    # And no header when the client sent none.
    openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi again"}]
    )
    assert "traceparent" not in _headers(upstream)
