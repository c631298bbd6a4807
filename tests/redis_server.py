"""A real ``redis-server`` for tests: started on a free port of 127.0.0.1, with no
persistence and no unix socket, and stopped by its PID.

Fixtures (exposed to every test module through ``tests/conftest.py``):

- ``redis_server``: one server for the whole session (a :class:`RedisServer`).
- ``redis_url``: its URL, with the server flushed before the test.
- ``redis_server_factory``: ``factory(password=None)`` starts a server of the test's own
  (for tests that stop, pause or restart it); all are stopped at the end of the test.

Every fixture skips the test, with the reason, when ``redis-server`` is not installed.
Set ``SHUNIU_REDIS_SERVER`` to use another binary.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

from tests.ports import quiet_ports

__all__ = ["RedisServer", "redis_server", "redis_server_factory", "redis_url"]

_START_TIMEOUT_S = 10.0


def redis_server_binary() -> str | None:
    """The ``redis-server`` to run, or ``None`` when there is none."""
    return os.environ.get("SHUNIU_REDIS_SERVER") or shutil.which("redis-server")


def _resp(*args: str) -> bytes:
    out = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RedisServer:
    """One ``redis-server`` child process on a fixed port of 127.0.0.1.

    :meth:`stop` and :meth:`start` may be called repeatedly: the server comes back on the
    same port (and with the same password), empty."""

    def __init__(
        self,
        binary: str,
        port: int | None = None,
        password: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.port = port or quiet_ports()[0]
        self.password = password
        self.extra_args = list(extra_args)
        """More ``redis-server`` arguments (replication, cluster mode, ...)."""
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="shuniu-redis-")

    @property
    def url(self) -> str:
        """``redis://[:password@]127.0.0.1:PORT/0``."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        """Start the server (again) and wait until it answers ``PING``."""
        if self.proc is not None and self.proc.poll() is None:
            return
        cmd = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--unixsocket",
            "",
            "--dir",
            self._dir,
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        if self.password:
            cmd += ["--requirepass", self.password, "--masterauth", self.password]
        cmd += self.extra_args
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                output = self.proc.stdout.read().decode(errors="replace") if self.proc.stdout else ""
                self.proc = None
                raise RuntimeError(f"redis-server on port {self.port} exited at start:\n{output}")
            if self.ping():
                return
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {_START_TIMEOUT_S}s")

    def stop(self) -> None:
        """Stop the server (SIGTERM to its PID, SIGKILL if it lingers); idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a paused server cannot act on SIGTERM
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()

    def kill(self) -> None:
        """End the server at once (SIGKILL), as a crashed host would."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections hang, as with an overloaded Redis."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Undo :meth:`pause`."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def command(self, *args: str, timeout: float = 2.0) -> bytes:
        """Send one command (after ``AUTH`` when there is a password); return the raw
        first reply line, e.g. ``b"+OK"``."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            payload = _resp(*args)
            if self.password:
                payload = _resp("AUTH", self.password) + payload
            s.sendall(payload)
            data = b""
            wanted = 2 if self.password else 1
            while data.count(b"\r\n") < wanted:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return data.split(b"\r\n")[wanted - 1]

    def ping(self) -> bool:
        try:
            return self.command("PING", timeout=0.5) == b"+PONG"
        except OSError:
            return False

    def flush(self) -> None:
        reply = self.command("FLUSHALL")
        if reply != b"+OK":
            raise RuntimeError(f"FLUSHALL answered {reply!r}")

    def close(self) -> None:
        """Stop the server and remove its working directory."""
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def start_redis_server(password: str | None = None) -> RedisServer:
    """A started server, or a skipped test when ``redis-server`` is not installed."""
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("redis-server is not installed (e.g. apt-get install redis-server); Redis tests skipped")
    for attempt in range(3):  # another process may take the free port before the server does
        server = RedisServer(binary, password=password)
        try:
            server.start()
            return server
        except RuntimeError:
            server.close()
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One ``redis-server`` for the session."""
    server = start_redis_server()
    yield server
    server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, flushed for this test."""
    redis_server.start()  # in case a test stopped it
    redis_server.flush()
    return redis_server.url


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    """``factory(password=None)``: a server of this test's own, stopped at its end."""
    servers: list[RedisServer] = []

    def factory(password: str | None = None) -> RedisServer:
        server = start_redis_server(password)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        server.close()
