"""``redis``: rate limits shared by every gateway through Redis.

Each call is one Lua script run (``EVALSHA``), so a check and its booking are atomic across
gateways. The scripts read the clock with ``TIME`` on the Redis server, so the gateways'
clocks never enter the arithmetic. A GCRA key is a string holding its ``tat`` in
microseconds since 1970, with an expiry at that ``tat`` (an idle key vanishes once it has
refilled); a concurrency key is a sorted set of request tokens scored by when their lease
expires, so leases of a gateway that died stop counting after ``Lease.ttl_s`` (they are
removed when the set next looks full: a check of a set below its limit is one ``ZCARD``).

When Redis cannot be reached (refused, timed out, loading, wrong password, ...) the store
either refuses every limited request (``on_error: closed``) or falls back to limits kept in
the process (``on_error: open``). Either way it says so once in the log, answers with
``degraded=True``, tries Redis again at most every ``retry_interval_s``, and says once when
it is back. Settlements that could not reach Redis are kept (a bounded number) and replayed
after it is back, so concurrency leases held across an outage are released promptly rather
than after their TTL.

All keys of one call go to one script, so with Redis Cluster the keys must share a hash
slot: the store puts a hash tag in ``key_prefix`` when it has none. With Sentinel every
call goes to the primary the Sentinels name, the new one after a failover.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import parse_qs, urlsplit

from pydantic import Field, field_validator

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Decision, Lease, Rate, RateLimitStore, RegisterRateLimitStore
from shuniu.core.extras import require
from shuniu.core.redis_client import check_redis_url, connect_redis, hash_tagged
from shuniu.core.resp import RespClient, RespError
from shuniu.core.urls import redact_url
from shuniu.plugins.ratelimit.memory import MemoryRateLimitStore

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from shuniu.core.redis_client import RedisConnection

__all__ = ["RedisRateLimitOptions", "RedisRateLimitStore", "StoreCongestedError"]

log = logging.getLogger("shuniu.ratelimit")

_PENDING_SETTLES = 10_000
"""Settlements kept for replay while Redis is down; older ones are dropped (their leases
then expire by TTL, their token refunds are lost, which only makes limits stricter)."""
_FALLBACK_TOKENS = 100_000
"""Requests admitted by the fallback remembered so that their settlement goes there too."""

# ARGV: n_rates, token, then (limit, period_us, cost) per rate, then (limit, ttl_ms) per
# lease. KEYS: the rate keys, then the lease keys. Replies: {allowed, denied (1-based index
# into KEYS, 0 = none), retry_after_us (-1 = never), then remaining, reset_us per rate}.
# Numbers are returned as integers (Redis truncates Lua numbers), so microseconds, rounded
# up where rounding down would promise too early a retry. The tat is written with %.17g so
# that the double survives the round trip (tostring keeps only 14 digits).
# Mirrors shuniu.plugins.ratelimit.gcra (EPS = its EPSILON_S, in microseconds).
ACQUIRE_LUA = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = tonumber(ARGV[1])
local token = ARGV[2]
local EPS = 1
local worst = 0
local denied = 0
local before = {}
local after = {}
local booked = {}
for i = 1, n do
  local a = 3 * i
  local limit = tonumber(ARGV[a])
  local period = tonumber(ARGV[a + 1])
  local cost = tonumber(ARGV[a + 2])
  local key = KEYS[i]
  local stored = tonumber(redis.call('GET', key)) or now
  local tat = booked[key] or stored
  local debt = 0
  if tat > now then debt = tat - now end
  before[i] = 0
  if stored > now then before[i] = stored - now end
  local retry = 0
  if limit <= 0 or cost > limit then
    retry = -1
  else
    local new_debt = debt + cost * period / limit
    if new_debt - period > EPS then
      retry = new_debt - period
    else
      debt = new_debt
      booked[key] = now + new_debt
    end
  end
  after[i] = debt
  if retry ~= 0 and worst ~= -1 and (retry == -1 or retry > worst) then
    worst = retry
    denied = i
  end
end
local m = #KEYS - n
local now_ms = now / 1000
for j = 1, m do
  local key = KEYS[n + j]
  local limit = tonumber(ARGV[2 + 3 * n + 2 * j - 1])
  -- Expired leases (of a gateway that died) and this token's own lease matter only when the
  -- set looks full: then drop the expired ones and look again.
  if redis.call('ZCARD', key) >= limit then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.17g', now_ms))
    if not redis.call('ZSCORE', key, token) and redis.call('ZCARD', key) >= limit then
      if worst ~= -1 and 1000000 > worst then
        worst = 1000000
        denied = n + j
      end
    end
  end
end
if denied == 0 then
  for i = 1, n do
    local key = KEYS[i]
    local tat = booked[key]
    if tat ~= nil then
      local px = math.ceil((tat - now) / 1000)
      if px >= 1 then
        redis.call('SET', key, string.format('%.17g', tat), 'PX', px)
      end
      booked[key] = nil
    end
  end
  for j = 1, m do
    local key = KEYS[n + j]
    local ttl = tonumber(ARGV[2 + 3 * n + 2 * j])
    redis.call('ZADD', key, string.format('%.17g', now_ms + ttl), token)
    if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
  end
else
  after = before
end
local out = {denied == 0 and 1 or 0, denied, worst == -1 and -1 or math.ceil(worst)}
for i = 1, n do
  local a = 3 * i
  local limit = tonumber(ARGV[a])
  local period = tonumber(ARGV[a + 1])
  local left = 0
  if limit > 0 then
    left = math.floor((period + EPS - after[i]) * limit / period)
    if left > math.floor(limit) then left = math.floor(limit) end
    if left < 0 then left = 0 end
  end
  out[#out + 1] = left
  out[#out + 1] = math.ceil(after[i])
end
return out
"""

# ARGV: n_rates, token, then (limit, period_us, delta) per rate. KEYS: rate keys, then
# lease keys. Moves each tat by delta·T (never below now: a refund past the clock leaves a
# full key, i.e. no key) and releases the token's leases. Returns nothing.
SETTLE_LUA = """
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = tonumber(ARGV[1])
local token = ARGV[2]
for i = 1, n do
  local a = 3 * i
  local limit = tonumber(ARGV[a])
  local period = tonumber(ARGV[a + 1])
  local delta = tonumber(ARGV[a + 2])
  if limit > 0 and delta ~= 0 then
    local key = KEYS[i]
    local tat = tonumber(redis.call('GET', key))
    if tat == nil or tat <= now then
      if delta > 0 then tat = now else tat = nil end
    end
    if tat ~= nil then
      tat = tat + delta * period / limit
      local px = math.ceil((tat - now) / 1000)
      if px >= 1 then
        redis.call('SET', key, string.format('%.17g', tat), 'PX', px)
      else
        redis.call('DEL', key)
      end
    end
  end
end
for j = n + 1, #KEYS do
  redis.call('ZREM', KEYS[j], token)
end
return 0
"""


class StoreCongestedError(Exception):
    """Every connection to Redis stayed busy for too long: treated like an outage."""


class RedisRateLimitOptions(Options):
    """Options of the ``redis`` rate-limit store."""

    url: str = "redis://127.0.0.1:6379/0"
    """Redis to share the limits through: ``redis://[[user]:password@]host:port/db``,
    ``rediss://`` for TLS, ``unix:///path/to/socket``, a primary that Sentinels watch
    (``redis+sentinel://host:port,host:port/SERVICE/db``) or a Redis Cluster
    (``redis+cluster://host:port,host:port``); see ``docs/high-availability.md``. The
    password never appears in the gateway's log messages."""
    key_prefix: str = "shuniu:rl:"
    """Put before every key, so that several deployments (or other data) can share one
    Redis. With a Redis Cluster every key of one check must share a hash slot, so a
    prefix without a hash tag gets one (``shuniu:rl:`` becomes ``{shuniu:rl}:``): all
    limits then live on one primary of the Cluster."""
    timeout_s: float = Field(0.25, gt=0)
    """Longest wait to connect and for each reply; past it the call counts as a failure and
    ``on_error`` decides. A call waiting for one of the ``max_connections`` (a burst) gives
    up after 4 x this, at least 1 s, which counts as a failure too."""
    on_error: Literal["open", "closed"] = "open"
    """When Redis cannot be reached: ``open`` answers from limits kept in each gateway
    process (scaled by ``fail_open_scale``); ``closed`` refuses every limited request with
    503 until Redis is back."""
    fail_open_scale: float = Field(1.0, gt=0)
    """Factor applied to every limit while failing open. Each gateway enforces the scaled
    limits on its own, so with N gateways the fleet may allow up to N x this factor x the
    limits during an outage: set ``1 / N`` to keep the fleet near its limits (concurrency
    limits keep at least 1 per gateway). A request costing more than a scaled limit is
    refused during the outage."""
    max_connections: int = Field(64, ge=1)
    """Connections to Redis per gateway process (per node, for a Cluster); calls beyond
    wait for a free one (up to ``timeout_s``)."""
    client: Literal["shuniu", "redis-py"] = "shuniu"
    """How a gateway talks to a single server (``redis://``, ``unix://``): ``shuniu``, a
    lean client that sends every check over one connection, pipelined with the other
    requests' checks of the same moment (a fraction of redis-py's CPU per call; see
    ``docs/design-choices.md``), or ``redis-py`` with a pool of ``max_connections``.
    ``rediss://``, Sentinel and Cluster URLs always use redis-py."""
    retry_interval_s: float = Field(1.0, gt=0)
    """After a failure, how often one request tries Redis again; the others meanwhile
    answer per ``on_error`` without waiting on a dead server."""

    @field_validator("url")
    @classmethod
    def _known_shape(cls, url: str) -> str:
        return check_redis_url(url)


def _secrets(url: str) -> list[str]:
    """The passwords in ``url`` (userinfo, ``?password=`` and ``?sentinel_password=``), to
    scrub from messages."""
    try:
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        found = [parts.password or "", *query.get("password", []), *query.get("sentinel_password", [])]
    except ValueError:
        return []
    return [s for s in found if s]


class _Lua:
    """A script, run by its SHA-1 (``EVALSHA``), and by its text once when Redis does not
    have it yet (after a restart or ``SCRIPT FLUSH``)."""

    __slots__ = ("redis_py", "sha", "text")

    def __init__(self, text: str, redis_py: Any) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()
        self.redis_py = redis_py
        """The redis-py ``Script`` (``None`` with the lean client)."""


class RedisRateLimitStore(RateLimitStore):
    """The :class:`shuniu.core.contracts.RateLimitStore` shared through Redis."""

    clock: Callable[[], float]
    """Monotonic seconds, for the retry interval only (the limits use Redis's clock)."""

    def __init__(
        self, options: RedisRateLimitOptions | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        options = options or RedisRateLimitOptions()
        require("redis", "redis", "The redis rate-limit store")
        from redis.exceptions import RedisError

        self.options = options
        self.clock = clock
        self.where = redact_url(options.url)
        self._secrets = _secrets(options.url)
        self._errors: tuple[type[BaseException], ...] = (RedisError, OSError)
        extra: dict[str, Any] = {}
        try:
            from redis.driver_info import DriverInfo
        except ImportError:  # redis-py < 7 reads its version once, at import
            pass
        else:
            # One for all connections: by default each new connection looks the redis-py
            # version up in the installed metadata (milliseconds), which made a burst of
            # new connections miss timeout_s and trip the fallback.
            extra["driver_info"] = DriverInfo()
        # No retries inside redis-py (connect_redis): a retry doubles the time a dead
        # server costs each request, and stale pooled connections are replaced at checkout.
        self._lean = RespClient.for_url(options.url, options.client, options.timeout_s)
        self._redis: RedisConnection | None = None
        if self._lean is not None:
            self._errors = (RespError, OSError)
            self._acquire_script = _Lua(ACQUIRE_LUA, None)
            self._settle_script = _Lua(SETTLE_LUA, None)
        else:
            self._redis = connect_redis(
                options.url,
                timeout_s=options.timeout_s,
                max_connections=options.max_connections,
                blocking=True,
                what="The redis rate-limit store",
                **extra,
            )
            client: Redis = self._redis.client
            self._acquire_script = _Lua(ACQUIRE_LUA, client.register_script(ACQUIRE_LUA))
            self._settle_script = _Lua(SETTLE_LUA, client.register_script(SETTLE_LUA))
        cluster = self._redis is not None and self._redis.shape == "cluster"
        self._prefix = hash_tagged(options.key_prefix) if cluster else options.key_prefix
        self._fallback = (
            MemoryRateLimitStore(clock=clock, scale=options.fail_open_scale)
            if options.on_error == "open"
            else None
        )
        self._fallback_tokens: OrderedDict[str, None] = OrderedDict()
        self._pending: deque[tuple[Sequence[tuple[Rate, float]], Sequence[Lease], str]] = deque(
            maxlen=_PENDING_SETTLES
        )
        self._down = False
        self._retry_at = 0.0
        self._probing = False
        self._replay: asyncio.Task[None] | None = None
        # At most one call per connection: the pool then never makes a call wait, and a call
        # waiting here can see that Redis went down meanwhile and skip it.
        self._slots = asyncio.Semaphore(options.max_connections)
        self._queue_timeout_s = max(1.0, 4 * options.timeout_s)

    @property
    def degraded(self) -> bool:
        """Whether the store is answering without Redis now."""
        return self._down

    # -- the protocol --------------------------------------------------------------------

    async def acquire(self, rates: Sequence[Rate], leases: Sequence[Lease], token: str) -> Decision:
        if not rates and not leases:
            return Decision(allowed=True)
        probe = self._down
        if probe:
            if self._probing or self.clock() < self._retry_at:
                return self._without_redis(rates, leases, token)
            self._probing = True
        prefix = self._prefix
        keys = [prefix + r.key for r in rates]
        keys += [prefix + lease.key for lease in leases]
        args: list[Any] = [len(rates), token]
        for r in rates:
            args += (r.limit, r.period_s * 1e6, r.cost)
        for lease in leases:
            args += (lease.limit, max(1, math.ceil(lease.ttl_s * 1000)))
        try:
            reply = await self._call(self._acquire_script, keys, args, probe)
        finally:
            if probe:
                self._probing = False
        if reply is None:
            return self._without_redis(rates, leases, token)
        if probe:
            self._recovered()
        allowed, index, retry_us = reply[0], reply[1], reply[2]
        if index:
            denied = rates[index - 1].key if index <= len(rates) else leases[index - len(rates) - 1].key
        else:
            denied = None
        return Decision(
            allowed=allowed == 1,
            retry_after_s=math.inf if retry_us < 0 else retry_us / 1e6,
            denied=denied,
            remaining=tuple(float(x) for x in reply[3::2]),
            reset_s=tuple(x / 1e6 for x in reply[4::2]),
        )

    async def settle(self, adjust: Sequence[tuple[Rate, float]], leases: Sequence[Lease], token: str) -> None:
        if self._fallback is not None and token in self._fallback_tokens:
            del self._fallback_tokens[token]
            self._fallback.settle_now(adjust, leases, token)  # admitted by the fallback
            return
        adjust = [(r, d) for r, d in adjust if d]
        if not adjust and not leases:
            return
        if self._down or not await self._settle_in_redis(adjust, leases, token):
            self._pending.append((adjust, leases, token))  # replayed once Redis is back

    async def close(self) -> None:
        if self._replay is not None:
            self._replay.cancel()
            self._replay = None
        if self._lean is not None:
            await self._lean.close()
        if self._redis is not None:
            await self._redis.close()

    # -- Redis ---------------------------------------------------------------------------

    async def _call(self, script: _Lua, keys: list[str], args: list[Any], probe: bool) -> Any:
        """Run ``script``; ``None`` when Redis failed, or was found down while this call
        waited for a connection (then it is not tried: the wait was long enough)."""
        lean = self._lean
        if lean is not None:
            if self._down and not probe:
                return None
            try:
                return await lean.run_script(script.sha, script.text, keys, args)
            except self._errors as exc:
                self._failed(exc)
                return None
        slots = self._slots
        if slots.locked():
            # Every connection is busy. Waiting is normal in a burst (new connections take
            # a moment); waiting this long means Redis is too slow for the load.
            try:
                async with asyncio.timeout(self._queue_timeout_s):
                    await slots.acquire()
            except TimeoutError:
                self._failed(
                    StoreCongestedError(
                        f"{self.options.max_connections} calls in flight for over {self._queue_timeout_s:g}s"
                    )
                )
                return None
        else:
            await slots.acquire()  # free: returns at once
        try:
            if self._down and not probe:
                return None
            return await script.redis_py(keys=keys, args=args)
        except self._errors as exc:
            self._failed(exc)
            return None
        finally:
            slots.release()

    async def _settle_in_redis(
        self, adjust: Sequence[tuple[Rate, float]], leases: Sequence[Lease], token: str
    ) -> bool:
        prefix = self._prefix
        keys = [prefix + r.key for r, _ in adjust]
        keys += [prefix + lease.key for lease in leases]
        args: list[Any] = [len(adjust), token]
        for r, delta in adjust:
            args += (r.limit, r.period_s * 1e6, delta)
        return await self._call(self._settle_script, keys, args, False) is not None

    async def _replay_pending(self) -> None:
        """Send the settlements that failed during the outage, oldest first."""
        pending = self._pending
        try:
            while pending and not self._down:
                item = pending[0]
                if not await self._settle_in_redis(*item):
                    return  # down again: kept for the next recovery
                if pending and pending[0] is item:
                    pending.popleft()
        finally:
            self._replay = None

    # -- without Redis -------------------------------------------------------------------

    def _without_redis(self, rates: Sequence[Rate], leases: Sequence[Lease], token: str) -> Decision:
        fallback = self._fallback
        if fallback is None:
            return Decision(allowed=False, retry_after_s=1.0, denied="store_unavailable", degraded=True)
        decision = fallback.acquire_now(rates, leases, token)
        decision.degraded = True
        if decision.allowed:
            tokens = self._fallback_tokens
            tokens[token] = None
            if len(tokens) > _FALLBACK_TOKENS:
                tokens.popitem(last=False)  # never settled; its fallback lease expires by TTL
        elif math.isinf(decision.retry_after_s):
            decision.retry_after_s = 1.0  # over a scaled limit only: possible once Redis is back
        return decision

    def _failed(self, exc: BaseException) -> None:
        self._retry_at = self.clock() + self.options.retry_interval_s
        if self._down:
            return
        self._down = True
        what = type(exc).__name__
        detail = str(exc)
        for secret in self._secrets:
            detail = detail.replace(secret, "***")
        if detail:
            what = f"{what}: {detail[:200]}"
        if self._fallback is not None:
            scale = self.options.fail_open_scale
            mode = "failing open with local limits" + (f" scaled by {scale:g}" if scale != 1.0 else "")
        else:
            mode = "refusing rate-limited requests (on_error: closed)"
        log.warning("rate-limit store unreachable at %s (%s); %s", self.where, what, mode)

    def _recovered(self) -> None:
        if not self._down:
            return
        self._down = False
        log.warning("rate-limit store reachable again at %s; shared limits restored", self.where)
        if self._pending and self._replay is None:
            self._replay = asyncio.get_running_loop().create_task(self._replay_pending())


def _build(options: RedisRateLimitOptions | None = None) -> RedisRateLimitStore:
    return RedisRateLimitStore(options)


@hookimpl
def register_rate_limiters(register: RegisterRateLimitStore) -> None:
    register(
        "redis",
        _build,
        options=RedisRateLimitOptions,
        description=(
            "Rate and concurrency limits shared by all gateways through Redis (one atomic Lua "
            "script per check, Redis's clock); fails open to local limits or closed."
        ),
    )
