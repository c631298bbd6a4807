"""Property-based fuzzing of every public route, from the gateway's own OpenAPI document
(``/openapi.json``), with schemathesis: bodies that follow the schema and bodies that break
it (wrong types, missing fields, odd strings, deep nesting), against a real ``shuniu serve``
over HTTP. Every answer must be below 500, and every error a JSON body in its API's shape
(OpenAI's; Anthropic's on ``/v1/messages``: both carry ``error.message`` and ``error.type``).

Bounded for CI: ``SHUNIU_FUZZ_EXAMPLES`` examples per route and generation mode (default 150);
the last test asserts how many cases ran and prints the count.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from shuniu.core.api.openapi import openapi_document
from tests.conftest import GatewayProcess, start_gateway

EXAMPLES = int(os.environ.get("SHUNIU_FUZZ_EXAMPLES", "150"))
DEPLOYMENT = """
gateway:
  readiness_details: public
  max_body_bytes: 65536
models:
  tiny:
    aliases: [tiny-alias]
    max_model_len: 4096
    endpoints:
      - kind: sim
        replicas: 2
        options: {ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 1, output_tokens_max: 8}
  vec:
    serves: [embeddings, rerank]
    max_model_len: 4096
    endpoints:
      - {kind: sim, options: {ttft_ms: 0, embedding_dim: 8}}
"""
RAN: dict[str, int] = {}
ROUTES_WITHOUT_JSON_ERRORS = frozenset({"/metrics"})


@pytest.fixture(scope="module")
def fuzz_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(DEPLOYMENT, tmp_path_factory.mktemp("fuzz"))
    yield gw
    gw.stop()


OPERATIONS = [(method.upper(), path) for path, item in openapi_document()["paths"].items() for method in item]
# Negative data (bodies that break the schema) only where there is a body to break.
CASES = [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS] + [
    (m, p, GenerationMode.NEGATIVE) for m, p in OPERATIONS if m == "POST"
]


def _check(case: Any, response: Any) -> None:
    assert response.status_code < 500, (
        f"{case.method} {case.path}: {response.status_code} {response.text[:200]}"
    )
    if response.status_code >= 400 and case.path not in ROUTES_WITHOUT_JSON_ERRORS:
        error = json.loads(response.content)["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)


@pytest.mark.parametrize(("method", "path", "mode"), CASES, ids=[f"{m} {p} {g.value}" for m, p, g in CASES])
def test_every_route_answers_below_500_with_openai_errors(
    fuzz_gateway: GatewayProcess, method: str, path: str, mode: GenerationMode
) -> None:
    schema = schemathesis.openapi.from_url(f"{fuzz_gateway.url}/openapi.json")
    operation = schema[path][method]

    @given(case=operation.as_strategy(mode))
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(case: Any) -> None:
        response = case.call(base_url=fuzz_gateway.url, timeout=30)
        _check(case, response)
        RAN[path] = RAN.get(path, 0) + 1

    run()


@pytest.mark.parametrize(
    "body",
    [
        b"{" * 200_000,
        b'{"model": "tiny", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400}',
        b'{"model": "tiny", "messages": [{"role": "user", "content": {"a": '
        + b"[" * 70
        + b"]" * 70
        + b"}}]}",
        b"\x00" * 1000,
    ],
)
def test_hostile_bodies_get_a_400(fuzz_gateway: GatewayProcess, body: bytes) -> None:
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"):
        r = httpx.post(fuzz_gateway.url + route, content=body, headers={"content-type": "application/json"})
        assert r.status_code in (400, 413), r.text[:300]
        too_large = "request_too_large" if route == "/v1/messages" else "invalid_request_error"
        assert r.json()["error"]["type"] == ("invalid_request_error" if r.status_code == 400 else too_large)
        RAN[route] = RAN.get(route, 0) + 1


def test_the_document_is_served_and_the_fuzzing_ran(fuzz_gateway: GatewayProcess) -> None:
    doc = httpx.get(f"{fuzz_gateway.url}/openapi.json").json()
    assert doc["openapi"].startswith("3.1") and "/v1/chat/completions" in doc["paths"]
    total = sum(RAN.values())
    out = Path(os.environ.get("SHUNIU_FUZZ_REPORT", "")) if os.environ.get("SHUNIU_FUZZ_REPORT") else None
    if out is not None:
        out.write_text(json.dumps({"cases": total, "per_route": RAN}, indent=2))
    print(f"fuzzing: {total} cases over {len(RAN)} routes: {RAN}")
    assert set(RAN) >= {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/v1/models",
        "/ready",
    }
    assert total >= 4 * EXAMPLES
