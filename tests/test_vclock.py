"""The virtual-time event loop: real-time asyncio code, no real waiting."""

from __future__ import annotations

import asyncio

import pytest

from shuniu.plugins.tools.simulate import run_virtual


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
