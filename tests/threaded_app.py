"""An aiohttp app served from a daemon thread on 127.0.0.1, for test doubles that a real
``shuniu serve`` process (or the test itself) calls over HTTP."""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web

__all__ = ["ThreadedApp"]


class ThreadedApp:
    """Subclasses add their routes in :meth:`routes`; :meth:`start` returns once listening."""

    client_max_size = 1024**2

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application(client_max_size=self.client_max_size)
        self.routes(app)
        runner = web.AppRunner(app)
        self.loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def start(self) -> Self:
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
