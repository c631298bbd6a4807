"""``fifo``: one first-come, first-served queue per pool, with a length and a wait limit."""

from __future__ import annotations

import asyncio
import collections
import math

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import PoolView, RegisterScheduler, Scheduler, Ticket
from shuniu.core.errors import GatewayError, no_healthy_endpoint
from shuniu.core.running_loop import running_loop
from shuniu.core.timers import cancel_at, timed_out
from shuniu.core.types import InferenceRequest, Outcome

__all__ = ["FifoOptions", "FifoScheduler"]


class FifoOptions(Options):
    max_queue: int = Field(1024, ge=0)
    """Requests allowed to wait for a free endpoint slot; more are refused with 429."""
    max_wait_s: float = Field(60.0, gt=0)
    """Longest a request may wait in the queue before it is refused with 503."""


class _Waiter:
    __slots__ = ("future", "request")

    def __init__(self, request: InferenceRequest, future: asyncio.Future[Ticket]) -> None:
        self.request = request
        self.future = future


class FifoScheduler(Scheduler):
    """Dispatches at once while an endpoint has a free slot; otherwise queues in order."""

    steps_without_task = True  # admit waits on a timer of its own (core.timers.cancel_at)

    def __init__(self, options: FifoOptions | None = None) -> None:
        self.options = options or FifoOptions()
        self._queue: collections.deque[_Waiter] = collections.deque()

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def admit(self, req: InferenceRequest, pool: PoolView) -> Ticket:
        loop = running_loop()
        if not self._queue:
            ticket = pool.try_dispatch(req, loop.time())
            if ticket is not None:
                return ticket
        if not pool.has_healthy():
            raise no_healthy_endpoint(pool.name)
        if len(self._queue) >= self.options.max_queue:
            raise GatewayError(
                429,
                f"The queue for `{pool.name}` is full ({self.options.max_queue} waiting); retry later.",
                type="rate_limit_error",
                code="queue_full",
                headers={"retry-after": "1"},
            )
        waiter = _Waiter(req, loop.create_future())
        self._queue.append(waiter)
        future = waiter.future
        # A timer that cancels the wait, not asyncio.timeout: admit then needs no task (the
        # simulator steps it without one); not wait_for, which on 3.11 can lose a racing
        # cancellation.
        limit_timer = cancel_at(loop, loop.time() + self.options.max_wait_s, future)
        try:
            return await future
        except asyncio.CancelledError as exc:
            if not timed_out(exc):
                # The client left while queued. If a slot was handed over meanwhile, give it back.
                if future.done() and not future.cancelled():
                    self.release(future.result(), Outcome.CANCELLED)
                else:
                    future.cancel()
                raise
        finally:
            limit_timer.cancel()
        # The time limit passed (a slot handed over at that very moment was taken: the timer
        # only cancels a wait still pending).
        raise GatewayError(
            503,
            f"No endpoint of `{pool.name}` could take the request within {self.options.max_wait_s:g} s.",
            type="server_error",
            code="queue_timeout",
            headers={"retry-after": str(max(1, math.ceil(self.options.max_wait_s / 10)))},
        ) from None

    def release(self, ticket: Ticket, outcome: Outcome) -> None:
        if ticket.pool.free(ticket, outcome):
            self._dispatch_pool(ticket.pool)

    def wake(self, pool: PoolView) -> None:
        self._dispatch_pool(pool)

    def _dispatch_pool(self, pool: PoolView) -> None:
        queue = self._queue
        now = asyncio.get_running_loop().time() if queue else 0.0
        while queue:
            waiter = queue[0]
            if waiter.future.done():  # timed out or cancelled
                queue.popleft()
                continue
            ticket = pool.try_dispatch(waiter.request, now)
            if ticket is None:
                return
            queue.popleft()
            waiter.future.set_result(ticket)


@hookimpl
def register_schedulers(register: RegisterScheduler) -> None:
    register(
        "fifo",
        FifoScheduler,
        options=FifoOptions,
        description="First come, first served, with queue-length and wait limits.",
    )
