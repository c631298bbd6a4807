"""A real PostgreSQL server for tests (Debian's ``postgresql``): a cluster made with
``initdb`` in a temporary folder, started on a free port of 127.0.0.1 with no durability
(``fsync=off``), stopped by its PID. Its data survives :meth:`PostgresServer.stop` and
:meth:`PostgresServer.start`, so tests can take the database away and bring it back.

Fixtures (exposed to every test module through ``tests/conftest.py``):

- ``postgres_server``: one server for the whole session;
- ``postgres_url``: a fresh, empty database on it for the test;
- ``postgres_server_factory``: ``factory()`` starts a server of the test's own (for tests
  that stop and start it); all are stopped at the end of the test.

Run as root, the server runs as the ``postgres`` system user (``nobody`` without one):
PostgreSQL refuses to run as root. Every fixture skips the test, with the reason, without
the binaries; set ``SHUNIU_POSTGRES_BIN`` to the folder holding ``initdb`` and ``postgres``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.ports import quiet_ports

__all__ = ["PostgresServer", "postgres_bin", "postgres_server", "postgres_server_factory", "postgres_url"]

_START_TIMEOUT_S = 30.0


def postgres_bin() -> Path | None:
    """The folder of ``initdb`` and ``postgres``, or ``None`` when there is none."""
    given = os.environ.get("SHUNIU_POSTGRES_BIN")
    candidates = [given] if given else []
    found = shutil.which("initdb")
    if found:
        candidates.append(str(Path(os.path.realpath(found)).parent))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for folder in candidates:
        if folder and (Path(folder) / "initdb").is_file() and (Path(folder) / "postgres").is_file():
            return Path(folder)
    return None


def _run_as() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and there is no postgres or nobody user to run PostgreSQL as")


class PostgresServer:
    """One PostgreSQL cluster and its server process on a fixed port of 127.0.0.1; user
    ``shuniu`` (trusted, no password), database ``shuniu``."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = quiet_ports()[0]
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="shuniu-pg-"))
        self._data = self._dir / "data"
        self._sock = self._dir / "sock"
        self._log = self._dir / "server.log"
        self._user = _run_as()
        self._sock.mkdir()
        if self._user is not None:
            os.chmod(self._dir, 0o755)
            os.chown(self._sock, self._user.pw_uid, self._user.pw_gid)
            # initdb creates the data folder; it must be able to write next to it.
            os.chown(self._dir, self._user.pw_uid, self._user.pw_gid)
        self._initdb()

    def _popen_args(self) -> dict[str, object]:
        if self._user is None:
            return {}
        return {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def _initdb(self) -> None:
        done = subprocess.run(
            [str(self.bindir / "initdb"), "-D", str(self._data), "-U", "shuniu", "--auth=trust",
             "-E", "UTF8", "--no-locale", "--no-sync"],
            capture_output=True, text=True, timeout=120, cwd=self._dir, **self._popen_args(),  # type: ignore[arg-type]
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{done.stdout}\n{done.stderr}")

    @property
    def url(self) -> str:
        return self.url_of("shuniu")

    def url_of(self, database: str) -> str:
        return f"postgresql://shuniu@127.0.0.1:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def start(self) -> PostgresServer:
        if self.pid is not None:
            return self
        log = open(self._log, "ab")
        if self._user is not None:
            os.chown(self._log, self._user.pw_uid, self._user.pw_gid)
        self.proc = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(self._data), "-p", str(self.port), "-h", "127.0.0.1",
             "-k", str(self._sock), "-c", "fsync=off", "-c", "synchronous_commit=off",
             "-c", "full_page_writes=off", "-c", "shared_buffers=16MB", "-c", "max_connections=50"],
            stdout=log, stderr=subprocess.STDOUT, cwd=self._dir, **self._popen_args(),  # type: ignore[arg-type]
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self._accepts():
                self._ensure_database("shuniu")
                return self
            time.sleep(0.05)
        text = self._log.read_text(errors="replace")[-3000:]
        self.stop()
        raise RuntimeError(f"postgres did not start on port {self.port}:\n{text}")

    def _accepts(self) -> bool:
        done = subprocess.run(
            [str(self.bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "shuniu"],
            capture_output=True, timeout=10,
        )  # fmt: skip
        return done.returncode == 0

    def _psql(self, sql: str, database: str = "postgres") -> str:
        done = subprocess.run(
            [str(self.bindir / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "shuniu",
             "-d", database, "-v", "ON_ERROR_STOP=1", "-Atqc", sql],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr}")
        return done.stdout.strip()

    def _ensure_database(self, name: str) -> None:
        if self._psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'") != "1":
            self._psql(f'CREATE DATABASE "{name}"')

    def new_database(self) -> str:
        """A fresh, empty database's URL."""
        name = "t_" + uuid.uuid4().hex[:12]
        self._psql(f'CREATE DATABASE "{name}"')
        return self.url_of(name)

    def stop(self) -> None:
        """Stop the server (a fast shutdown; killed if it lingers). The data is kept."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def _need_bin() -> Path:
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    return bindir


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer(_need_bin()).start()
    yield server
    server.remove()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session server, for this test."""
    postgres_server.start()  # in case a test stopped it
    return postgres_server.new_database()


@pytest.fixture
def postgres_server_factory() -> Iterator[Callable[[], PostgresServer]]:
    bindir = _need_bin()
    started: list[PostgresServer] = []

    def factory() -> PostgresServer:
        server = PostgresServer(bindir)
        started.append(server)
        return server.start()

    yield factory
    for server in started:
        server.remove()
