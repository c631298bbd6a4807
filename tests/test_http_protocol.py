"""shuniu's HTTP/1.1 protocol (``core/http/protocol.py``), driven byte by byte through a
recording transport with small ASGI apps, and one real ``shuniu serve`` over a socket: one
write per whole response, chunked framing, pipelining, ``Expect: 100-continue``, HEAD,
HTTP/1.0, malformed requests, header injection, the keep-alive sweep and the disconnect
callback. (The slow-client guards are tested end to end in ``test_slow_clients.py``.)"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shuniu.core.config import GatewayConfig
from shuniu.core.http.asgi import LENGTH_KEY, header_value, request_id_from, send_json
from shuniu.core.http.protocol import DISCONNECT_EXTENSION, gateway_protocol
from tests.conftest import GatewayProcess, start_gateway

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class Transport(asyncio.Transport):
    """Records every write; closing is remembered, not done."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False
        self.paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class _Config:
    def __init__(self, app: App, keep_alive_s: float) -> None:
        self.loaded_app = app
        self.root_path = ""
        self.timeout_keep_alive = keep_alive_s


class _ServerState:
    def __init__(self) -> None:
        self.connections: set[Any] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.default_headers: list[tuple[bytes, bytes]] = []
        self.total_requests = 0


def connect(app: App, **gateway: Any) -> tuple[Any, Transport, _ServerState]:
    keep_alive = gateway.pop("keep_alive_s", 30.0)
    cls = gateway_protocol(GatewayConfig(keep_alive_s=keep_alive, **gateway))
    state = _ServerState()
    proto = cls(config=_Config(app, keep_alive), server_state=state, app_state={})
    transport = Transport()
    proto.connection_made(transport)
    return proto, transport, state


async def settle(state: _ServerState) -> None:
    """Until every request task this connection started has finished."""
    while state.tasks:
        await asyncio.gather(*list(state.tasks))


def echo(status: int = 200, headers: list[tuple[bytes, bytes]] | None = None) -> App:
    """Answers the request body as JSON (``{"method", "path", "body"}``) with a length."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = json.dumps(
            {"method": scope["method"], "path": scope["path"], "body": b"".join(chunks).decode()}
        ).encode()
        head = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
        await send({"type": "http.response.body", "body": body})

    return app


POST = b"POST /v1/x HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n%s"


def responses(data: bytes) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """Split what was written into (status line, headers, body) per response (bodies with a
    content-length, or chunked)."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        headers = dict(line.split(b": ", 1) for line in lines[1:])
        if b"content-length" in headers:
            n = int(headers[b"content-length"])
            body, data = rest[:n], rest[n:]
        elif headers.get(b"transfer-encoding") == b"chunked":
            body = b""
            while True:
                size, _, rest = rest.partition(b"\r\n")
                n = int(size, 16)
                body, rest = body + rest[:n], rest[n + 2 :]
                if n == 0:
                    break
            data = rest
        else:
            body, data = rest, b""
        out.append((lines[0], headers, body))
    return out


async def test_a_whole_response_is_one_write() -> None:
    proto, transport, state = connect(echo())
    proto.data_received(POST % (5, b"hello"))
    await settle(state)
    assert len(transport.writes) == 1
    [(status, _, body)] = responses(transport.writes[0])
    assert status == b"HTTP/1.1 200 OK"
    assert json.loads(body) == {"method": "POST", "path": "/v1/x", "body": "hello"}
    assert not transport.closed and state.total_requests == 1


async def test_a_stream_is_chunked_and_its_head_goes_with_its_first_event() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for i in range(3):
            await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    proto, transport, state = connect(app)
    proto.data_received(b"GET /s HTTP/1.1\r\nhost: t\r\n\r\n")
    await settle(state)
    assert len(transport.writes) == 4  # head + first event, two events, the last chunk
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and transport.writes[0].endswith(
        b"data: 0\n\n\r\n"
    )
    [(_, headers, body)] = responses(b"".join(transport.writes))
    assert headers[b"transfer-encoding"] == b"chunked"
    assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_pipelined_requests_are_answered_in_order() -> None:
    proto, transport, state = connect(echo())
    proto.data_received(POST % (1, b"a") + POST % (1, b"b") + POST % (1, b"c"))
    await settle(state)
    bodies = [json.loads(body)["body"] for _, _, body in responses(b"".join(transport.writes))]
    assert bodies == ["a", "b", "c"]
    assert state.total_requests == 3 and not transport.paused


async def test_a_body_that_arrives_later_and_in_parts_is_read_whole() -> None:
    proto, transport, state = connect(echo())
    proto.data_received(b"POST /v1/x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n")
    await asyncio.sleep(0)  # the app waits in receive for the rest
    proto.data_received(b"2\r\nde\r\n0\r\n\r\n")
    await settle(state)
    [(_, _, body)] = responses(b"".join(transport.writes))
    assert json.loads(body)["body"] == "abcde"


async def test_expect_100_continue_is_answered_before_the_body_is_read() -> None:
    proto, transport, state = connect(echo())
    proto.data_received(
        b"POST /v1/x HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n"
    )
    for _ in range(3):
        await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
    proto.data_received(b"ok")
    await settle(state)
    [(status, _, body)] = responses(b"".join(transport.writes[1:]))
    assert status == b"HTTP/1.1 200 OK" and json.loads(body)["body"] == "ok"


async def test_head_gets_the_headers_and_no_body() -> None:
    proto, transport, state = connect(echo())
    proto.data_received(b"HEAD /h HTTP/1.1\r\nhost: t\r\n\r\n")
    await settle(state)
    [write] = transport.writes
    assert write.startswith(b"HTTP/1.1 200 OK\r\n") and write.endswith(b"\r\n\r\n")
    assert b"content-length: " in write and b'"method"' not in write


async def test_http_1_0_is_answered_and_closed() -> None:
    proto, transport, state = connect(echo())
    proto.data_received(b"POST /v1/x HTTP/1.0\r\ncontent-length: 1\r\n\r\nz")
    await settle(state)
    [(status, headers, _)] = responses(b"".join(transport.writes))
    assert status == b"HTTP/1.1 200 OK" and headers[b"connection"] == b"close"
    assert transport.closed


async def test_a_malformed_request_gets_a_400_json_error_and_close() -> None:
    proto, transport, state = connect(echo())
    proto.data_received(b"NOT HTTP AT ALL\r\n\r\n")
    [(status, _, body)] = responses(b"".join(transport.writes))
    assert status.startswith(b"HTTP/1.1 400 ")
    assert json.loads(body)["error"]["code"] == "invalid_http_request"
    assert transport.closed and not state.tasks


async def test_a_header_value_with_a_line_break_is_never_written() -> None:
    proto, transport, state = connect(echo(headers=[(b"x-evil", b"a\r\nset-cookie: stolen")]))
    proto.data_received(POST % (1, b"a"))
    await settle(state)
    written = b"".join(transport.writes)
    assert b"set-cookie" not in written
    [(status, _, body)] = responses(written)
    assert status.startswith(b"HTTP/1.1 500 ") and json.loads(body)["error"]["type"] == "server_error"


async def test_framing_headers_are_found_in_any_case_and_never_inside_a_value() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = [
            (b"X-Note", b"content-length: 99; transfer-encoding: chunked"),
            (b"Content-Length", b"5"),
            (b"Connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"hello"})

    proto, transport, state = connect(app)
    proto.data_received(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
    await settle(state)
    [write] = transport.writes
    assert write.endswith(b"\r\n\r\nhello") and b"\r\ntransfer-encoding" not in write.lower()
    assert write.lower().count(b"connection: close") == 1
    assert transport.closed  # the app's "Connection: close"


def vouched(body: bytes, length: int, chunks: int = 1) -> App:
    """Answers ``body`` (in ``chunks`` parts) with a start message that vouches for its
    headers, as the request path's own responses do."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"x-request-id", b"r-1")]
        if length >= 0:
            headers.insert(1, (b"content-length", b"%d" % length))
        await send({"type": "http.response.start", "status": 200, "headers": headers, LENGTH_KEY: length})
        step = max(1, len(body) // chunks)
        for at in range(0, len(body), step):
            await send({"type": "http.response.body", "body": body[at : at + step], "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


async def test_a_vouched_head_is_written_as_given_and_framed_by_its_length() -> None:
    proto, transport, state = connect(vouched(b"hello", 5))
    state.default_headers = [(b"server", b"shuniu")]
    proto.data_received(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
    await settle(state)
    assert b"".join(transport.writes) == (
        b"HTTP/1.1 200 OK\r\nserver: shuniu\r\ncontent-type: application/json\r\n"
        b"content-length: 5\r\nx-request-id: r-1\r\n\r\nhello"
    )
    assert not transport.closed


async def test_a_vouched_stream_is_chunked_and_http_1_0_is_closed() -> None:
    proto, transport, state = connect(vouched(b"data: 1\n\ndata: 2\n\n", -1, chunks=2))
    proto.data_received(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
    await settle(state)
    [(status, headers, body)] = responses(b"".join(transport.writes))
    assert status == b"HTTP/1.1 200 OK" and headers[b"transfer-encoding"] == b"chunked"
    assert body == b"data: 1\n\ndata: 2\n\n" and b"connection" not in headers
    # HTTP/1.0 cannot keep the connection: the vouched head says so, and it is closed.
    proto, transport, state = connect(vouched(b"hello", 5))
    proto.data_received(b"GET / HTTP/1.0\r\n\r\n")
    await settle(state)
    [(status, headers, body)] = responses(b"".join(transport.writes))
    assert headers[b"connection"] == b"close" and body == b"hello" and transport.closed


async def test_a_vouched_head_of_a_head_request_has_no_body() -> None:
    proto, transport, state = connect(vouched(b"hello", 5))
    proto.data_received(b"HEAD / HTTP/1.1\r\nhost: t\r\n\r\n")
    await settle(state)
    [write] = transport.writes
    assert write.endswith(b"x-request-id: r-1\r\n\r\n") and b"hello" not in write


async def test_only_the_gateways_own_json_responses_are_vouched_for() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await send_json(
        send, 200, b"{}", "r-1", raw_headers=[(b"x-ratelimit-remaining-requests", b"9")], own=True
    )
    assert sent[0][LENGTH_KEY] == 2
    # An error's headers may be a plugin's: never vouched for, so the protocol checks them.
    await send_json(send, 429, b"{}", "r-1", {"retry-after": "1"}, own=True)
    await send_json(send, 200, b"{}", "r-1")
    assert LENGTH_KEY not in sent[2] and LENGTH_KEY not in sent[4]


def test_a_client_request_id_is_echoed_only_when_it_is_printable_ascii_without_spaces() -> None:
    # The vouched head writes the request id as it is: anything that could break a header
    # line (or is not plain ASCII) gets a fresh id instead.
    assert request_id_from(b"abc-123") == "abc-123"
    for bad in (b"a\r\nset-cookie: x", b"a\nb", b"a b", b"caf\xc3\xa9", b"", b"x" * 129, b"a\x00b"):
        fresh = request_id_from(bad)
        assert fresh != bad.decode("latin-1") and fresh.isascii() and fresh.isprintable() and " " not in fresh


def test_header_values_made_from_names_lose_their_line_breaks() -> None:
    assert header_value("model=chat") == b"model=chat"
    assert header_value("model=a\r\nset-cookie: x\n") == b"model=aset-cookie: x"


async def test_an_app_that_fails_before_answering_gets_a_500_not_a_traceback() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise ValueError("bug")

    proto, transport, state = connect(app)
    proto.data_received(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
    await settle(state)
    [(status, _, body)] = responses(b"".join(transport.writes))
    assert status.startswith(b"HTTP/1.1 500 ") and b"Traceback" not in body and b"bug" not in body


async def test_an_idle_kept_alive_connection_is_closed_by_the_sweep() -> None:
    proto, transport, state = connect(echo(), keep_alive_s=0.2, header_timeout_s=5, body_timeout_s=5)
    proto.data_received(POST % (1, b"a"))
    await settle(state)
    assert not transport.closed
    proto.check(proto.since + 0.1)
    assert not transport.closed
    proto.check(proto.since + 0.3)
    assert transport.closed and len(transport.writes) == 1  # closed quietly: no 408 between requests


async def test_a_request_in_its_headers_is_timed_from_its_first_byte_on_a_kept_alive_connection() -> None:
    proto, transport, state = connect(echo(), keep_alive_s=30, header_timeout_s=1, body_timeout_s=5)
    proto.data_received(POST % (1, b"a"))
    await settle(state)
    idle_since = proto.since
    proto.check(idle_since + 10)  # idle for 10 s: under keep_alive_s, no header timeout yet
    assert not transport.closed
    proto.data_received(b"POST /v1/x HTTP/1.1\r\n")
    started = proto.since
    assert started > idle_since or started == idle_since  # the loop's clock, read again
    proto.check(started + 2)
    assert transport.closed and b" 408 " in transport.writes[-1]


async def test_the_disconnect_callback_fires_once_and_only_before_the_response_ends() -> None:
    gone: list[str] = []
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        scope["extensions"][DISCONNECT_EXTENSION](lambda: gone.append(scope["path"]))
        await release.wait()

    proto, _, state = connect(app)
    proto.data_received(b"GET /a HTTP/1.1\r\nhost: t\r\n\r\n")
    for _ in range(3):
        await asyncio.sleep(0)
    proto.connection_lost(None)
    proto.connection_lost(None)
    release.set()
    await settle(state)
    assert gone == ["/a"]

    gone.clear()
    proto, _, state = connect(echo())
    proto.data_received(POST % (1, b"a"))
    await settle(state)
    proto.connection_lost(None)  # after a complete response: nothing to tell
    assert gone == []


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    deployment = """
models:
  m:
    endpoints:
      - {kind: sim, options: {ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 2, output_tokens_max: 2}}
"""
    gw = start_gateway(deployment, Path(tmp_path_factory.mktemp("proto")))
    yield gw
    gw.stop()


def test_a_real_gateway_answers_pipelined_requests_on_one_connection(gw: GatewayProcess) -> None:
    chat = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(chat), chat)
    )
    with socket.create_connection((gw.host, gw.port), timeout=15) as s:
        s.sendall(request * 3 + b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    answers = responses(data)
    assert [status for status, _, _ in answers] == [b"HTTP/1.1 200 OK"] * 4
    assert [json.loads(body)["object"] for _, _, body in answers[:3]] == ["chat.completion"] * 3
