"""Streamed chunks that arrive from the engine together leave the gateway together (one write
to the client), and a chunk that arrives alone is sent at once.

The upstream is a raw socket server in a thread that writes the stream in two parts: the
role and first token, then, only once the test says so, many tokens, the finish and
``[DONE]`` in one write. The client reads the gateway's chunked HTTP answer frame by frame,
so it sees how many writes the gateway made.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import start_gateway

TOKENS = 40


def _event(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    body = {
        "id": "up-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "up",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class TwoPartUpstream:
    """Answers every chat request with a stream sent in two writes, the second held until
    :attr:`release` is set."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.release = threading.Event()
        self.streams = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            buf = b""
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                if head.startswith(b"GET"):
                    models = b'{"object":"list","data":[{"id":"up","object":"model"}]}'
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                        % (len(models), models)
                    )
                    continue
                assert json.loads(body)["stream"] is True
                self.streams += 1
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                    + _http_chunk(_event(""))
                    + _http_chunk(_event("first"))
                )
                if not self.release.wait(30):
                    return
                rest = b"".join(_event(f" t{i}") for i in range(TOKENS)) + _event(None, "stop")
                conn.sendall(_http_chunk(rest + b"data: [DONE]\n\n") + b"0\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


class ChunkedReader:
    """The frames of a chunked HTTP answer read from a raw socket, one ``frame()`` each."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("the gateway closed the connection")
        self.buf += data

    def head(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        return head

    def frame(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        size_line, _, rest = self.buf.partition(b"\r\n")
        size = int(size_line, 16)
        while len(rest) < size + 2:
            self._fill()
            size_line, _, rest = self.buf.partition(b"\r\n")
        self.buf = rest[size + 2 :]
        return rest[:size]


@pytest.fixture
def upstream() -> Iterator[TwoPartUpstream]:
    up = TwoPartUpstream()
    yield up
    up.release.set()
    up.close()


def test_events_that_arrive_together_leave_in_one_write_and_the_first_is_not_held(
    upstream: TwoPartUpstream, tmp_path: Path
) -> None:
    gw = start_gateway(
        f"""
        gateway: {{host: 127.0.0.1}}
        models:
          m:
            endpoints:
              - kind: openai
                options: {{base_url: "http://127.0.0.1:{upstream.port}/v1", model: up}}
        """,
        tmp_path,
    )
    try:
        body = json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        ).encode()
        with socket.create_connection(("127.0.0.1", gw.port), timeout=30) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            reader = ChunkedReader(sock)
            assert reader.head().startswith(b"HTTP/1.1 200")
            # The first token reaches the client while the engine holds back the rest: the
            # gateway does not wait for more before it writes.
            seen = b""
            while b'"first"' not in seen:
                seen += reader.frame()
            assert not upstream.release.is_set()
            upstream.release.set()
            frames = []
            while True:
                frame = reader.frame()
                if not frame:
                    break
                frames.append(frame)
        text = b"".join(frames)
        assert all(b'" t%d"' % i in text for i in range(TOKENS))
        assert text.endswith(b"data: [DONE]\n\n")
        # 40 tokens, the finish and [DONE] came in one engine write; they leave in a few
        # writes, not one per event (before coalescing: 42).
        assert len(frames) <= 3, [len(f) for f in frames]
        assert upstream.streams == 1
    finally:
        gw.stop()
