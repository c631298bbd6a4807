"""Keeping a pool answering while engines fail: passive outlier ejection, the retry budget,
and the idle/total watchdog of a streamed answer.

**Ejection.** Every failed engine call (connection error, engine 5xx, timeout; never a
client error or a client that went away) counts against its endpoint; every success resets
the run of failures. An endpoint with ``consecutive_failures`` in a row, or whose window of
``window_s`` holds at least ``min_requests`` with a failure share of ``failure_rate``, is
ejected: out of balancing for ``base_ejection_s`` times the number of its ejections (capped
at ``max_ejection_s``), then back at its next passing health probe. At most
``max_ejected_share`` of a pool is ejected at once, so detection can never empty a pool.

**Retry budget.** A retry is allowed while the pool's retries in flight are below
``max(min_retries, budget_ratio * requests in flight)`` (Envoy's retry budget): during an
outage that fails everything, retries add at most that share of load instead of
multiplying it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING

from shuniu.core.config import OutlierConfig, RetryConfig, TimeoutsConfig
from shuniu.core.timers import COARSE_FROM_S, TimerWheel

if TYPE_CHECKING:
    from shuniu.core.pools.pool import EndpointState, Pool

__all__ = ["COARSE_FROM_S", "Deadline", "DeadlineWheel", "Resilience", "Watchdog"]

log = logging.getLogger("shuniu.resilience")


class Resilience:
    """Ejection, retries and timeouts of one pool."""

    __slots__ = (
        "ejections",
        "gave_up",
        "outlier",
        "pool",
        "retries",
        "retries_by_reason",
        "retrying",
        "timeouts",
    )

    def __init__(
        self, pool: Pool, retries: RetryConfig, outlier: OutlierConfig, timeouts: TimeoutsConfig
    ) -> None:
        self.pool = pool
        self.retries = retries
        self.outlier = outlier
        self.timeouts = timeouts
        self.retrying = 0
        """Retry attempts in flight."""
        self.retries_by_reason: dict[str, int] = {}
        """Retries started, by the error code that caused them (for metrics)."""
        self.gave_up: dict[str, int] = {}
        """Failed attempts whose error went to the client instead of a retry, by why:
        ``max_retries``, ``no_alternative`` (every healthy endpoint tried), ``budget`` (the
        retry budget was spent), ``fallback_cannot_serve``."""
        self.ejections = 0

    # -- outcomes -------------------------------------------------------------------------

    def succeeded(self, endpoint: EndpointState, now: float) -> None:
        endpoint.failures_in_row = 0
        self._window(endpoint, now)
        endpoint.window_requests += 1

    def failed(self, endpoint: EndpointState, now: float) -> None:
        endpoint.failures_in_row += 1
        self._window(endpoint, now)
        endpoint.window_requests += 1
        endpoint.window_failures += 1
        if endpoint.ejected:
            return
        cfg = self.outlier
        reason = None
        if cfg.consecutive_failures is not None and endpoint.failures_in_row >= cfg.consecutive_failures:
            reason = f"{endpoint.failures_in_row} failures in a row"
        elif (
            cfg.failure_rate is not None
            and endpoint.window_requests >= cfg.min_requests
            and endpoint.window_failures >= cfg.failure_rate * endpoint.window_requests
        ):
            failed, seen = endpoint.window_failures, endpoint.window_requests
            reason = f"{failed} of {seen} requests failed in {cfg.window_s:g} s"
        if reason is not None:
            self._eject(endpoint, now, reason)

    def _window(self, endpoint: EndpointState, now: float) -> None:
        if now - endpoint.window_start >= self.outlier.window_s:
            endpoint.window_start = now
            endpoint.window_requests = 0
            endpoint.window_failures = 0

    def _eject(self, endpoint: EndpointState, now: float, reason: str) -> None:
        endpoints = self.pool.endpoints
        allowed = math.floor(self.outlier.max_ejected_share * len(endpoints))
        if sum(1 for e in endpoints if e.ejected) >= allowed:
            return
        endpoint.ejections += 1
        self.ejections += 1
        duration = min(self.outlier.base_ejection_s * endpoint.ejections, self.outlier.max_ejection_s)
        endpoint.ejected = True
        endpoint.ejected_until = now + duration
        endpoint.failures_in_row = 0
        endpoint.window_requests = endpoint.window_failures = 0
        log.warning(
            "endpoint %s ejected for %.0f s (ejection %d): %s",
            endpoint.name,
            duration,
            endpoint.ejections,
            reason,
        )

    def maybe_return(self, endpoint: EndpointState, now: float) -> bool:
        """After a passing health probe: end an ejection whose time is up."""
        if endpoint.ejected and now >= endpoint.ejected_until:
            endpoint.ejected = False
            log.warning("endpoint %s is back from ejection", endpoint.name)
            return True
        return False

    # -- retries --------------------------------------------------------------------------

    def budget_allows(self) -> bool:
        in_flight = sum(e.in_flight for e in self.pool.endpoints)
        return self.retrying < max(self.retries.min_retries, self.retries.budget_ratio * in_flight)

    def has_alternative(self, tried: frozenset[str]) -> bool:
        return any(
            e.name not in tried and e.healthy and not e.ejected and not e.draining
            for e in self.pool.endpoints
        )


class Watchdog:
    """Ends a streamed answer that goes quiet for ``idle_s`` or passes its deadline, by
    cancelling the handler task (the stream loop turns that into an SSE error event).
    Per chunk the stream only stores the time in :attr:`last`; one timer per request
    re-arms itself."""

    __slots__ = ("deadline", "fired", "handle", "idle_s", "last", "loop", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, idle_s: float | None, deadline: float | None) -> None:
        self.loop = loop
        self.idle_s = idle_s
        self.deadline = deadline
        self.task = asyncio.current_task(loop)
        self.last = loop.time()
        self.fired: str | None = None
        self.handle: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        at = math.inf
        if self.idle_s is not None:
            at = self.last + self.idle_s
        if self.deadline is not None:
            at = min(at, self.deadline)
        self.handle = self.loop.call_at(at, self._check)

    def _check(self) -> None:
        now = self.loop.time()
        if self.deadline is not None and now >= self.deadline:
            self._fire("total")
        elif self.idle_s is not None and now - self.last >= self.idle_s:
            self._fire("idle")
        else:
            self._arm()

    def _fire(self, kind: str) -> None:
        self.fired = kind
        self.handle = None
        if self.task is not None:
            self.task.cancel()

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


class Deadline:
    """One armed deadline of a :class:`DeadlineWheel`: it cancels the task that armed it."""

    __slots__ = ("bucket", "cancelling", "fired", "task")

    def __init__(self, task: asyncio.Task[object] | None) -> None:
        self.task = task
        self.bucket = 0
        self.cancelling = task.cancelling() if task is not None else 0
        """The task's pending cancellations when armed: one more when it fires is ours."""
        self.fired = False

    def expire(self) -> None:
        self.fired = True
        if self.task is not None:
            self.task.cancel()


class DeadlineWheel:
    """Deadlines of seconds or more (an attempt's time to its first output: 120 s by
    default) that cancel the task that armed them, kept by a
    :class:`~shuniu.core.timers.TimerWheel`.

    Why not ``asyncio.timeout`` per attempt: on Python 3.11 entering and leaving one cost
    about 36,000 interpreter instructions per request (a ``Timeout``, the current task, a
    timer handle made and cancelled), 13% of the whole in-process request path, for a limit
    that almost never fires. Arming here is one small object and one set insert. A deadline
    fires between its time and two ticks after it, cancelling the task that armed it; the
    caller turns that cancellation into a ``TimeoutError`` (see :meth:`expired`)."""

    __slots__ = ("wheel",)

    def __init__(self, loop: asyncio.AbstractEventLoop, tick_s: float = 0.25) -> None:
        self.wheel = TimerWheel(loop, tick_s)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.wheel.loop

    def arm(self, when: float) -> Deadline:
        """A deadline at ``when`` (the loop's clock) for the current task, which runs on
        this wheel's loop (a wheel serves one loop: the caller makes one per loop)."""
        deadline = Deadline(asyncio.current_task(self.wheel.loop))
        self.wheel.arm(deadline, when)
        return deadline

    def disarm(self, deadline: Deadline) -> None:
        """The guarded call ended (either way): forget the deadline. A deadline that fired
        while the call was completing has its cancellation taken back, as
        ``asyncio.timeout`` does."""
        self.wheel.disarm(deadline)
        task, deadline.task = deadline.task, None
        if deadline.fired and task is not None and task.cancelling() > deadline.cancelling:
            task.uncancel()

    @staticmethod
    def expired(deadline: Deadline) -> bool:
        """Whether a ``CancelledError`` that ended the guarded call was this deadline's own
        (then its cancellation is taken back, and the caller raises ``TimeoutError``);
        false when the task was (also) cancelled by someone else."""
        task = deadline.task
        if not deadline.fired or task is None:
            return False
        deadline.task = None
        return task.uncancel() <= deadline.cancelling
