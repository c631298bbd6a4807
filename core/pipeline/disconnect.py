"""Noticing that the client went away while its request runs, so the engine call is
cancelled (the engine stops generating for nobody) and the slot is freed."""

from __future__ import annotations

import asyncio
from typing import Any

from shuniu.core.http.asgi import Receive, Scope
from shuniu.core.http.protocol import DISCONNECT_EXTENSION

__all__ = ["Disconnect"]


class Disconnect:
    """Cancels the handler task when the client goes away: told by the server (the
    ``shuniu.disconnect`` scope extension of shuniu's HTTP protocol), or, under another
    ASGI server, by a task that waits in ``receive`` for ``http.disconnect``."""

    __slots__ = ("disconnected", "finished", "forget", "handler", "task")

    def __init__(self) -> None:
        self.disconnected = False
        self.finished = False
        self.task: asyncio.Task[None] | None = None
        self.handler: asyncio.Task[Any] | None = None
        self.forget: Any = None

    def start(self, scope: Scope, receive: Receive, loop: asyncio.AbstractEventLoop) -> None:
        """Watch the client of the request being handled on ``loop`` (the running loop)."""
        extensions = scope.get("extensions")
        watch = extensions.get(DISCONNECT_EXTENSION) if extensions else None
        if watch is not None:
            self.handler = asyncio.current_task(loop)
            self.forget = watch(self._gone)
            return
        self.task = loop.create_task(self._watch(receive, asyncio.current_task(loop)))

    def _gone(self) -> None:
        handler, self.handler = self.handler, None
        if not self.finished and handler is not None:
            self.disconnected = True
            handler.cancel()

    async def _watch(self, receive: Receive, handler: asyncio.Task[Any] | None) -> None:
        # Swallowing our own cancellation (and dropping the task reference in stop) keeps
        # each request from leaving a reference cycle (exception → traceback → frame → self)
        # for the cyclic GC, whose full passes were the gateway's worst latency tail.
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not self.finished and handler is not None:
                        self.disconnected = True
                        handler.cancel()
                    return
        except asyncio.CancelledError:
            return
        finally:
            handler = None

    def stop(self) -> None:
        self.finished = True
        self.handler = None
        forget, self.forget = self.forget, None
        if forget is not None:
            forget()
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
