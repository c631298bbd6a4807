"""An asyncio event loop on a virtual clock.

When nothing is ready to run, the loop does not wait: it moves its clock to the next timer.
Code written for real time (``asyncio.sleep``, ``call_later``, ``asyncio.timeout``) runs
unchanged, as fast as the CPU allows, which is how ``shuniu simulate`` runs the gateway's own
scheduler and balancer against simulated engines. No real I/O may happen on this loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import selectors
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["Stepper", "VirtualClockLoop", "run_virtual"]

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


_MAX_JUMP = 24 * 3600.0  # as asyncio's longest select timeout: a far timer is reached in steps


class _Call(asyncio.Handle):
    """A callback ready to run: asyncio's handle, made by the loop without its ``__init__``
    and debug checks (a simulation is not debugged through its loop, and makes one handle per
    callback: a Python-level call less each)."""

    __slots__ = ()


class _Timer(asyncio.TimerHandle):
    """A timer, made as :class:`_Call` is; the loop's heap holds it as ``(when, order,
    timer)``, so that timers due at the same time run in the order they were set."""

    __slots__ = ()


_new = object.__new__


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
        if self._closed:
            raise RuntimeError("Event loop is closed")
        timer = _new(_Timer)
        timer._context = context if context is not None else contextvars.copy_context()
        timer._loop = self
        timer._callback = callback
        timer._args = args
        timer._cancelled = False
        timer._repr = None
        timer._source_traceback = None
        timer._when = when
        timer._scheduled = True
        heapq.heappush(self._scheduled, (when, next(self._order), timer))  # type: ignore[arg-type]
        return timer

    def call_later(self, delay: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
        # call_at's body, and the handle made in place in both (and in call_soon): a call
        # per timer or callback costs more than these lines do (a run makes ~10 a request).
        if delay is None:
            raise TypeError("delay must not be None")
        if self._closed:
            raise RuntimeError("Event loop is closed")
        when = self._now + delay
        timer = _new(_Timer)
        timer._context = context if context is not None else contextvars.copy_context()
        timer._loop = self
        timer._callback = callback
        timer._args = args
        timer._cancelled = False
        timer._repr = None
        timer._source_traceback = None
        timer._when = when
        timer._scheduled = True
        heapq.heappush(self._scheduled, (when, next(self._order), timer))  # type: ignore[arg-type]
        return timer

    def call_soon(self, callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        # As asyncio's own call_soon, without its debug checks (the loop runs one per callback).
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = _new(_Call)
        handle._context = context if context is not None else contextvars.copy_context()
        handle._loop = self
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._repr = None
        handle._source_traceback = None
        self._ready.append(handle)
        return handle

    def _run_once(self) -> None:
        """One turn of the loop, as asyncio's: run what is ready, else jump the clock to the
        first timer; then every timer due by now becomes ready, and the callbacks ready at
        that moment run (those they schedule wait for the next turn). The timers are
        ``(when, order, timer)`` tuples, compared without a call into Python."""
        scheduled: list[tuple[float, int, asyncio.TimerHandle]] = self._scheduled  # type: ignore[assignment]
        ready = self._ready
        # Cancelled timers leave the heap as asyncio's loop drops them: all at once when
        # they are most of it, else as they reach its top.
        if len(scheduled) > 100 and self._timer_cancelled_count * 2 > len(scheduled):
            live = []
            for entry in scheduled:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False
                else:
                    live.append(entry)
            heapq.heapify(live)
            scheduled[:] = live
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][2]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)[2]._scheduled = False
        if not ready and not self._stopping:
            if not scheduled:
                raise RuntimeError(
                    "virtual-time loop: every task is waiting and no timer is pending (deadlock)"
                )
            jump = scheduled[0][0] - self._now
            if jump > 0:
                self._now += jump if jump < _MAX_JUMP else _MAX_JUMP
        end = self._now + self._clock_resolution
        while scheduled and scheduled[0][0] < end:
            timer = heapq.heappop(scheduled)[2]
            timer._scheduled = False
            ready.append(timer)
        popleft = ready.popleft
        for _ in range(len(ready)):
            handle = popleft()
            if handle._cancelled:
                continue
            try:
                handle._context.run(handle._callback, *handle._args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self.call_exception_handler(
                    {"message": f"Exception in callback {handle!r}", "exception": exc, "handle": handle}
                )
        handle = None  # break a cycle if a callback raised


class Stepper:
    """Runs a coroutine on the loop as a task would, without one: each future it awaits
    resumes it once done (a callback scheduled then, as a task's wake-up is), and what it
    returns or raises goes to ``done(value, exc)``. A simulation runs thousands of requests
    a second, each a few steps of the gateway's code with a wait or two between: a task per
    request (its object, its context, a coroutine frame per layer) cost about 1% of a run.

    Only for coroutines that need no task of their own: ``asyncio.timeout`` and
    ``asyncio.current_task`` do (a scheduler's ``admit`` waits with
    :func:`~shuniu.core.timers.cancel_at` instead)."""

    __slots__ = ("_coro", "_done", "_loop", "_must_cancel", "_waiting")

    def __init__(
        self, coro: Coroutine[Any, Any, Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        self._coro = coro
        self._done = done
        self._loop = asyncio.get_running_loop()
        self._waiting: asyncio.Future[Any] | None = None
        self._must_cancel = False

    def start(self) -> None:
        """Run the coroutine up to its first wait (or its end), now."""
        self._step()

    def wait(self, awaited: Any) -> None:
        """The coroutine, started by the caller, yielded ``awaited`` (what ``send`` returned):
        resume it as a task would."""
        if awaited is None:  # a bare yield (asyncio.sleep(0)): the next turn
            self._loop.call_soon(self._step)
            return
        awaited._asyncio_future_blocking = False
        self._waiting = awaited
        awaited.add_done_callback(self._step)

    def cancel(self) -> None:
        """As ``Task.cancel``: the awaited future is cancelled, or, when it cannot be, a
        :class:`asyncio.CancelledError` is thrown in at the next step."""
        awaited = self._waiting
        if awaited is None or not awaited.cancel():
            self._must_cancel = True

    def _step(self, _: Any = None) -> None:
        self._waiting = None
        try:
            if self._must_cancel:
                self._must_cancel = False
                awaited = self._coro.throw(asyncio.CancelledError())
            else:
                awaited = self._coro.send(None)
        except StopIteration as stop:
            self._done(stop.value, None)
        except BaseException as exc:
            self._done(None, exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        else:
            self.wait(awaited)


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
