"""Running the gateway on uvicorn's server loop (uvloop) with shuniu's HTTP protocol
(``core/http/protocol.py``), with a graceful drain on SIGTERM."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from shuniu.core.gateway import Gateway
from shuniu.core.http.protocol import gateway_protocol
from shuniu.core.http.workers import SUPERVISOR_ENV, WorkerInfo, end_with_supervisor

__all__ = ["bind_socket", "is_loopback", "run_gateway"]

log = logging.getLogger("shuniu.server")


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening socket with TCP_NODELAY set (Linux hands it to accepted sockets);
    ``reuse_port``: with ``SO_REUSEPORT``, so the workers of one gateway share the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if family == socket.AF_INET6 and host in ("::", "[::]"):
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _Server(uvicorn.Server):
    """uvicorn's server, telling the gateway it is draining as soon as a signal arrives."""

    def __init__(self, config: uvicorn.Config, gateway: Gateway) -> None:
        super().__init__(config)
        self.gateway = gateway

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.gateway.draining = True
        super().handle_exit(sig, frame)
        # uvicorn re-raises the signal after shutting down, so the process would end "killed
        # by SIGTERM"; a completed drain is a clean exit, so forget it.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()


def _unix_socket(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path.unlink(missing_ok=True)  # a restarted worker's predecessor left it
    sock.bind(str(path))
    sock.listen(256)
    sock.setblocking(False)
    return sock


def run_gateway(
    gateway: Gateway,
    host: str,
    port: int,
    *,
    on_ready: Callable[[str, int], None] | None = None,
    log_level: str = "warning",
    worker: WorkerInfo | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting and let in-flight requests finish
    within ``gateway.graceful_shutdown_s``. A ``worker`` of a supervised gateway shares the
    port with the others and serves on its Unix socket too (the others gather from it)."""
    if worker is not None and (supervisor := os.environ.get(SUPERVISOR_ENV)):
        end_with_supervisor(int(supervisor))
    sock = bind_socket(host, port, reuse_port=worker is not None)
    sockets = [sock]
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        gateway.app,
        loop="uvloop",
        # uvicorn's server loop (sockets, lifespan, signals, graceful shutdown) runs shuniu's
        # own HTTP/1.1 protocol: lean per request, with slow-client timeouts, header limits
        # on the wire and a connection cap (core/http/protocol.py).
        http=gateway_protocol(gateway.config.gateway),
        lifespan="on",
        log_level=log_level,
        access_log=False,
        timeout_graceful_shutdown=gateway.config.gateway.graceful_shutdown_s,
        timeout_keep_alive=gateway.config.gateway.keep_alive_s,
        server_header=False,
        date_header=False,
        # Nothing reads the client address yet; skip uvicorn's X-Forwarded-For middleware.
        proxy_headers=False,
    )
    server = _Server(config, gateway)

    async def main() -> None:
        if worker is not None:
            # Bound last: its existence tells the supervisor this worker is listening.
            sockets.append(_unix_socket(worker.socket()))
        serving = asyncio.create_task(server.serve(sockets=sockets))
        # uvicorn has no start-up callback; poll its flag (start-up only, never per request).
        while not server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if server.started:
            # SIGHUP: re-read the deployment file and apply it (docs/high-availability.md).
            loop = asyncio.get_running_loop()
            reloads: set[asyncio.Task[None]] = set()

            def on_hup() -> None:
                task = loop.create_task(gateway.reload_logged())
                reloads.add(task)
                task.add_done_callback(reloads.discard)

            loop.add_signal_handler(signal.SIGHUP, on_hup)
            if on_ready is not None:
                on_ready(host, bound_port)
        await serving

    with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
        runner.run(main())
