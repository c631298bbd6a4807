"""Normal clients while slow and oversized ones attack (OWASP API4): latency of ordinary
requests on a quiet gateway, then with slowloris connections beyond the connection cap (each
trickling a header line every 2 s) and a 64 MB chunked upload, on one machine.

    python benchmarks/slow_clients.py [--slow 3000] [--cap 1000] [--requests 400]

Prints p50/p99 of the normal requests in both phases and their ratio, how many slow
connections the gateway closed, and the gateway's RSS. Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import selectors
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
import httpx

DEPLOYMENT = """
gateway:
  max_connections: {cap}
  header_timeout_s: 10
models:
  m:
    endpoints:
      - kind: sim
        replicas: 2
        options: {{ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 4, output_tokens_max: 4}}
"""
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _latencies(base: str, n: int) -> list[float]:
    out = []
    with httpx.Client(timeout=30) as client:
        for _ in range(n):
            start = time.perf_counter()
            r = client.post(f"{base}/v1/chat/completions", json=CHAT)
            out.append(time.perf_counter() - start)
            if r.status_code != 200:
                raise RuntimeError(f"a normal request got {r.status_code}: {r.text[:200]}")
    return out


class Slowloris(multiprocessing.Process):
    """``count`` connections that send a request line, then one header line every 2 s; in a
    process of its own, so it does not slow the client being measured."""

    def __init__(self, host: str, port: int, count: int) -> None:
        super().__init__(daemon=True)
        self.host, self.port, self.count = host, port, count
        self._gone = multiprocessing.Value("i", 0)
        self._opened = multiprocessing.Value("i", 0)
        self.stop = multiprocessing.Event()

    @property
    def opened(self) -> int:
        return int(self._opened.value)

    @property
    def closed_by_gateway(self) -> int:
        return int(self._gone.value)

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        socks: list[socket.socket] = []
        for _ in range(self.count):
            try:
                s = socket.create_connection((self.host, self.port), timeout=5)
            except OSError:
                continue
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
            socks.append(s)
        self._opened.value = len(socks)
        line = 0
        while not self.stop.is_set():
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and not self.stop.is_set():
                for key, _ in sel.select(timeout=0.1):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        sock.recv(4096)
                    except OSError:
                        pass
                    sel.unregister(sock)
                    sock.close()
                    self._gone.value += 1  # an answer (408) or EOF: the gateway closed it
            line += 1
            for key in list(sel.get_map().values()):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    sock.send(b"x-slow-%d: still here\r\n" % line)
                except OSError:
                    pass
        for s in socks:
            s.close()


def _upload(base: str, result: dict[str, object]) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        block = b"a" * (1 << 20)
        for _ in range(64):
            yield block

    try:
        r = httpx.post(f"{base}/v1/chat/completions", content=chunks(), timeout=60)
        result["upload"] = r.status_code
    except httpx.TransportError as exc:
        result["upload"] = f"closed by the gateway ({type(exc).__name__})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slow", type=int, default=3000, help="slowloris connections")
    parser.add_argument("--cap", type=int, default=1000, help="the gateway's max_connections")
    parser.add_argument("--requests", type=int, default=400, help="normal requests per phase")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.slow + 1024)), hard))
    harness.handle_signals()
    with tempfile.TemporaryDirectory() as tmp, harness.Children() as children:
        path = Path(tmp) / "deployment.yaml"
        path.write_text(DEPLOYMENT.format(cap=args.cap))
        cmd = [*harness.shuniu_command(), "serve", str(path), "--port", "0"]
        gw = children.start("gateway", cmd, Path(tmp) / "gw.log")
        harness.wait_serving(gw, 30)
        base = f"http://{gw.host}:{gw.port}"
        _latencies(base, 50)  # warm-up
        quiet = sorted(_latencies(base, args.requests))
        rss_quiet = harness.rss_mib(gw.pid)
        attack = Slowloris(gw.host, gw.port, args.slow)
        attack.start()
        while attack.opened == 0 and attack.is_alive():
            time.sleep(0.05)
        upload: dict[str, object] = {}
        uploader = threading.Thread(target=_upload, args=(base, upload), daemon=True)
        uploader.start()
        attacked = sorted(_latencies(base, args.requests))
        rss_attacked = harness.rss_mib(gw.pid)
        uploader.join(60)
        attack.stop.set()
        attack.join(10)
    p50q, p99q = harness.percentile(quiet, 50), harness.percentile(quiet, 99)
    p50a, p99a = harness.percentile(attacked, 50), harness.percentile(attacked, 99)
    assert p50q is not None and p99q is not None and p50a is not None and p99a is not None
    print(f"normal requests: {args.requests} per phase; slowloris: {attack.opened} opened, cap {args.cap}")
    print(f"{'phase':<10} {'p50 ms':>8} {'p99 ms':>8} {'RSS MiB':>8}")
    print(f"{'quiet':<10} {1000 * p50q:>8.2f} {1000 * p99q:>8.2f} {rss_quiet:>8.1f}")
    print(f"{'attacked':<10} {1000 * p50a:>8.2f} {1000 * p99a:>8.2f} {rss_attacked:>8.1f}")
    closed = f"{attack.closed_by_gateway} of {attack.opened}"
    print(f"p99 attacked / quiet: {p99a / p99q:.2f}x; slow connections closed by the gateway: {closed}")
    print(f"64 MB chunked upload: {upload.get('upload')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
