"""Budget counters: how much each scope used in each period, in tokens and in micro-units
of money, kept in this process (:class:`MemoryCounters`) or shared by a fleet in Redis
(:class:`RedisCounters`).

A counter key is ``<scope>:<window>:<unit>`` (``k:acme:ci:d20261203:tok``): the window is
in the key, so a new day starts from zero without anything being reset, and each key
expires a day after its window ends.

A reservation checks and books every budget of a request at once (all or nothing); a
settlement adds the difference between the real usage and the reservation; reconciling
raises a counter to what the ledger holds (never lowers it: a request in flight holds a
reservation the ledger has not seen yet).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from shuniu.core.redis_client import connect_redis, hash_tagged
from shuniu.core.tasks import cancel_and_wait
from shuniu.core.urls import redact_url

__all__ = ["Counters", "MemoryCounters", "RedisCounters"]

log = logging.getLogger("shuniu.budgets")

Entry = tuple[str, int, int, int]
"""(counter key, amount, limit, seconds until the key may expire)."""


class Counters(Protocol):
    degraded: bool

    async def reserve(self, entries: Sequence[Entry]) -> tuple[int, list[int]]:
        """Book every amount if every counter stays within its limit: ``(-1, values
        before)``; else nothing is booked and ``(index of the first that would not fit,
        values)``."""
        ...

    def add(self, key: str, delta: int, ttl_s: int) -> None:
        """Add ``delta`` (a settlement; may be negative), soon."""
        ...

    async def raise_to(self, values: dict[str, tuple[int, int]]) -> None:
        """Raise each counter to at least its value (``key → (value, ttl_s)``)."""
        ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


class MemoryCounters:
    """Counters of this process. A key names its window, so an old window's value is never
    read again: expiry only frees memory (swept hourly), it is not checked per request."""

    def __init__(self) -> None:
        self._values: dict[str, list[float]] = {}
        """key → [value, expires at]."""
        self.degraded = False
        self._sweep = time.time()

    def _entry(self, key: str, ttl_s: int) -> list[float]:
        entry = self._values.get(key)
        if entry is None:
            entry = self._values[key] = [0, time.time() + ttl_s]
        return entry

    async def reserve(self, entries: Sequence[Entry]) -> tuple[int, list[int]]:
        return self.reserve_now(entries)

    def reserve_now(self, entries: Sequence[Entry]) -> tuple[int, list[int]]:
        got = self._values.get
        values = [int(e[0]) if (e := got(key)) is not None else 0 for key, _a, _l, _t in entries]
        for i, (_key, amount, limit, _ttl) in enumerate(entries):
            if values[i] + amount > limit:
                return i, values
        for key, amount, _limit, ttl in entries:
            self._entry(key, ttl)[0] += amount
        return -1, values

    def add(self, key: str, delta: int, ttl_s: int) -> None:
        self._entry(key, ttl_s)[0] += delta

    async def raise_to(self, values: dict[str, tuple[int, int]]) -> None:
        for key, (value, ttl) in values.items():
            entry = self._entry(key, ttl)
            if entry[0] < value:
                entry[0] = value
        now = time.time()
        if now - self._sweep > 3600:  # reconciliation runs every reconcile_s: sweep here
            self._sweep = now
            for key in [k for k, v in self._values.items() if v[1] <= now]:
                del self._values[key]

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


# KEYS: the counters. ARGV: n, then (amount, limit, ttl_s) per key. Reply: {denied index
# (0 = none, else 1-based), value before of each key}.
_RESERVE = """
local n = tonumber(ARGV[1])
local values = {}
for i = 1, n do
  values[i] = tonumber(redis.call('GET', KEYS[i]) or '0')
end
for i = 1, n do
  local amount = tonumber(ARGV[1 + 3 * (i - 1) + 1])
  local limit = tonumber(ARGV[1 + 3 * (i - 1) + 2])
  if values[i] + amount > limit then
    local out = {i}
    for j = 1, n do out[j + 1] = values[j] end
    return out
  end
end
local out = {0}
for i = 1, n do
  local amount = tonumber(ARGV[1 + 3 * (i - 1) + 1])
  local ttl = tonumber(ARGV[1 + 3 * (i - 1) + 3])
  redis.call('INCRBY', KEYS[i], amount)
  redis.call('EXPIRE', KEYS[i], ttl)
  out[i + 1] = values[i]
end
return out
"""

# KEYS: counters; ARGV: (value, ttl_s) per key. Raises each to at least its value.
_RAISE = """
for i = 1, #KEYS do
  local value = tonumber(ARGV[2 * i - 1])
  local current = tonumber(redis.call('GET', KEYS[i]) or '0')
  if current < value then
    redis.call('SET', KEYS[i], value, 'EX', tonumber(ARGV[2 * i]))
  end
end
return 1
"""


class RedisCounters:
    """Counters in Redis, shared by every gateway with the same Redis and prefix.

    A reservation is one script run (check and book are atomic across gateways);
    settlements are summed here and sent every ``settle_interval_s`` in one pipeline. When
    Redis cannot be reached, counting goes on in this process (said once in the log,
    ``degraded`` set) and the ledger's reconciliation brings Redis up to date once it is
    back: an outage of Redis loosens budgets by what the fleet spends meanwhile, it does
    not stop the traffic."""

    def __init__(self, url: str, *, settle_interval_s: float, prefix: str = "shuniu:budget:") -> None:
        self._conn = connect_redis(url, timeout_s=0.5, max_connections=32, what="Redis budget counters")
        self._url = redact_url(url)
        self._prefix = hash_tagged(prefix)
        self._interval = settle_interval_s
        self._pending: dict[str, list[int]] = {}
        self._fallback = MemoryCounters()
        self._task: asyncio.Task[None] | None = None
        self._reserve: Any = None
        self._raise: Any = None
        self.degraded = False

    def _failed(self, exc: BaseException) -> None:
        if not self.degraded:
            log.error(
                "budget counters: Redis %s is unavailable (%s); counting in this process", self._url, exc
            )
        self.degraded = True

    def _ok(self) -> None:
        if self.degraded:
            log.warning("budget counters: Redis %s is back", self._url)
        self.degraded = False

    async def reserve(self, entries: Sequence[Entry]) -> tuple[int, list[int]]:
        if self._reserve is None:
            self._reserve = self._conn.client.register_script(_RESERVE)
        keys = [self._prefix + key for key, _a, _l, _t in entries]
        argv: list[int] = [len(entries)]
        for _key, amount, limit, ttl in entries:
            argv += [amount, limit, ttl]
        try:
            reply = await self._reserve(keys=keys, args=argv)
        except Exception as exc:
            self._failed(exc)
            return self._fallback.reserve_now(entries)
        self._ok()
        return int(reply[0]) - 1, [int(v) for v in reply[1:]]

    def add(self, key: str, delta: int, ttl_s: int) -> None:
        if not delta:
            return
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = [delta, ttl_s]
        else:
            pending[0] += delta
        if self.degraded:
            self._fallback.add(key, delta, ttl_s)

    async def _flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        try:
            async with self._conn.client.pipeline(transaction=False) as pipe:
                for key, (delta, ttl) in pending.items():
                    pipe.incrby(self._prefix + key, delta)
                    pipe.expire(self._prefix + key, ttl)
                await pipe.execute()
        except Exception as exc:
            self._failed(exc)
            for key, (delta, ttl) in pending.items():  # kept for the next try
                self.add(key, delta, ttl)
            return
        self._ok()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self._flush()

    async def raise_to(self, values: dict[str, tuple[int, int]]) -> None:
        if not values:
            return
        if self._raise is None:
            self._raise = self._conn.client.register_script(_RAISE)
        argv: list[int] = []
        for value, ttl in values.values():
            argv += [value, ttl]
        try:
            await self._raise(keys=[self._prefix + k for k in values], args=argv)
        except Exception as exc:
            self._failed(exc)
        await self._fallback.raise_to(values)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="shuniu-budget-settle")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
        await self._flush()
        await self._conn.close()
