"""Timers for limits: coarse ones that almost never fire (one event-loop timer for many of
them), and a wait's time limit that needs no task of its own.

A limit of seconds or minutes on every request (an attempt's time to its first output, an
engine call's total time) is armed and disarmed once per request and fires almost never.
``loop.call_at`` per request makes a ``TimerHandle``, pushes it on the loop's heap (a Python
comparison per level) and, once cancelled, leaves it there until the heap is cleaned; on
Python 3.11 that is thousands of interpreter instructions per request for nothing. A
:class:`TimerWheel` keeps such limits in buckets of ``tick_s`` and checks them with one timer
while any is armed: arming is a set insert, disarming a set removal.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

__all__ = ["COARSE_FROM_S", "TIMED_OUT", "Expiring", "TimerWheel", "cancel_at", "timed_out"]

COARSE_FROM_S = 5.0
"""Limits this long or longer may be kept by a :class:`TimerWheel` (at most two of its
default ticks late: under 10%); shorter ones by a precise timer of their own."""


class Expiring(Protocol):
    """What a :class:`TimerWheel` keeps: its bucket (set by :meth:`TimerWheel.arm`) and what
    to do when its time has passed."""

    bucket: int

    def expire(self) -> None:
        """The limit has passed (called once, from the wheel's timer)."""


class TimerWheel:
    """Items that expire at a time, kept in buckets of ``tick_s`` and checked by one timer
    while any is armed. An item expires between its time and two ticks after it."""

    __slots__ = ("buckets", "handle", "loop", "tick_s")

    def __init__(self, loop: asyncio.AbstractEventLoop, tick_s: float = 0.25) -> None:
        self.loop = loop
        self.tick_s = tick_s
        self.buckets: dict[int, set[Expiring]] = {}
        self.handle: asyncio.TimerHandle | None = None

    def arm(self, item: Expiring, when: float) -> None:
        """``item.expire()`` at about ``when`` (the loop's clock), unless disarmed first."""
        # Swept once the clock passes bucket * tick_s, which is later than ``when``.
        bucket = item.bucket = int(when / self.tick_s) + 1
        armed = self.buckets.get(bucket)
        if armed is None:
            armed = self.buckets[bucket] = set()
        armed.add(item)
        if self.handle is None:
            self.handle = self.loop.call_later(self.tick_s, self._sweep)

    def disarm(self, item: Expiring) -> None:
        """Forget ``item`` (armed or not, expired or not)."""
        armed = self.buckets.get(item.bucket)
        if armed is not None:
            armed.discard(item)
            if not armed:
                del self.buckets[item.bucket]

    def _sweep(self) -> None:
        self.handle = None
        due = int(self.loop.time() / self.tick_s)
        for bucket in [b for b in self.buckets if b <= due]:
            for item in self.buckets.pop(bucket):
                item.expire()
        if self.buckets:
            self.handle = self.loop.call_later(self.tick_s, self._sweep)


TIMED_OUT = "the wait's time limit passed"
"""The message of a future cancelled by :func:`cancel_at` (checked by identity)."""


def cancel_at(
    loop: asyncio.AbstractEventLoop, when: float, future: asyncio.Future[Any]
) -> asyncio.TimerHandle:
    """Cancel ``future`` with :data:`TIMED_OUT` at ``when`` (the loop's clock) unless it is
    done by then; cancel the returned handle once the wait is over.

    What ``async with asyncio.timeout_at(when): await future`` does, but without the task
    that ``asyncio.timeout`` needs: a scheduler's ``admit`` waits this way, so that the
    simulator can step it without a task per request
    (:class:`~shuniu.core.contracts.Scheduler`). The waiter sees a
    :class:`asyncio.CancelledError` for which :func:`timed_out` is true."""
    return loop.call_at(when, _cancel_if_pending, future)


def timed_out(exc: asyncio.CancelledError) -> bool:
    """Whether ``exc`` is the cancellation of a wait by :func:`cancel_at` (not of the task)."""
    return bool(exc.args) and exc.args[0] is TIMED_OUT


def _cancel_if_pending(future: asyncio.Future[Any]) -> None:
    if not future.done():
        future.cancel(TIMED_OUT)
