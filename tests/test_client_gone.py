"""A request whose stream the gateway ends itself (an idle timeout), or whose client leaves,
ends quietly: the connection stays usable, nothing is logged as a failure of the gateway.
Run compiled too (``tests/test_compiled_build.py``), where a mypyc bug once turned both into
an exception escaping to the server (see ``test_no_compiled_coroutine_awaits_in_a_finally``)."""

from __future__ import annotations

import http.client
import json
import socket

from tests.conftest import wait_until

SLOW = """
models:
  chat:
    timeouts: {idle_s: 0.2}
    endpoints:
      - kind: sim
        name: slow
        options: {ttft_ms: 0, tokens_per_s: 1, output_tokens_min: 50, output_tokens_max: 50}
  wait:
    endpoints:
      - {kind: sim, name: late, options: {ttft_ms: 60000}}
"""


def _body(model: str, stream: bool) -> str:
    return json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream})


def _in_flight(gw, name: str) -> int:  # type: ignore[no-untyped-def]
    conn = http.client.HTTPConnection(gw.host, gw.port, timeout=10)
    conn.request("GET", "/ready")
    ready = json.loads(conn.getresponse().read())
    conn.close()
    for model in ready["models"].values():
        for endpoint in model["endpoints"]:
            if endpoint["name"] == name:
                return int(endpoint["in_flight"])
    raise AssertionError(f"no endpoint {name} in {ready}")


def test_a_stream_ended_by_its_idle_timeout_keeps_the_connection(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(SLOW)
    conn = http.client.HTTPConnection(gw.host, gw.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", _body("chat", True), {"content-type": "application/json"})
    first = conn.getresponse()
    text = first.read().decode()
    assert first.status == 200 and "idle_timeout" in text and text.rstrip().endswith("data: [DONE]")
    # The same connection serves the next request: the gateway did not close it as after
    # an application error.
    conn.request("GET", "/v1/models")
    second = conn.getresponse()
    assert second.status == 200 and "chat" in second.read().decode()
    conn.close()
    assert "Exception in ASGI application" not in "".join(gw.output)


def test_a_client_that_leaves_is_no_error_of_the_gateway(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(SLOW)
    body = _body("wait", False).encode()
    with socket.create_connection((gw.host, gw.port), timeout=10) as sock:
        head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        sock.sendall(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        wait_until(lambda: _in_flight(gw, "late") == 1)
    wait_until(lambda: _in_flight(gw, "late") == 0)  # the engine call was cancelled
    # A connection that an application error closed would not answer twice.
    conn = http.client.HTTPConnection(gw.host, gw.port, timeout=10)
    for _ in range(2):
        conn.request("GET", "/v1/models")
        assert conn.getresponse().read()
    conn.close()
    assert "Exception in ASGI application" not in "".join(gw.output)
