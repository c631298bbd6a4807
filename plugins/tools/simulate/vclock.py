"""An asyncio event loop on a virtual clock.

When nothing is ready to run, the loop does not wait: it moves its clock to the next timer.
Code written for real time (``asyncio.sleep``, ``call_later``, ``asyncio.timeout``) runs
unchanged, as fast as the CPU allows, which is how ``shuniu simulate`` runs the gateway's own
scheduler and balancer against simulated engines. No real I/O may happen on this loop.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["VirtualClockLoop", "run_virtual"]

T = TypeVar("T")


class _NoWaitSelector(selectors.BaseSelector):
    """Keeps the loop's self-pipe registered and turns every wait into a clock jump."""

    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}
        self.loop: VirtualClockLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, self._fileno(fileobj), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        assert self.loop is not None
        if timeout is None:
            raise RuntimeError("virtual-time loop: every task is waiting and no timer is pending (deadlock)")
        if timeout > 0:
            self.loop._now += timeout
        return []

    def close(self) -> None:
        self._map.clear()

    def get_map(self) -> Any:
        return self._map

    @staticmethod
    def _fileno(fileobj: Any) -> int:
        return fileobj if isinstance(fileobj, int) else fileobj.fileno()


class _Timer(asyncio.TimerHandle):
    """A timer that, due at the same time as another, runs after those set before it."""

    __slots__ = ("_order",)

    def __init__(self, order: int, *args: Any) -> None:
        super().__init__(*args)
        self._order = order

    def __lt__(self, other: Any) -> bool:
        if self._when == other._when and isinstance(other, _Timer):
            return self._order < other._order
        return self._when < other._when


class VirtualClockLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual and jumps to the next timer.

    Timers due at the same virtual time run in the order they were set (asyncio's own heap
    leaves such ties in an order that depends on every other timer pending): a simulation
    that groups an engine's iterations into fewer timers (decode leaps) then runs the same
    events in the same order as one that steps, and arrivals at the same millisecond keep
    their order."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._order = itertools.count()
        selector = _NoWaitSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
        # As asyncio's own call_at (no debug checks: a simulation is not debugged through
        # the loop), with a timer that keeps ties in order.
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()
        timer = _Timer(next(self._order), when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer


def run_virtual(main: Coroutine[Any, Any, T], start: float = 0.0) -> T:
    """Run ``main`` to completion on a fresh :class:`VirtualClockLoop`."""
    loop = VirtualClockLoop(start)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
