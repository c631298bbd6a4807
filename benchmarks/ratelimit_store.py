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
import sys
import time
from pathlib import Path
from typing import Any

from shuniu.core.ratelimit import Lease, Rate
from shuniu.plugins.ratelimit.memory import MemoryRateLimitStore
from shuniu.plugins.ratelimit.redis_store import RedisRateLimitOptions, RedisRateLimitStore

DAY = 86400.0
ROOT = str(Path(__file__).resolve().parent.parent)


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

    server = None
    url = args.url
    if url is None:
        sys.path.insert(0, ROOT)  # for tests/
        from tests.redis_server import RedisServer, redis_server_binary

        binary = redis_server_binary()
        if binary is None:
            print("redis: no redis-server installed (give --url)")
            return
        server = RedisServer(binary)
        server.start()
        url = server.url
    store = RedisRateLimitStore(RedisRateLimitOptions(url=url, key_prefix="bench:rl:"))
    try:
        print(f"redis, 1 at once  {await measure(store, args.n, 1):8.2f} us per acquire+settle")
        print(f"redis, 64 at once {await measure(store, args.n, 64):8.2f} us per acquire+settle")
    finally:
        await store.close()
        if server is not None:
            server.close()


if __name__ == "__main__":
    asyncio.run(main())
