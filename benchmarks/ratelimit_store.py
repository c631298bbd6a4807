"""Cost of one rate-limited request in the rate-limit stores: acquire (a request limit, a
token limit and a concurrency lease, as a tier with all three checks) plus settle.

    .venv/bin/python benchmarks/ratelimit_store.py            # starts a redis-server
    .venv/bin/python benchmarks/ratelimit_store.py --url redis://127.0.0.1:6379/0

Prints microseconds per acquire+settle: one at a time (latency) and with 64 in flight
(throughput, for Redis). Redis numbers include the round trips over loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from harness import Children, handle_signals, start_redis

from shuniu.core.contracts import Lease, Rate
from shuniu.plugins.ratelimit.memory import MemoryRateLimitStore
from shuniu.plugins.ratelimit.redis_store import RedisRateLimitOptions, RedisRateLimitStore

DAY = 86400.0


async def one(store: Any, i: int) -> None:
    key = f"k:{i % 1000}"
    rates = [Rate(f"{key}:rpd", 1e9, DAY, 1), Rate(f"{key}:tpd", 1e12, DAY, 1000)]
    leases = [Lease(f"{key}:conc", 1_000_000)]
    token = f"r{i}"
    decision = await store.acquire(rates, leases, token)
    assert decision.allowed and not decision.degraded, decision
    await store.settle([(rates[1], -200.0)], leases, token)


async def measure(store: Any, n: int, concurrency: int) -> float:
    """Microseconds per acquire+settle."""
    for i in range(min(n, 2000)):  # warm up (connections, script load)
        await one(store, i)
    start = time.perf_counter()
    if concurrency == 1:
        for i in range(n):
            await one(store, i)
    else:
        for base in range(0, n, concurrency):
            await asyncio.gather(*(one(store, base + j) for j in range(concurrency)))
    return (time.perf_counter() - start) / n * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="an existing Redis (default: start one)")
    parser.add_argument("-n", type=int, default=20000, help="requests per measurement")
    args = parser.parse_args()

    memory = MemoryRateLimitStore()
    print(f"memory            {await measure(memory, args.n * 5, 1):8.2f} us per acquire+settle")

    with Children() as children:  # a redis-server started here is stopped on leaving, by its PID
        url = args.url
        if url is None:
            server = start_redis(children)
            if server is None:
                print("redis: no redis-server installed (give --url)")
                return
            url = server.url
        store = RedisRateLimitStore(RedisRateLimitOptions(url=url, key_prefix="bench:rl:"))
        try:
            print(f"redis, 1 at once  {await measure(store, args.n, 1):8.2f} us per acquire+settle")
            print(f"redis, 64 at once {await measure(store, args.n, 64):8.2f} us per acquire+settle")
        finally:
            await store.close()


if __name__ == "__main__":
    handle_signals()  # Ctrl-C, SIGTERM and SIGHUP unwind through the redis-server's clean-up
    asyncio.run(main())
