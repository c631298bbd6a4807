"""Slow and oversized clients (OWASP API4) against a real ``shuniu serve``: slowloris
connections are cut off, headers are measured as they arrive, stalled bodies are dropped,
open connections are capped so normal clients still get in, and huge bodies are refused
with memory bounded. ``benchmarks/slow_clients.py`` measures normal latency under attack."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import GatewayProcess, start_gateway, wait_until

DEPLOYMENT = """
gateway:
  header_timeout_s: 0.5
  body_timeout_s: 0.5
  max_connections: 16
  max_header_bytes: 4096
models:
  m:
    max_model_len: 200000
    endpoints:
      - {kind: sim, options: {ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 2, output_tokens_max: 4}}
"""
CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(DEPLOYMENT, tmp_path_factory.mktemp("slow"))
    yield gw
    gw.stop()


def _connect(gw: GatewayProcess) -> socket.socket:
    s = socket.create_connection((gw.host, gw.port), timeout=15)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _answer(s: socket.socket) -> bytes:
    """Everything the gateway sends until it closes the connection. A close with unread
    data from the client may reach it as a reset, possibly before the answer: then what
    arrived, and the close is the answer."""
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_trickling_client_is_cut_off_with_408(gw: GatewayProcess) -> None:
    with _connect(gw) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        s.settimeout(0.2)
        answer = b""
        for i in range(200):  # one header line every 0.2 s, for as long as the gateway listens
            try:
                s.sendall(b"x-slow-%d: still coming\r\n" % i)
                answer += s.recv(65536)
                if answer:
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        s.settimeout(15)
        answer += _answer(s)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"header_timeout"' in answer


def test_an_idle_connection_that_never_speaks_is_closed(gw: GatewayProcess) -> None:
    with _connect(gw) as s:
        assert _answer(s).startswith(b"HTTP/1.1 408 ")


def test_oversized_headers_are_refused_while_they_arrive(gw: GatewayProcess) -> None:
    with _connect(gw) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 20_000)
        # The headers have not ended, and the gateway answers already.
        answer = _answer(s)
    assert answer.startswith(b"HTTP/1.1 431 ") and b'"code":"headers_too_large"' in answer


def test_a_stalled_body_closes_the_connection(gw: GatewayProcess) -> None:
    with _connect(gw) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(CHAT) + CHAT[:10]
        )
        answer = _answer(s)  # returns once the gateway closed the connection
    assert b"HTTP/1.1 200" not in answer


def test_at_the_connection_cap_slow_clients_make_room_for_normal_ones(gw: GatewayProcess) -> None:
    slow = [_connect(gw) for _ in range(40)]  # 2.5x the cap, each stuck in its headers
    try:
        for s in slow:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        for _ in range(10):
            r = httpx.post(
                f"{gw.base_url}/chat/completions", content=CHAT, headers={"content-type": "application/json"}
            )
            assert r.status_code == 200
        for s in slow:  # every slow connection is closed by the gateway (a 408, or a reset)
            s.settimeout(15)
            answer = _answer(s)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408 ")
    finally:
        for s in slow:
            s.close()


def test_huge_bodies_are_refused_with_memory_bounded(gw: GatewayProcess) -> None:
    before = _rss_kib(gw.proc.pid)
    declared = 64 * 1024 * 1024
    with _connect(gw) as s:  # a declared 64 MB body: 413 before any of it is read
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % declared
        )
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.1 413 ")

    def chunks() -> Iterator[bytes]:
        block = b"a" * (1 << 20)
        for _ in range(64):  # 64 MiB, chunked: refused once past the 8 MiB limit
            yield block

    try:
        r = httpx.post(
            f"{gw.base_url}/chat/completions",
            content=chunks(),
            headers={"content-type": "application/json"},
            timeout=30,
        )
        assert r.status_code == 413
    except httpx.TransportError:
        pass  # the gateway answered and closed while the client was still sending
    wait_until(lambda: httpx.get(f"{gw.url}/health").status_code == 200)
    assert _rss_kib(gw.proc.pid) - before < 40 * 1024  # never the 64 MiB


def test_a_large_body_in_the_same_read_as_the_headers_is_not_taken_for_headers(gw: GatewayProcess) -> None:
    """The header limit counts only what comes before the blank line: a 200 kB prompt sent
    in one write with its headers is an ordinary request."""
    content = "word " * 40_000
    body = (
        b'{"model": "m", "messages": [{"role": "user", "content": "%s"}], "max_tokens": 2}' % content.encode()
    )
    with _connect(gw) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body) + body
        )
        answer = _answer(s)
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:300]
