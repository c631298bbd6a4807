"""Redis as fleets run it in production, started from Debian's ``redis-server`` on
127.0.0.1 for tests: a primary with a replica watched by three Sentinels, and a Redis
Cluster of three primaries with a replica each. Both can lose their primary mid-test
(:meth:`kill_primary`) and say when the failover is over (:meth:`wait_failover`).

Every process is a child of the test run, ended by its PID. Sentinel and Cluster timeouts
are short (a primary is judged down after 500 ms, a Cluster node after 1 s), so a failover
takes a few seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
import redis

from tests.ports import quiet_ports
from tests.redis_server import RedisServer, redis_server_binary

__all__ = ["RedisCluster", "RedisSentinels", "redis_cluster", "redis_sentinels"]

_WAIT_S = 30.0
_FAST_SYNC = ["--repl-diskless-sync-delay", "0"]
"""A replica's first sync starts at once (by default a primary waits 5 s for more
replicas), so a set is ready, and can fail over, as soon as it is up."""


def _wait(what: str, check, timeout: float = _WAIT_S) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except (redis.RedisError, OSError) as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{what} did not happen within {timeout:g}s (last error: {last!r})")


def _binary() -> str:
    binary = redis_server_binary()
    if binary is None:
        pytest.skip("redis-server is not installed (e.g. apt-get install redis-server); HA tests skipped")
    return binary


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, socket_connect_timeout=2)


class _Sentinel:
    """One ``redis-server --sentinel`` process with its own (rewritable) config file."""

    def __init__(self, binary: str, directory: str, service: str, primary_port: int) -> None:
        self.port = quiet_ports()[0]
        self.conf = os.path.join(directory, f"sentinel-{self.port}.conf")
        with open(self.conf, "w") as f:
            f.write(
                f"port {self.port}\nbind 127.0.0.1\ndir {directory}\n"
                f"sentinel monitor {service} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {service} 500\n"
                f"sentinel failover-timeout {service} 3000\n"
                f"sentinel parallel-syncs {service} 1\n"
            )
        self.proc = subprocess.Popen(
            [binary, self.conf, "--sentinel", "--loglevel", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class RedisSentinels:
    """A primary and a replica of ``service``, and three Sentinels (quorum 2) watching it."""

    def __init__(self, service: str = "shuniu") -> None:
        binary = _binary()
        self.service = service
        self._dir = tempfile.mkdtemp(prefix="shuniu-sentinel-")
        self.servers: list[RedisServer] = []
        self.sentinels: list[_Sentinel] = []
        try:
            primary = RedisServer(binary, extra_args=_FAST_SYNC)
            primary.start()
            self.servers.append(primary)
            follow = ["--replicaof", "127.0.0.1", str(primary.port)]
            replica = RedisServer(binary, extra_args=[*_FAST_SYNC, *follow])
            replica.start()
            self.servers.append(replica)
            _wait(
                "replication",
                lambda: _client(replica.port).info("replication")["master_link_status"] == "up",
            )
            self.sentinels = [_Sentinel(binary, self._dir, service, primary.port) for _ in range(3)]
            _wait("the Sentinels' quorum", self._ready)
        except BaseException:
            self.close()
            raise

    def _ready(self) -> bool:
        for s in self.sentinels:
            c = _client(s.port)
            if c.execute_command("SENTINEL", "CKQUORUM", self.service) is None:
                return False
            if len(c.execute_command("SENTINEL", "REPLICAS", self.service)) < 1:
                return False
            if len(c.execute_command("SENTINEL", "SENTINELS", self.service)) < 2:
                return False
        return True

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/SERVICE/0``."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def primary_port(self) -> int:
        """The port the Sentinels name as the primary now."""
        _host, port = _client(self.sentinels[0].port).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service
        )
        return int(port)

    def primary(self) -> redis.Redis:
        return _client(self.primary_port())

    def kill_primary(self) -> int:
        """SIGKILL the primary's process; its port."""
        port = self.primary_port()
        for server in self.servers:
            if server.port == port:
                server.kill()
                return port
        raise AssertionError(f"no server of this set on port {port}")

    def wait_failover(self, old_port: int) -> int:
        """Wait until every Sentinel names a new primary that accepts writes; its port."""

        def done() -> bool:
            ports = {
                int(_client(s.port).execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)[1])
                for s in self.sentinels
            }
            if len(ports) != 1 or old_port in ports:
                return False
            return _client(ports.pop()).info("replication")["role"] == "master"

        _wait("the Sentinels' failover", done)
        return self.primary_port()

    def flush(self) -> None:
        self.primary().flushall()

    def close(self) -> None:
        for s in self.sentinels:
            s.stop()
        for server in self.servers:
            server.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class RedisCluster:
    """A Redis Cluster of three primaries with one replica each (six processes)."""

    def __init__(self) -> None:
        binary = _binary()
        cli = shutil.which("redis-cli", path=os.path.dirname(binary)) or shutil.which("redis-cli")
        if cli is None:
            pytest.skip("redis-cli is not installed; Redis Cluster tests skipped")
        self.servers: list[RedisServer] = []
        try:
            for _ in range(6):
                server = RedisServer(
                    binary,
                    extra_args=[
                        *_FAST_SYNC,
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "1000",
                        # The bus port defaults to port + 10000, past 65535 for high ports.
                        "--cluster-port",
                        str(quiet_ports()[0]),
                    ],
                )
                server.start()
                self.servers.append(server)
            subprocess.run(
                [
                    cli,
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{s.port}" for s in self.servers),
                    "--cluster-replicas",
                    "1",
                    "--cluster-yes",
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            _wait("the Cluster's formation", self._ok)
        except BaseException:
            self.close()
            raise

    def _live(self) -> list[RedisServer]:
        return [s for s in self.servers if s.proc is not None]

    def _ok(self) -> bool:
        for s in self._live():
            info = _client(s.port).execute_command("CLUSTER", "INFO").decode()
            if "cluster_state:ok" not in info or "cluster_known_nodes:6" not in info:
                return False
            replication = _client(s.port).info("replication")
            if replication["role"] == "slave" and replication["master_link_status"] != "up":
                return False  # a replica that never synced cannot take over
        return True

    @property
    def url(self) -> str:
        """``redis+cluster://`` with two of the nodes as seeds."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.servers[:2])

    def owner_of(self, key: str) -> int:
        """The port of the primary that serves ``key``'s slot now."""
        c = _client(self._live()[0].port)
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise AssertionError(f"slot {slot} is not served")

    def client_for(self, key: str) -> redis.Redis:
        return _client(self.owner_of(key))

    def kill_primary(self, key: str) -> int:
        """SIGKILL the primary serving ``key``; its port."""
        port = self.owner_of(key)
        for server in self.servers:
            if server.port == port:
                server.kill()
                return port
        raise AssertionError(f"no node of this cluster on port {port}")

    def wait_failover(self, key: str, old_port: int) -> int:
        """Wait until ``key``'s slot is served by a promoted replica and the Cluster is
        ``ok`` again on every live node; the new primary's port."""

        def done() -> bool:
            return self.owner_of(key) != old_port and self._ok()

        _wait("the Cluster's failover", done)
        return self.owner_of(key)

    def flush(self) -> None:
        c = _client(self._live()[0].port)
        for _start, _end, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
            _client(int(primary[1])).flushall()

    def close(self) -> None:
        for server in self.servers:
            server.close()


@pytest.fixture(scope="module")
def redis_sentinels() -> Iterator[RedisSentinels]:
    """A Sentinel-watched primary and replica for the module (a test that kills the
    primary should start its own :class:`RedisSentinels`)."""
    setup = RedisSentinels()
    yield setup
    setup.close()


@pytest.fixture(scope="module")
def redis_cluster() -> Iterator[RedisCluster]:
    """A six-node Redis Cluster for the module."""
    setup = RedisCluster()
    yield setup
    setup.close()
