"""The rate-limit stores: one conformance suite run against the memory store (with a clock
the test moves) and the Redis store (against a real ``redis-server``), then what only one
of them has: sweeping and eviction in memory; atomicity across clients, key expiry, and the
failure modes (closed, open, paused server, wrong password, replay) in Redis.

Redis's clock cannot be moved, so tests that need no refill use per-day limits (a second of
test time refills 1/86400 of a limit) and tests of refill use short periods with bounds
that tolerate scheduling but would fail for a wrong interval.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from shuniu.core.contracts import Decision, Lease, Rate
from shuniu.core.extras import MissingExtraError
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.urls import redact_url
from shuniu.plugins.ratelimit.memory import MemoryRateLimitOptions, MemoryRateLimitStore
from shuniu.plugins.ratelimit.redis_store import RedisRateLimitOptions, RedisRateLimitStore
from shuniu.plugins.tools.simulate import run_virtual
from tests.redis_server import RedisServer

DAY = 86400.0
LOGGER = "shuniu.ratelimit"


class FakeClock:
    """A monotonic clock that moves only when told."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Harness:
    """A store under test, and how to let time pass for it."""

    def __init__(self, kind: str, store: Any, clock: FakeClock | None = None) -> None:
        self.kind = kind
        self.store = store
        self.clock = clock

    async def acquire(
        self, rates: Sequence[Rate], leases: Sequence[Lease] = (), token: str = "t"
    ) -> Decision:
        return await self.store.acquire(rates, leases, token)

    async def settle(
        self, adjust: Sequence[tuple[Rate, float]], leases: Sequence[Lease] = (), token: str = "t"
    ) -> None:
        await self.store.settle(adjust, leases, token)

    async def left(self, rate: Rate) -> float:
        """Units the key has left (a cost-0 check records nothing)."""
        d = await self.acquire([Rate(rate.key, rate.limit, rate.period_s, 0)])
        assert d.allowed
        return d.remaining[0]


@pytest.fixture(params=["memory", "redis", "redis-py"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Harness]:
    """The memory store, and the Redis store with each of its clients (the lean pipelined
    one, ``shuniu``, and redis-py)."""
    if request.param == "memory":
        clock = FakeClock()
        yield Harness("memory", MemoryRateLimitStore(clock=clock), clock)
        return
    url = request.getfixturevalue("redis_url")
    client = "redis-py" if request.param == "redis-py" else "shuniu"
    redis_store = RedisRateLimitStore(RedisRateLimitOptions(url=url, client=client))
    yield Harness("redis", redis_store)
    assert not redis_store.degraded
    await redis_store.close()


async def until(check: Callable[[], Awaitable[Any]], within: float = 3.0, interval: float = 0.005) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s (last: {value!r})")
        await asyncio.sleep(interval)


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and text in r.getMessage()
    ]


# -- conformance: both stores ------------------------------------------------------------------


async def test_burst_up_to_the_limit_then_refusal_with_retry_after_one_interval(store: Harness) -> None:
    rate = Rate("k:a:rpd", 5, DAY, 1)
    for left in (4, 3, 2, 1, 0):
        d = await store.acquire([rate])
        assert d.allowed and not d.degraded
        assert d.remaining == (left,)
    refused = await store.acquire([rate])
    assert not refused.allowed and refused.denied == "k:a:rpd"
    assert refused.retry_after_s == pytest.approx(DAY / 5, abs=0.5)
    assert refused.remaining == (0,)
    assert refused.reset_s[0] == pytest.approx(DAY, abs=0.5)
    again = await store.acquire([rate])  # the refusal recorded nothing
    assert again.retry_after_s == pytest.approx(refused.retry_after_s, abs=0.5)


async def test_refill_after_the_retry_interval(store: Harness) -> None:
    # One unit per second: the eleven round trips to Redis (whose clock counts) take far
    # less than half of it even on a loaded machine.
    rate = Rate("k:a:rps", 10, 10.0, 1)
    for _ in range(10):
        assert (await store.acquire([rate])).allowed
    refused = await store.acquire([rate])
    assert not refused.allowed
    wait = refused.retry_after_s
    assert 0.5 < wait <= 1.0 + 1e-6
    if store.clock is not None:
        store.clock.advance(wait - 0.001)
        assert not (await store.acquire([rate])).allowed
        store.clock.advance(0.001)
        assert (await store.acquire([rate])).allowed
        return
    # Redis keeps the clock: asked again at once, it still refuses and says a little less;
    # once allowed, one interval (one unit) came back, not a whole period's worth.
    again = await store.acquire([rate])
    assert not again.allowed and 0 < again.retry_after_s <= wait

    async def allowed() -> Decision | None:
        d = await store.acquire([rate])
        return d if d.allowed else None

    first = await until(allowed, within=5.0, interval=0.002)
    assert first.remaining[0] < 5  # a period's worth would have refilled all 10


async def test_fractional_interval_still_bursts_exactly_the_limit(store: Harness) -> None:
    rate = Rate("k:a:third", 3, 1.0, 1)  # T = 1/3 s: sums of T are not exact in binary
    assert all([(await store.acquire([rate])).allowed for _ in range(3)])
    assert not (await store.acquire([rate])).allowed


async def test_costs_are_units_of_the_limit(store: Harness) -> None:
    tokens = Rate("k:a:tpd", 1000, DAY, 600)
    d = await store.acquire([tokens])
    assert d.allowed and d.remaining == (400,)
    big = Rate("k:a:tpd", 1000, DAY, 500)
    refused = await store.acquire([big])
    assert not refused.allowed and refused.remaining == (400,)
    assert refused.retry_after_s == pytest.approx(100 * DAY / 1000, abs=0.5)  # the 100 missing units
    d = await store.acquire([Rate("k:a:tpd", 1000, DAY, 400)])
    assert d.allowed and d.remaining == (0,)


async def test_all_or_nothing_across_rates_and_leases(store: Harness) -> None:
    key_rate = Rate("k:a:rpd", 10, DAY, 1)
    tenant_rate = Rate("t:a:rpd", 2, DAY, 1)
    for _ in range(2):
        assert (await store.acquire([key_rate, tenant_rate])).allowed
    refused = await store.acquire([key_rate, tenant_rate])
    assert not refused.allowed and refused.denied == "t:a:rpd"
    assert refused.remaining == (8, 0)  # before this request: the key's allowance is untouched
    assert await store.left(key_rate) == 8

    lease = Lease("k:a:conc", 1)
    assert (await store.acquire([key_rate], [lease], token="r1")).allowed
    refused = await store.acquire([key_rate], [lease], token="r2")
    assert not refused.allowed and refused.denied == "k:a:conc"
    assert refused.retry_after_s == 1.0
    assert refused.remaining == (7,)
    assert await store.left(key_rate) == 7


async def test_the_longest_refusal_is_reported(store: Harness) -> None:
    per_day = Rate("k:a:rpd", 1, DAY, 1)
    per_minute = Rate("k:a:rpm", 10, 60.0, 1)
    assert (await store.acquire([per_minute, per_day])).allowed
    for _ in range(9):
        await store.acquire([per_minute])
    refused = await store.acquire([per_minute, per_day])
    assert not refused.allowed
    assert refused.denied == "k:a:rpd"  # waiting 6 s for the minute would not help
    assert refused.retry_after_s == pytest.approx(DAY, abs=0.5)


async def test_settle_gives_back_and_takes_more(store: Harness) -> None:
    tokens = Rate("k:a:tpd", 1000, DAY, 1000)
    assert (await store.acquire([tokens])).allowed
    assert not (await store.acquire([Rate("k:a:tpd", 1000, DAY, 1)])).allowed
    await store.settle([(tokens, -400.0)])  # the request used 600 of its 1000
    d = await store.acquire([Rate("k:a:tpd", 1000, DAY, 400)])
    assert d.allowed and d.remaining == (0,)
    assert not (await store.acquire([Rate("k:a:tpd", 1000, DAY, 1)])).allowed

    other = Rate("k:b:tpd", 1000, DAY, 100)
    assert (await store.acquire([other])).remaining == (900,)
    await store.settle([(other, 500.0)])  # used 500 more than reserved
    assert await store.left(other) == 400
    await store.settle([(other, -10_000.0)])  # a refund never makes more than the limit
    assert await store.left(other) == 1000

    absent = Rate("k:c:tpd", 1000, DAY, 1)
    await store.settle([(absent, -300.0)])  # nothing booked: nothing to give back
    assert await store.left(absent) == 1000
    await store.settle([(absent, 300.0)])  # a charge on a fresh key starts from now
    assert await store.left(absent) == 700


async def test_leases_limit_concurrency_and_release_is_idempotent(store: Harness) -> None:
    lease = Lease("k:a:conc", 2)
    assert (await store.acquire([], [lease], "r1")).allowed
    assert (await store.acquire([], [lease], "r2")).allowed
    refused = await store.acquire([], [lease], "r3")
    assert not refused.allowed and refused.denied == "k:a:conc" and refused.retry_after_s == 1.0
    assert refused.remaining == () and refused.reset_s == ()

    await store.settle([], [lease], "r1")
    assert (await store.acquire([], [lease], "r3")).allowed
    await store.settle([], [lease], "r1")  # again: no-op
    await store.settle([], [lease], "unknown")  # never held: no-op
    assert not (await store.acquire([], [lease], "r4")).allowed  # r2 and r3 still hold it

    await store.settle([], [lease], "r2")
    await store.settle([], [lease], "r3")
    assert (await store.acquire([], [lease], "r4")).allowed
    assert (await store.acquire([], [lease], "r5")).allowed


async def test_a_cost_above_the_limit_never_passes(store: Harness) -> None:
    refused = await store.acquire([Rate("k:a:tpd", 10, DAY, 11)])
    assert not refused.allowed and refused.denied == "k:a:tpd"
    assert math.isinf(refused.retry_after_s)
    assert refused.remaining == (10,)
    d = await store.acquire([Rate("k:a:tpd", 10, DAY, 10)])  # nothing was recorded
    assert d.allowed and d.remaining == (0,)


async def test_remaining_and_reset(store: Harness) -> None:
    rate = Rate("k:a:rpm", 4, 60.0, 1)
    started = time.monotonic()

    def near(value: float, expected: float) -> bool:
        # Redis's clock runs on between the calls: by at most the time since the first.
        return expected - (time.monotonic() - started) - 0.05 <= value <= expected + 0.05

    d = await store.acquire([rate])
    assert d.remaining == (3,) and near(d.reset_s[0], 15.0)
    d = await store.acquire([rate])
    assert d.remaining == (2,) and near(d.reset_s[0], 30.0)
    d = await store.acquire([Rate("k:a:rpm", 4, 60.0, 2)])
    assert d.remaining == (0,) and near(d.reset_s[0], 60.0)
    refused = await store.acquire([rate])
    assert refused.remaining == (0,) and near(refused.reset_s[0], 60.0)
    assert near(refused.retry_after_s, 15.0)
    assert (await store.acquire([], [], "t")).allowed  # nothing to check: allowed


async def test_a_key_given_twice_in_one_call_counts_twice(store: Harness) -> None:
    rate = Rate("k:a:rpd", 3, DAY, 2)
    refused = await store.acquire([rate, rate])
    assert not refused.allowed and refused.remaining == (3, 3)
    d = await store.acquire([Rate("k:a:rpd", 3, DAY, 1), Rate("k:a:rpd", 3, DAY, 1)])
    assert d.allowed and d.remaining == (2, 1)


# -- memory only -------------------------------------------------------------------------------


async def test_memory_leases_expire_after_their_ttl() -> None:
    clock = FakeClock()
    store = MemoryRateLimitStore(clock=clock)
    lease = Lease("k:a:conc", 1, ttl_s=10.0)
    assert (await store.acquire([], [lease], "r1")).allowed
    assert not (await store.acquire([], [lease], "r2")).allowed
    clock.advance(10.001)  # r1 never settled (a bug elsewhere): its lease lapses
    assert (await store.acquire([], [lease], "r2")).allowed


async def test_memory_sweeps_keys_that_have_refilled() -> None:
    clock = FakeClock()
    store = MemoryRateLimitStore(clock=clock)
    for i in range(5000):
        await store.acquire([Rate(f"k:{i}:rps", 10, 1.0, 1)], [], "t")
    clock.advance(1.0)  # every key is full again
    for i in range(4000):  # the dict doubles (8192 keys) on the way: a sweep
        await store.acquire([Rate(f"k:new{i}:rps", 10, 1.0, 1)], [], "t")
    assert len(store) == 4000
    # the sweep kept live state
    refused = await store.acquire([Rate("k:new0:rps", 10, 1.0, 10)], [], "t")
    assert not refused.allowed


async def test_memory_over_max_keys_forgets_the_keys_closest_to_full(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    store = MemoryRateLimitStore(MemoryRateLimitOptions(max_keys=10), clock=clock)
    with caplog.at_level(logging.WARNING, LOGGER):
        for i in range(30):
            await store.acquire([Rate(f"k:{i}:rpd", 100, DAY, i + 1)], [], "t")  # later keys owe more
            assert len(store) <= 10
    assert len(warnings_of(caplog, "max_keys: 10")) == 1
    assert left_now(store, "k:29:rpd") == 70  # the most recently and most used is kept
    assert left_now(store, "k:0:rpd") == 100  # forgotten: starts over


def left_now(store: MemoryRateLimitStore, key: str) -> float:
    d = store.acquire_now([Rate(key, 100, DAY, 0)], [], "t")
    return d.remaining[0]


async def test_memory_scale_multiplies_limits() -> None:
    store = MemoryRateLimitStore(clock=FakeClock(), scale=0.5)
    rate = Rate("k:a:rpd", 10, DAY, 1)
    assert sum([(await store.acquire([rate], [], "t")).allowed for _ in range(10)]) == 5
    lease = Lease("k:a:conc", 1)  # a scaled concurrency limit keeps at least one
    assert (await store.acquire([], [lease], "r1")).allowed
    assert not (await store.acquire([], [lease], "r2")).allowed


# -- Redis only --------------------------------------------------------------------------------


async def test_redis_is_atomic_across_clients(redis_url: str) -> None:
    # Atomicity, not latency: 400 acquires at once can take longer than the default 0.25 s
    # on a loaded 2-core machine, and a timed-out acquire is decided degraded (it flaked).
    stores = [
        RedisRateLimitStore(RedisRateLimitOptions(url=redis_url, client=client, timeout_s=30))
        for client in ("shuniu", "redis-py")
    ]
    rate = Rate("k:a:rpd", 150, DAY, 1)
    lease = Lease("k:a:conc", 7)
    try:
        decisions = await asyncio.gather(*(stores[i % 2].acquire([rate], [], f"r{i}") for i in range(400)))
        assert sum(d.allowed for d in decisions) == 150
        assert not any(d.degraded for d in decisions)
        decisions = await asyncio.gather(*(stores[i % 2].acquire([], [lease], f"r{i}") for i in range(100)))
        assert sum(d.allowed for d in decisions) == 7
    finally:
        for s in stores:
            await s.close()


async def test_redis_keys_are_prefixed_and_expire(redis_url: str) -> None:
    from redis import asyncio as aioredis

    store = RedisRateLimitStore(RedisRateLimitOptions(url=redis_url, key_prefix="test:pfx:"))
    client = aioredis.Redis.from_url(redis_url)
    rate = Rate("k:a:rpd", 10, DAY, 1)
    lease = Lease("k:a:conc", 2, ttl_s=30.0)
    try:
        assert (await store.acquire([rate], [lease], "r1")).allowed
        assert set(await client.keys("*")) == {b"test:pfx:k:a:rpd", b"test:pfx:k:a:conc"}
        # the tat key lives until it has refilled: one request = one interval of 8640 s
        assert 8_639_000 < await client.pttl("test:pfx:k:a:rpd") <= 8_640_000
        assert 29_000 < await client.pttl("test:pfx:k:a:conc") <= 30_000
        assert await client.zscore("test:pfx:k:a:conc", "r1") is not None
        await store.settle([(rate, -1.0)], [lease], "r1")  # refund to full, release
        assert await client.keys("*") == []
    finally:
        await client.aclose()
        await store.close()


async def test_redis_leases_lapse_after_their_ttl(redis_url: str) -> None:
    from redis import asyncio as aioredis

    store = RedisRateLimitStore(RedisRateLimitOptions(url=redis_url))
    client = aioredis.Redis.from_url(redis_url)
    # 2 s: "r2" must be refused before the lease lapses, even on a loaded machine.
    lease = Lease("k:a:conc", 1, ttl_s=2.0)

    async def redis_ms() -> float:
        seconds, micros = await client.time()
        return seconds * 1000 + micros / 1000

    try:
        before = await redis_ms()
        assert (await store.acquire([], [lease], "r1")).allowed
        after = await redis_ms()
        assert not (await store.acquire([], [lease], "r2")).allowed
        # The lease expires on the server, never released by "r1": its score in the lease
        # set is its expiry on Redis's own clock, the lease's ttl from when it was taken,
        # and "r2" gets in once that has passed.
        expiry_ms = await client.zscore(store._prefix + lease.key, "r1")
        assert before + 2000 <= expiry_ms <= after + 2000

        async def allowed() -> bool:
            return (await store.acquire([], [lease], "r2")).allowed

        await until(allowed, within=10.0)
    finally:
        await client.aclose()
        await store.close()


async def test_redis_closed_refuses_while_down_and_recovers(
    redis_server_factory: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = redis_server_factory()
    options = RedisRateLimitOptions(url=server.url, on_error="closed", retry_interval_s=0.05)
    store = RedisRateLimitStore(options)
    rate = Rate("k:a:rpd", 100, DAY, 1)
    caplog.set_level(logging.INFO, LOGGER)
    try:
        assert (await store.acquire([rate], [], "t")).allowed
        server.stop()
        for _ in range(50):
            d = await store.acquire([rate], [], "t")
            assert not d.allowed and d.degraded
            assert d.denied == "store_unavailable" and d.retry_after_s == 1.0
            await store.settle([(rate, -1.0)], [], "t")  # best effort: no error
        down = warnings_of(caplog, "unreachable")
        assert down == [
            f"rate-limit store unreachable at redis://127.0.0.1:{server.port}/0 "
            f"(ConnectionError: {_message_of(down[0])}); refusing rate-limited requests "
            "(on_error: closed)"
        ]
        server.start()

        async def back() -> Decision | None:
            d = await store.acquire([rate], [], "t")
            return d if not d.degraded else None

        d = await until(back)
        assert d.allowed and d.remaining == (99,)  # a fresh server: empty
        for _ in range(5):
            assert not (await store.acquire([rate], [], "t")).degraded
        assert len(warnings_of(caplog, "unreachable")) == 1
        assert len(warnings_of(caplog, "reachable again")) == 1
    finally:
        await store.close()


def _message_of(line: str) -> str:
    return line.split("(ConnectionError: ", 1)[1].rsplit("); ", 1)[0]


async def test_redis_open_uses_scaled_local_limits_while_down(
    redis_server_factory: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = redis_server_factory()
    options = RedisRateLimitOptions(url=server.url, fail_open_scale=0.5, retry_interval_s=0.05)
    store = RedisRateLimitStore(options)
    rate = Rate("k:a:rpd", 10, DAY, 1)
    lease = Lease("k:a:conc", 2)
    caplog.set_level(logging.INFO, LOGGER)
    try:
        assert (await store.acquire([rate], [], "t")).allowed
        server.stop()
        decisions = [await store.acquire([rate], [], "t") for _ in range(20)]
        assert all(d.degraded for d in decisions)
        assert [d.allowed for d in decisions] == [True] * 5 + [False] * 15  # 10 x 0.5 locally
        assert decisions[-1].denied == "k:a:rpd"
        assert decisions[-1].retry_after_s == pytest.approx(DAY / 5, abs=0.5)

        # leases taken from the fallback are released there
        assert (await store.acquire([], [lease], "r1")).allowed  # scaled: 1
        assert not (await store.acquire([], [lease], "r2")).allowed
        await store.settle([], [lease], "r1")
        assert (await store.acquire([], [lease], "r2")).allowed
        # over the scaled limit only: retry soon rather than never
        over = await store.acquire([Rate("k:b:tpd", 10, DAY, 8)], [], "t")
        assert not over.allowed and over.retry_after_s == 1.0

        assert warnings_of(caplog, "unreachable") == [
            f"rate-limit store unreachable at redis://127.0.0.1:{server.port}/0 (ConnectionError: "
            f"{_message_of(warnings_of(caplog, 'unreachable')[0])}); failing open with local limits "
            "scaled by 0.5"
        ]
        server.start()

        async def back() -> Decision | None:
            d = await store.acquire([rate], [], "t")
            return d if not d.degraded else None

        d = await until(back)
        assert d.allowed and d.remaining == (9,)  # the shared (restarted, empty) store again
        assert len(warnings_of(caplog, "unreachable")) == 1
        assert len(warnings_of(caplog, "reachable again")) == 1
    finally:
        await store.close()


def count_scripts(store: RedisRateLimitStore) -> Callable[[], int]:
    """Counts the acquire scripts sent to Redis: redis-py's script calls, the lean client's
    ``EVALSHA`` commands (not the one-time ``EVAL`` that loads the script)."""
    calls = 0
    if store._lean is None:
        script = store._acquire_script.redis_py

        async def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            return await script(*args, **kwargs)

        store._acquire_script.redis_py = counting
    else:
        send = store._lean.send

        def sent(*args: Any) -> Any:
            nonlocal calls
            calls += args[0] == "EVALSHA"
            return send(*args)

        store._lean.send = sent  # type: ignore[method-assign]
    return lambda: calls


def count_tries(store: RedisRateLimitStore) -> Callable[[], int]:
    """Counts what reaches (or tries to reach) Redis: each acquire script run with redis-py,
    each connection attempt with the lean client (whose commands of one moment share one)."""
    if store._lean is None:
        return count_scripts(store)
    calls = 0
    lean = store._lean
    start = lean._start_connecting

    def connecting() -> None:
        nonlocal calls
        calls += 1
        start()

    lean._start_connecting = connecting  # type: ignore[method-assign]
    return lambda: calls


@pytest.mark.parametrize("client", ["shuniu", "redis-py"])
async def test_redis_does_not_hammer_a_dead_server(
    redis_server_factory: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture, client: str
) -> None:
    server = redis_server_factory()
    store = RedisRateLimitStore(RedisRateLimitOptions(url=server.url, retry_interval_s=30.0, client=client))
    calls = count_tries(store)
    rate = Rate("k:a:rpd", 1000, DAY, 1)
    try:
        assert (await store.acquire([rate], [], "t")).allowed
        server.stop()
        decisions = await asyncio.gather(*(store.acquire([rate], [], "t") for _ in range(200)))
        decisions += [await store.acquire([rate], [], "t") for _ in range(200)]
        assert all(d.degraded and d.allowed for d in decisions)
        # the first call to fail opens the circuit; calls queued for a connection skip Redis
        # (redis-py: at most one per pooled connection; the lean client: one reconnection
        # for the whole burst)
        assert calls() <= (1 + 64 if client == "redis-py" else 2)
        before = calls()
        for _ in range(100):
            await store.acquire([rate], [], "t")
        assert calls() == before
    finally:
        await store.close()


def test_redis_calls_queued_too_long_count_as_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    """One connection, a Redis that takes 0.4 s a call: the 4th call waits past
    max(1 s, 4 x timeout_s) for the connection and counts as an outage. On a virtual clock:
    the scripted Redis answers after 0.4 s of loop time, which passes at once."""

    async def run() -> list[Decision]:
        options = RedisRateLimitOptions(
            url="redis://127.0.0.1:1",
            max_connections=1,
            timeout_s=0.1,
            retry_interval_s=30.0,
            client="redis-py",  # a pool of connections (the lean client has one, pipelined)
        )
        store = RedisRateLimitStore(options)

        async def slow(*args: Any, **kwargs: Any) -> Any:  # a Redis that answers, slowly
            await asyncio.sleep(0.4)
            return [1, 0, 0, 99, 0]  # allowed; 99 left, nothing to reset

        store._acquire_script.redis_py = slow
        rate = Rate("k:a:rpd", 100, DAY, 1)
        try:
            return list(await asyncio.gather(*(store.acquire([rate], [], f"r{i}") for i in range(4))))
        finally:
            await store.close()

    caplog.set_level(logging.INFO, LOGGER)
    decisions = run_virtual(run())
    assert [d.degraded for d in decisions] == [False, False, False, True]
    assert all(d.allowed for d in decisions)
    assert len(warnings_of(caplog, "(StoreCongestedError: 1 calls in flight for over 1s)")) == 1


@pytest.mark.parametrize("client", ["shuniu", "redis-py"])
async def test_redis_paused_server_times_out_fast(
    redis_server_factory: Callable[..., RedisServer], client: str
) -> None:
    """A paused server costs one timeout, no retries; within the retry interval the store
    does not ask it again. Counted in script runs sent, on a clock the test moves."""
    server = redis_server_factory()
    options = RedisRateLimitOptions(
        url=server.url, on_error="closed", timeout_s=1.0, retry_interval_s=0.1, client=client
    )  # 1 s: the calls before the pause and after it (a new connection) must not time out
    clock = FakeClock()
    store = RedisRateLimitStore(options, clock=clock)
    calls = count_scripts(store)
    rate = Rate("k:a:rpd", 100, DAY, 1)
    try:
        assert (await store.acquire([rate], [], "t")).allowed
        server.pause()
        d = await store.acquire([rate], [], "t")
        assert d.degraded and d.denied == "store_unavailable"
        assert calls() == 2  # one call timed out; nothing was retried
        for _ in range(100):  # within the retry interval: the dead server is not asked
            assert (await store.acquire([rate], [], "t")).degraded
        assert calls() == 2
        server.resume()
        clock.advance(0.1)  # the retry interval is over: the next call probes, and succeeds
        assert not (await store.acquire([rate], [], "t")).degraded
        assert calls() == 3
    finally:
        server.resume()
        await store.close()


async def test_redis_settlements_missed_during_an_outage_are_replayed(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    options = RedisRateLimitOptions(url=server.url, on_error="closed", retry_interval_s=0.05)
    store = RedisRateLimitStore(options)
    lease = Lease("k:a:conc", 1)
    try:
        assert (await store.acquire([], [lease], "r1")).allowed
        # Redis refuses the scripts but keeps its data (a way to fail without losing state)
        assert server.command("ACL", "SETUSER", "default", "-evalsha", "-eval") == b"+OK"
        await store.settle([], [lease], "r1")  # fails: kept for replay
        assert (await store.acquire([], [lease], "r2")).denied == "store_unavailable"
        assert server.command("ACL", "SETUSER", "default", "+@all") == b"+OK"

        async def r2_allowed() -> bool:
            d = await store.acquire([], [lease], "r2")
            return d.allowed and not d.degraded

        await until(r2_allowed)  # r1's release reached Redis after it came back
    finally:
        await store.close()


async def test_redis_password_never_reaches_the_log(
    redis_server_factory: Callable[..., RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    server = redis_server_factory(password="s3cret")
    caplog.set_level(logging.DEBUG)
    rate = Rate("k:a:rpd", 100, DAY, 1)
    good = RedisRateLimitStore(RedisRateLimitOptions(url=server.url, on_error="closed"))
    wrong = RedisRateLimitStore(
        RedisRateLimitOptions(url=f"redis://:hunter2@127.0.0.1:{server.port}/0", on_error="closed")
    )
    try:
        assert not (await good.acquire([rate], [], "t")).degraded  # authenticated
        d = await wrong.acquire([rate], [], "t")
        assert d.degraded and d.denied == "store_unavailable"
        server.stop()
        assert (await good.acquire([rate], [], "t")).degraded
        text = caplog.text
        assert len(warnings_of(caplog, f"unreachable at redis://127.0.0.1:{server.port}/0 (")) == 2
        assert "s3cret" not in text and "hunter2" not in text
    finally:
        await good.close()
        await wrong.close()


def test_redact_url() -> None:
    assert redact_url("redis://user:pw@redis.internal:6380/2") == "redis://redis.internal:6380/2"
    assert redact_url("redis://:pw@127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert redact_url("rediss://h:1/0?password=pw&ssl_cert_reqs=none") == "rediss://h:1/0"
    assert redact_url("unix:///run/redis.sock?db=1") == "unix:///run/redis.sock"


# -- registration and options ------------------------------------------------------------------


async def test_both_stores_are_registered_with_their_options(redis_url: str) -> None:
    registered = load_plugins().registered("rate_limiters")
    memory, redis = registered["memory"], registered["redis"]
    assert memory.options is MemoryRateLimitOptions and redis.options is RedisRateLimitOptions
    assert memory.description and redis.description
    assert isinstance(memory.factory(MemoryRateLimitOptions()), MemoryRateLimitStore)
    store = redis.factory(RedisRateLimitOptions(url=redis_url))
    assert isinstance(store, RedisRateLimitStore)
    await store.close()


def test_options_are_strict() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        RedisRateLimitOptions(urll="redis://127.0.0.1:6379/0")  # type: ignore[call-arg]
    with pytest.raises(ValidationError) as info:
        RedisRateLimitOptions(url="http://user:pw@127.0.0.1:6379/0")
    assert "expected one of redis://, rediss://, unix://, redis+sentinel://" in str(info.value)
    assert "; got http://" in str(info.value)
    with pytest.raises(ValidationError):
        RedisRateLimitOptions(on_error="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        MemoryRateLimitOptions(max_keys=0)


def test_missing_redis_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # as if it were not installed
    monkeypatch.delitem(sys.modules, "shuniu.plugins.ratelimit.redis_store")
    module = importlib.import_module("shuniu.plugins.ratelimit.redis_store")  # loads without it
    with pytest.raises(MissingExtraError) as info:
        module.RedisRateLimitStore(module.RedisRateLimitOptions())
    assert "pip install 'shuniu[redis]'" in str(info.value)
    assert "redis rate-limit store" in str(info.value)
