"""The ``fifo`` scheduler and ``round_robin`` balancer on real pools (no HTTP)."""

from __future__ import annotations

import asyncio
import json

import pytest

from shuniu.core.api.openai import parse_request
from shuniu.core.contracts import BackendBase
from shuniu.core.errors import GatewayError
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.types import Outcome
from shuniu.plugins.balancers.round_robin import RoundRobin
from shuniu.plugins.schedulers.fifo import FifoOptions, FifoScheduler


def _req(i: int):  # type: ignore[no-untyped-def]
    body = {"model": "m", "messages": [{"role": "user", "content": str(i)}]}
    return parse_request(json.dumps(body).encode(), "chat", f"r{i}", 0.0)


def _pool(slots: list[int], **opts: object) -> Pool:
    endpoints = [EndpointState(f"e{i}", BackendBase(), max_concurrency=s) for i, s in enumerate(slots)]
    return Pool("m", endpoints, RoundRobin(), FifoScheduler(FifoOptions(**opts)))  # type: ignore[arg-type]


async def test_round_robin_spreads_and_respects_slots() -> None:
    pool = _pool([2, 2])
    tickets = [await pool.scheduler.admit(_req(i), pool) for i in range(4)]
    assert [t.endpoint.name for t in tickets] == ["e0", "e1", "e0", "e1"]
    assert [e.in_flight for e in pool.endpoints] == [2, 2]
    for t in tickets:
        pool.scheduler.release(t, Outcome.OK)
        pool.scheduler.release(t, Outcome.OK)  # releasing twice is harmless
    assert [e.in_flight for e in pool.endpoints] == [0, 0]
    assert [e.completed for e in pool.endpoints] == [2, 2]


async def test_waiters_are_served_in_arrival_order() -> None:
    pool = _pool([1])
    first = await pool.scheduler.admit(_req(0), pool)
    order: list[int] = []

    async def wait(i: int) -> None:
        t = await pool.scheduler.admit(_req(i), pool)
        order.append(i)
        await asyncio.sleep(0)
        pool.scheduler.release(t, Outcome.OK)

    tasks = [asyncio.create_task(wait(i)) for i in range(1, 6)]
    await asyncio.sleep(0)
    assert pool.scheduler.queued == 5  # type: ignore[attr-defined]
    pool.scheduler.release(first, Outcome.OK)
    await asyncio.gather(*tasks)
    assert order == [1, 2, 3, 4, 5]
    assert pool.endpoints[0].in_flight == 0


async def test_queue_full_is_429_with_retry_after() -> None:
    pool = _pool([1], max_queue=1)
    held = await pool.scheduler.admit(_req(0), pool)
    queued = asyncio.create_task(pool.scheduler.admit(_req(1), pool))
    await asyncio.sleep(0)
    with pytest.raises(GatewayError) as info:
        await pool.scheduler.admit(_req(2), pool)
    assert info.value.status == 429 and info.value.headers["retry-after"]
    pool.scheduler.release(held, Outcome.OK)
    pool.scheduler.release(await queued, Outcome.OK)


async def test_queue_timeout_is_503_and_leaves_the_queue() -> None:
    pool = _pool([1], max_wait_s=0.05)
    held = await pool.scheduler.admit(_req(0), pool)
    with pytest.raises(GatewayError) as info:
        await pool.scheduler.admit(_req(1), pool)
    assert info.value.status == 503 and info.value.code == "queue_timeout"
    pool.scheduler.release(held, Outcome.OK)
    assert pool.endpoints[0].in_flight == 0
    again = await pool.scheduler.admit(_req(2), pool)
    assert again.endpoint.in_flight == 1


async def test_cancelled_waiter_does_not_leak_a_slot() -> None:
    pool = _pool([1])
    held = await pool.scheduler.admit(_req(0), pool)
    waiter = asyncio.create_task(pool.scheduler.admit(_req(1), pool))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    pool.scheduler.release(held, Outcome.OK)
    assert pool.endpoints[0].in_flight == 0


async def test_unhealthy_pool_is_503_and_recovery_wakes_waiters() -> None:
    pool = _pool([1, 1])
    for e in pool.endpoints:
        pool.set_healthy(e, False)
    with pytest.raises(GatewayError) as info:
        await pool.scheduler.admit(_req(0), pool)
    assert info.value.status == 503 and info.value.code == "no_healthy_endpoint"
    pool.set_healthy(pool.endpoints[0], True)
    held = await pool.scheduler.admit(_req(1), pool)
    waiter = asyncio.create_task(pool.scheduler.admit(_req(2), pool))
    await asyncio.sleep(0)
    assert not waiter.done()
    pool.set_healthy(pool.endpoints[1], True)  # capacity appears: the waiter is dispatched
    ticket = await asyncio.wait_for(waiter, 1)
    assert ticket.endpoint.name == "e1"
    pool.scheduler.release(held, Outcome.ERROR)
    assert pool.endpoints[0].errors == 1
