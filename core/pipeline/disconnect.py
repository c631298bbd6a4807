"""Noticing that the client went away while its request runs, so the engine call is
cancelled (the engine stops generating for nobody) and the slot is freed."""

from __future__ import annotations

import asyncio
from typing import Any

from shuniu.core.http.asgi import Receive

__all__ = ["Disconnect"]


class Disconnect:
    """Watches ``receive`` for the client going away and cancels the handler task."""

    __slots__ = ("disconnected", "finished", "task")

    def __init__(self) -> None:
        self.disconnected = False
        self.finished = False
        self.task: asyncio.Task[None] | None = None

    def start(self, receive: Receive) -> None:
        self.task = asyncio.get_running_loop().create_task(self._watch(receive, asyncio.current_task()))

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
        task, self.task = self.task, None
        if task is not None:
            task.cancel()
