"""The virtual-time event loop: real-time asyncio code, no real waiting."""

from __future__ import annotations

import asyncio
import functools
import heapq
import json
import random
from typing import Any

import pytest

from shuniu.core.api.openai import parse_request
from shuniu.core.contracts import BackendBase
from shuniu.core.errors import GatewayError
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.types import Outcome
from shuniu.plugins.balancers.round_robin import RoundRobin
from shuniu.plugins.schedulers.fifo import FifoOptions, FifoScheduler
from shuniu.plugins.schedulers.priority import PriorityOptions, PriorityScheduler
from shuniu.plugins.tools.simulate import run_virtual
from shuniu.plugins.tools.simulate.vclock import Stepper, VirtualClockLoop


def test_sleeps_cost_no_wall_time_and_keep_order() -> None:
    order: list[tuple[str, float]] = []

    async def worker(name: str, delay: float, times: int) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(times):
            await asyncio.sleep(delay)
            order.append((name, loop.time()))

    async def main() -> float:
        await asyncio.gather(worker("a", 1.0, 3), worker("b", 1.5, 2))
        return asyncio.get_running_loop().time()

    end = run_virtual(main())
    assert end == pytest.approx(3.0)
    assert order[:3] == [("a", 1.0), ("b", 1.5), ("a", 2.0)]
    assert order[3:] == [("b", 3.0), ("a", 3.0)]  # equal times: in the order they were set


def test_timers_due_together_run_in_the_order_they_were_set() -> None:
    # asyncio's heap alone leaves ties in an order that depends on the other timers pending;
    # a simulation that sets fewer timers (decode leaps) must still see the same order.
    fired: list[int] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for i in range(200):
            loop.call_at(5.0 + (i % 7) * 1e-3, fired.append, i)  # 7 instants, many ties each
            loop.call_at(1.0 + i * 1e-4, lambda: None)  # other timers that reshape the heap
            if i % 3 == 0:
                loop.call_at(5.0 + (i % 7) * 1e-3, lambda: None).cancel()
        await asyncio.sleep(10)

    run_virtual(main())
    assert fired == sorted(range(200), key=lambda i: (i % 7, i))


def test_timeouts_work_in_virtual_time() -> None:
    async def main() -> str:
        try:
            async with asyncio.timeout(10):
                await asyncio.sleep(3600)
        except TimeoutError:
            return f"timed out at {asyncio.get_running_loop().time():g}"
        return "no"

    assert run_virtual(main()) == "timed out at 10"


def test_deadlock_is_reported() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(RuntimeError, match="deadlock"):
        run_virtual(main())


def test_a_day_passes_without_waiting_for_it() -> None:
    # On a real clock this would outlast the test timeout by far.
    async def main() -> float:
        for _ in range(24):
            await asyncio.sleep(3600)
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == 86400


def test_a_timer_set_for_next_week_is_reached() -> None:
    # The clock jumps at most a day per turn, as asyncio's select waits at most that long.
    async def main() -> float:
        await asyncio.sleep(7 * 86400 + 0.25)
        return asyncio.get_running_loop().time()

    assert run_virtual(main()) == pytest.approx(7 * 86400 + 0.25)


def test_a_failing_callback_is_reported_and_the_loop_goes_on() -> None:
    seen: list[dict[str, Any]] = []

    async def main() -> str:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, context: seen.append(context))
        loop.call_soon(lambda: 1 / 0)
        loop.call_later(1.0, lambda: [][0])
        await asyncio.sleep(2)
        return "went on"

    assert run_virtual(main()) == "went on"
    assert [type(c["exception"]) for c in seen] == [ZeroDivisionError, IndexError]


class _TieTimer(asyncio.TimerHandle):
    """The tie-ordered timer as asyncio's own heap would hold it (compared in Python)."""

    __slots__ = ("_order",)

    def __init__(self, order: int, *args: Any) -> None:
        super().__init__(*args)
        self._order = order

    def __lt__(self, other: Any) -> bool:
        if self._when == other._when:
            return self._order < other._order
        return self._when < other._when


class _StockTurnLoop(VirtualClockLoop):
    """The reference: asyncio's own loop turn, call_soon and call_later, the same clock and
    tie order."""

    _run_once = asyncio.BaseEventLoop._run_once  # type: ignore[assignment]
    call_soon = asyncio.BaseEventLoop.call_soon  # type: ignore[assignment]
    call_later = asyncio.BaseEventLoop.call_later  # type: ignore[assignment]

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
        timer = _TieTimer(next(self._order), when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer


def _program(loop: asyncio.AbstractEventLoop, seed: int) -> list[tuple[float, str]]:
    """A random mix of tasks, sleeps (ties and zero included), callbacks, timers cancelled
    in bulk and one by one, and futures resolved across tasks; the log of what ran when."""
    rng = random.Random(seed)
    log: list[tuple[float, str]] = []

    async def worker(name: str, inbox: asyncio.Future[int], outbox: asyncio.Future[int]) -> None:
        for step in range(40):
            op = rng.random()
            if op < 0.35:
                await asyncio.sleep(rng.choice((0, 0.001, 0.25, 0.25, 1 / 3, 2.0)))
            elif op < 0.5:
                loop.call_soon(log.append, (loop.time(), f"{name} soon {step}"))
            elif op < 0.7:
                timers = [
                    loop.call_later(
                        rng.choice((0.5, 0.5, 1.0, 7.0)), log.append, (-1.0, f"{name} timer {step}.{i}")
                    )
                    for i in range(rng.choice((1, 3, 150)))
                ]
                for timer in timers:
                    if rng.random() < 0.8:
                        timer.cancel()
            elif op < 0.8 and not outbox.done():
                outbox.set_result(step)
            elif op < 0.9 and inbox.done():
                log.append((loop.time(), f"{name} got {inbox.result()}"))
            else:
                await asyncio.sleep(0)
            log.append((loop.time(), f"{name} {step}"))

    async def main() -> None:
        futures = [loop.create_future() for _ in range(6)]
        await asyncio.gather(*(worker(f"w{i}", futures[i - 1], futures[i]) for i in range(6)))
        await asyncio.sleep(10)

    loop.run_until_complete(main())
    return log


def _on(loop: asyncio.AbstractEventLoop, program: Any, *args: Any) -> list[tuple[float, str]]:
    """``program(loop, *args)``'s log, with ``loop`` the current event loop meanwhile (then
    closed)."""
    asyncio.set_event_loop(loop)
    try:
        return program(loop, *args)  # type: ignore[no-any-return]
    finally:
        asyncio.set_event_loop(None)
        loop.close()


@pytest.mark.parametrize("seed", range(8))
def test_the_loop_turn_runs_what_asyncios_own_turn_runs_in_the_same_order(seed: int) -> None:
    logs = [_on(cls(), _program, seed) for cls in (VirtualClockLoop, _StockTurnLoop)]
    assert len(logs[0]) > 200
    assert logs[0] == logs[1]


def _stepped_program(loop: asyncio.AbstractEventLoop, seed: int, stepped: bool) -> list[tuple[float, str]]:
    """Workers that sleep (zero included), wait on futures other workers resolve, get
    cancelled while waiting and fail; each run by a task or by a :class:`Stepper` started
    where the task's first step would run. The log of what ran when, and how each ended."""
    rng = random.Random(seed)
    log: list[tuple[float, str]] = []
    futures = [loop.create_future() for _ in range(8)]

    async def worker(i: int) -> str:
        try:
            for step in range(30):
                op = rng.random()
                if op < 0.4:
                    await asyncio.sleep(rng.choice((0, 0, 0.001, 0.25, 1.0)))
                elif op < 0.6 and not futures[i].done():
                    futures[i].set_result(step)
                elif op < 0.8:
                    got = await futures[(i + 1) % len(futures)]
                    log.append((loop.time(), f"w{i} got {got}"))
                elif op < 0.81:
                    raise ValueError(f"w{i} failed at {step}")
                log.append((loop.time(), f"w{i} {step}"))
        except asyncio.CancelledError:
            log.append((loop.time(), f"w{i} cancelled"))
            raise
        return f"w{i} done"

    def ended(i: int, value: Any, exc: BaseException | None) -> None:
        log.append((loop.time(), f"w{i} ended {value!r} {type(exc).__name__}"))

    async def then(coro: Any, done: Any) -> None:
        # The task's way: what follows the awaited coroutine runs in the same step.
        try:
            value = await coro
        except BaseException as exc:
            done(None, exc)
        else:
            done(value, None)

    async def main() -> None:
        handles: list[Any] = []
        for i in range(len(futures)):
            if stepped:
                stepper = Stepper(worker(i), functools.partial(ended, i))
                loop.call_soon(stepper.start)  # where a new task's first step runs
                handles.append(stepper)
            else:
                handles.append(loop.create_task(then(worker(i), functools.partial(ended, i))))
        await asyncio.sleep(0.6)
        for handle in handles[::3]:
            handle.cancel()  # most are waiting on a future or a sleep by now
        await asyncio.sleep(30)
        for f in futures:
            if not f.done():
                f.set_result(-1)
        await asyncio.sleep(30)

    loop.run_until_complete(main())
    return log


@pytest.mark.parametrize("seed", range(6))
def test_a_stepper_runs_a_coroutine_where_and_when_its_task_would(seed: int) -> None:
    logs = [_on(VirtualClockLoop(), _stepped_program, seed, stepped) for stepped in (True, False)]
    ends = [line for _, line in logs[0] if " ended " in line]
    assert len(ends) == 8 and any("CancelledError" in e for e in ends) and any("'w" in e for e in ends)
    assert logs[0] == logs[1]


def _queue(kind: str, max_wait_s: float) -> Pool:
    endpoints = [EndpointState("e0", BackendBase(), max_concurrency=1)]
    if kind == "fifo":
        scheduler: Any = FifoScheduler(FifoOptions(max_wait_s=max_wait_s))
    else:
        scheduler = PriorityScheduler(PriorityOptions(max_wait_s=max_wait_s))
    return Pool("m", endpoints, RoundRobin(), scheduler)  # type: ignore[arg-type]


def _chat(i: int) -> Any:
    body = {"model": "m", "messages": [{"role": "user", "content": str(i)}]}
    return parse_request(json.dumps(body).encode(), "chat", f"r{i}", 0.0)


@pytest.mark.parametrize("kind", ["fifo", "priority"])
def test_a_schedulers_admission_waits_and_times_out_without_a_task(kind: str) -> None:
    """``steps_without_task``: the simulator steps a queued admission with a Stepper; its
    time limit, a slot handed over and a cancelled wait all work there."""
    outcomes: dict[str, tuple[float, Any, BaseException | None]] = {}

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = _queue(kind, max_wait_s=2.0)
        scheduler = pool.scheduler
        assert scheduler.steps_without_task  # type: ignore[attr-defined]
        held = await scheduler.admit(_chat(0), pool)

        def admit(name: str, i: int) -> Stepper:
            def done(value: Any, exc: BaseException | None) -> None:
                outcomes[name] = (loop.time(), value, exc)

            stepper = Stepper(scheduler.admit(_chat(i), pool), done)
            stepper.start()
            return stepper

        admit("times out", 1)
        await asyncio.sleep(1.0)
        admit("handed the slot", 2)
        cancelled = admit("cancelled", 3)
        await asyncio.sleep(1.5)  # the first one's limit passed at 2.0
        scheduler.release(held, Outcome.OK)  # the slot goes to the next waiter
        await asyncio.sleep(0.1)
        cancelled.cancel()
        await asyncio.sleep(0.1)
        scheduler.release(outcomes["handed the slot"][1], Outcome.OK)
        assert scheduler.queued == 0  # type: ignore[attr-defined]
        assert pool.endpoints[0].in_flight == 0

    run_virtual(main())
    when, _, exc = outcomes["times out"]
    assert when == 2.0 and isinstance(exc, GatewayError) and exc.code == "queue_timeout"
    when, ticket, exc = outcomes["handed the slot"]
    assert when == 2.5 and exc is None and ticket.endpoint.name == "e0"
    when, _, exc = outcomes["cancelled"]
    assert when == 2.6 and isinstance(exc, asyncio.CancelledError)
