"""A real DNS server for the tests: Debian's ``dnsmasq`` on a free loopback port,
authoritative for ``.test`` (``--local``: a name it does not know is NXDOMAIN, never
forwarded), its records in a hosts file the test rewrites (:meth:`DnsServer.set_hosts`
sends ``SIGHUP``, on which dnsmasq reads it again), with the TTL the test asks for.

The fixture skips the test, with the reason, when ``dnsmasq`` is not installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import quiet_ports

__all__ = ["DnsServer", "dns_server"]


class DnsServer:
    def __init__(self, directory: Path, *, ttl: int = 0, srv: list[str] | None = None) -> None:
        self.dir = directory
        self.hosts = directory / "hosts"
        self.hosts.write_text("")
        self.port = quiet_ports(udp=True)[0]
        self.ttl = ttl
        self.srv = srv or []
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> DnsServer:
        # The port was free for UDP and TCP when chosen, below the ephemeral range; should
        # it be taken meanwhile ("Address already in use"), take another.
        for _ in range(4):
            try:
                return self._start()
            except RuntimeError as exc:
                if "Address already in use" not in str(exc):
                    raise
                self.port = quiet_ports(udp=True)[0]
        return self._start()

    def restart(self, *, timeout: float = 30.0) -> None:
        """Start again on the same port after :meth:`stop` (a client knows only that one):
        while the port is still held, wait for it rather than take another."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._start()
                return
            except RuntimeError as exc:
                if "Address already in use" not in str(exc) or time.monotonic() > deadline:
                    raise
            time.sleep(0.1)

    def _start(self) -> DnsServer:
        exe = shutil.which("dnsmasq") or "/usr/sbin/dnsmasq"
        cmd = [
            exe,
            "--keep-in-foreground",
            f"--port={self.port}",
            "--listen-address=127.0.0.1",
            "--bind-interfaces",
            "--no-resolv",
            "--no-hosts",
            "--local=/test/",
            f"--addn-hosts={self.hosts}",
            f"--local-ttl={self.ttl}",
            "--pid-file=",
            f"--log-facility={self.dir / 'dnsmasq.log'}",
            *(f"--srv-host={s}" for s in self.srv),
        ]
        if os.geteuid() == 0:
            cmd.append("--user=root")  # keep reading the test's (private) hosts file
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"dnsmasq exited: {err}")
            if self._answers():
                return self
            time.sleep(0.05)
        raise RuntimeError("dnsmasq did not answer")

    def _answers(self) -> bool:
        # A bare query for "ready.test" (NXDOMAIN is an answer too).
        query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x05ready\x04test\x00\x00\x01\x00\x01"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.2)
            try:
                s.sendto(query, ("127.0.0.1", self.port))
                return s.recv(512)[:2] == b"\x12\x34"
            except OSError:
                return False

    def set_hosts(self, records: dict[str, list[str]]) -> None:
        """Replace the A/AAAA records (name → addresses) and have dnsmasq read them."""
        lines = [f"{a} {name}" for name, addresses in records.items() for a in addresses]
        self.hosts.write_text("\n".join(lines) + "\n")
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def dns_server(tmp_path: Path) -> Iterator[DnsServer]:
    if shutil.which("dnsmasq") is None and not Path("/usr/sbin/dnsmasq").exists():
        pytest.skip("dnsmasq is not installed (e.g. apt-get install dnsmasq); DNS discovery tests skipped")
    directory = tmp_path / "dns"
    directory.mkdir()
    server = DnsServer(directory).start()
    yield server
    server.stop()
