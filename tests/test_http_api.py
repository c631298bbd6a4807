"""Raw-HTTP tests of the wire format: SSE framing, request ids, and every client error."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import wait_until

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def _error(resp: httpx.Response) -> dict:  # type: ignore[type-arg]
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in resp.text
    return body["error"]  # type: ignore[no-any-return]


def test_sse_framing_exactly(gateway) -> None:  # type: ignore[no-untyped-def]
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    with httpx.Client() as client:
        resp = client.post(f"{gateway.base_url}/chat/completions", json=body)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    raw = resp.text
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")
    assert events[-1] == ""
    events = events[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events)
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [p["object"] for p in payloads] == ["chat.completion.chunk"] * len(payloads)
    contents = [p["choices"][0]["delta"].get("content") for p in payloads[1:-1]]
    assert len(contents) == 4 and all(contents)
    assert payloads[-2]["choices"][0]["finish_reason"] == "length"
    assert payloads[-1]["choices"] == [] and payloads[-1]["usage"]["completion_tokens"] == 4
    assert all("usage" in p for p in payloads)


def test_request_id_echoed_and_generated(gateway) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client() as client:
        given = client.post(
            f"{gateway.base_url}/chat/completions", json=CHAT, headers={"x-request-id": "abc-123"}
        )
        assert given.headers["x-request-id"] == "abc-123"
        assert given.json()["id"] == "chatcmpl-abc-123"
        fresh = [
            client.post(f"{gateway.base_url}/chat/completions", json=CHAT).headers["x-request-id"]
            for _ in range(3)
        ]
        assert len(set(fresh)) == 3 and all(fresh)
        err = client.post(
            f"{gateway.base_url}/chat/completions", content=b"{", headers={"x-request-id": "e1"}
        )
        assert err.headers["x-request-id"] == "e1"


def test_a_repeated_header_counts_by_its_first_value(gateway) -> None:  # type: ignore[no-untyped-def]
    # The request path reads its headers from a map of each name's first value: the same
    # value a walk over the pairs found first.
    url = f"{gateway.base_url}/chat/completions"
    with httpx.Client() as client:
        twice = client.post(url, json=CHAT, headers=[("x-request-id", "first"), ("x-request-id", "second")])
        assert twice.headers["x-request-id"] == "first"
        bad_first = [("x-shuniu-deadline-ms", "soon"), ("x-shuniu-deadline-ms", "5000")]
        refused = client.post(url, json=CHAT, headers=bad_first)
        assert refused.status_code == 400 and _error(refused)["param"] == "x-shuniu-deadline-ms"
        good_first = [("x-shuniu-deadline-ms", "5000"), ("x-shuniu-deadline-ms", "soon")]
        assert client.post(url, json=CHAT, headers=good_first).status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (b"{not json", 400, "invalid_json", None),
        (b"[1, 2]", 400, "invalid_json", None),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}]}).encode(),
            400,
            "missing_required_parameter",
            "model",
        ),
        (json.dumps({"model": "tiny"}).encode(), 400, "missing_required_parameter", "messages"),
        (json.dumps({"model": "tiny", "messages": "hi"}).encode(), 400, "invalid_type", "messages"),
        (
            json.dumps({"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}).encode(),
            400,
            "invalid_value",
            "messages[0].role",
        ),
        (
            json.dumps({"model": "tiny", "messages": [{"content": "x"}]}).encode(),
            400,
            "missing_required_parameter",
            "messages[0].role",
        ),
        (json.dumps({**CHAT, "max_tokens": 0}).encode(), 400, "invalid_value", "max_tokens"),
        (json.dumps({**CHAT, "max_tokens": "ten"}).encode(), 400, "invalid_type", "max_tokens"),
        (json.dumps({**CHAT, "temperature": 7}).encode(), 400, "invalid_value", "temperature"),
        (json.dumps({**CHAT, "n": 3}).encode(), 400, "unsupported_value", "n"),
        (json.dumps({**CHAT, "stop": 5}).encode(), 400, "invalid_type", "stop"),
        (
            json.dumps({**CHAT, "stream_options": {"include_usage": True}}).encode(),
            400,
            "invalid_value",
            "stream_options",
        ),
        (json.dumps({**CHAT, "model": "gpt-nothing"}).encode(), 404, "model_not_found", "model"),
        (json.dumps({**CHAT, "max_tokens": 2048}).encode(), 400, "context_length_exceeded", "max_tokens"),
    ],
)
def test_chat_client_errors(gateway, body: bytes, status: int, code: str, param: str | None) -> None:  # type: ignore[no-untyped-def]
    resp = httpx.post(
        f"{gateway.base_url}/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    assert resp.status_code == status, resp.text
    err = _error(resp)
    assert err["code"] == code
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"
    assert err["message"]


@pytest.mark.parametrize(
    ("prompt", "code"),
    [
        ([], "invalid_value"),
        (["a", "b"], "unsupported_value"),
        ([1.5], "invalid_type"),
        (None, "missing_required_parameter"),
    ],
)
def test_completion_prompt_errors(gateway, prompt: object, code: str) -> None:  # type: ignore[no-untyped-def]
    body: dict[str, object] = {"model": "tiny", "max_tokens": 2}
    if prompt is not None:
        body["prompt"] = prompt
    resp = httpx.post(f"{gateway.base_url}/completions", json=body)
    assert resp.status_code == 400
    assert _error(resp)["code"] == code


def test_token_id_prompt(gateway) -> None:  # type: ignore[no-untyped-def]
    resp = httpx.post(
        f"{gateway.base_url}/completions", json={"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2}
    )
    assert resp.status_code == 200
    assert resp.json()["usage"]["prompt_tokens"] == 3


def test_unknown_route_and_method(gateway) -> None:  # type: ignore[no-untyped-def]
    resp = httpx.get(f"{gateway.url}/v2/whatever")
    assert resp.status_code == 404 and _error(resp)["code"] == "not_found"
    resp = httpx.get(f"{gateway.base_url}/chat/completions")
    assert resp.status_code == 405 and _error(resp)["code"] == "method_not_allowed"
    resp = httpx.delete(f"{gateway.base_url}/models")
    assert resp.status_code == 405 and _error(resp)["code"] == "method_not_allowed"


def test_health_and_ready(gateway) -> None:  # type: ignore[no-untyped-def]
    assert httpx.get(f"{gateway.url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{gateway.url}/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["status"] == "ready"
    assert [e["name"] for e in body["models"]["tiny"]["endpoints"]] == ["tiny-0", "tiny-1"]


def test_unknown_fields_are_accepted(gateway) -> None:  # type: ignore[no-untyped-def]
    body = {
        **CHAT,
        "logit_bias": {"50256": -100},
        "some_engine_knob": True,
        "user": "u-1",
        "top_p": 0.5,
        "seed": 1,
    }
    resp = httpx.post(f"{gateway.base_url}/chat/completions", json=body)
    assert resp.status_code == 200


def test_body_limit(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        """
        gateway: {max_body_bytes: 2048}
        models:
          m:
            endpoints: [{kind: sim, options: {ttft_ms: 0, tokens_per_s: 0}}]
        """
    )
    big = {"model": "m", "messages": [{"role": "user", "content": "x" * 5000}]}
    resp = httpx.post(f"{gw.base_url}/chat/completions", json=big)
    assert resp.status_code == 413 and _error(resp)["code"] == "request_too_large"

    # The same limit holds when the client streams the body without a Content-Length.
    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(10):
            yield b" " * 500
        yield json.dumps(big).encode()

    resp = httpx.post(f"{gw.base_url}/chat/completions", content=chunks())
    assert resp.status_code == 413
    small = httpx.post(
        f"{gw.base_url}/chat/completions", json={**big, "messages": [{"role": "user", "content": "x"}]}
    )
    assert small.status_code == 200


def test_no_healthy_endpoint_is_503(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    gw = gateway_factory(
        f"""
        models:
          m:
            health: {{interval_s: 0.05, timeout_s: 0.5, unhealthy_after: 1}}
            endpoints:
              - kind: openai
                options: {{base_url: "http://127.0.0.1:{dead}/v1", connect_timeout_s: 0.5}}
        """
    )
    with httpx.Client() as client:
        wait_until(lambda: client.get(f"{gw.url}/ready").status_code == 503)
        ready = client.get(f"{gw.url}/ready")
        assert ready.status_code == 503
        assert ready.json()["models"]["m"]["endpoints"][0]["healthy"] is False
        resp = client.post(f"{gw.base_url}/chat/completions", json={**CHAT, "model": "m"})
    assert resp.status_code == 503
    err = _error(resp)
    assert err["code"] == "no_healthy_endpoint" and err["type"] == "server_error"
    assert resp.headers["retry-after"] == "1"
