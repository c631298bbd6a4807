"""``redis`` cache store: answers shared by every gateway using one Redis, with a TTL, and a
fill lock so that concurrent misses across gateways go to the engine once.

An unreachable Redis never fails a request: a failed read is a miss, a failed write is
dropped, and the fill lock is granted (each gateway then fills on its own). The outage and
the recovery are logged once each, not per request.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any, Literal

from pydantic import Field, field_validator

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import CacheStore, RegisterCacheStore
from shuniu.core.extras import require
from shuniu.core.redis_client import check_redis_url, connect_redis
from shuniu.core.resp import RespClient, RespError
from shuniu.core.urls import redact_url

__all__ = ["RedisCache", "RedisCacheOptions"]

log = logging.getLogger("shuniu.cache.redis")

# Delete the lock only if this process still holds it (it may have expired and been taken).
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
_UNLOCK_SHA = hashlib.sha1(_UNLOCK.encode()).hexdigest()


class RedisCacheOptions(Options):
    """Options of the ``redis`` cache store."""

    url: str = "redis://127.0.0.1:6379/0"
    """Redis URL: ``redis://[:password@]host:port/db`` (``rediss://`` for TLS), a primary
    that Sentinels watch (``redis+sentinel://host:port,host:port/SERVICE/db``) or a Redis
    Cluster (``redis+cluster://host:port,host:port``); see ``docs/high-availability.md``."""
    key_prefix: str = "shuniu:cache:"
    """Prefix of every key this store writes."""
    timeout_s: float = Field(0.25, gt=0)
    """Connect and read timeout of each call; slower counts as unreachable."""
    retry_after_s: float = Field(1.0, gt=0)
    """After a failure, how long to treat Redis as down before trying it again."""
    max_connections: int = Field(64, ge=1)
    """Connection pool size (per node, for a Cluster; redis-py only)."""
    client: Literal["shuniu", "redis-py"] = "shuniu"
    """How a gateway talks to a single server (``redis://``, ``unix://``): ``shuniu``, the
    lean pipelined client the rate-limit store uses (one connection; see
    ``docs/design-choices.md``), or ``redis-py``. ``rediss://``, Sentinel and Cluster URLs
    always use redis-py."""

    @field_validator("url")
    @classmethod
    def _known_shape(cls, url: str) -> str:
        return check_redis_url(url)


class RedisCache(CacheStore):
    """A cache store in Redis (``SET … PX`` for answers, ``SET NX PX`` for fill locks)."""

    def __init__(self, options: RedisCacheOptions | None = None) -> None:
        opts = options or RedisCacheOptions()
        errors = require("redis.exceptions", "redis", "The redis cache store")
        self.options = opts
        self._prefix = opts.key_prefix
        self._lean = RespClient.for_url(opts.url, opts.client, opts.timeout_s)
        self._redis: Any = None
        if self._lean is not None:
            self._errors: tuple[type[BaseException], ...] = (RespError, OSError)
        else:
            self._errors = (errors.RedisError, OSError)
            self._redis = connect_redis(
                opts.url,
                timeout_s=opts.timeout_s,
                max_connections=opts.max_connections,
                what="The redis cache store",
            )
            self._client: Any = self._redis.client
            self._unlock = self._client.register_script(_UNLOCK)
        self._owner = os.urandom(8).hex()
        self._down_until = 0.0
        self.down = False

    @property
    def degraded(self) -> bool:
        """Whether the store is answering without Redis now (misses, unshared fills)."""
        return self.down

    def _available(self) -> bool:
        return not self.down or time.monotonic() >= self._down_until

    def _failed(self, exc: BaseException) -> None:
        self._down_until = time.monotonic() + self.options.retry_after_s
        if not self.down:
            self.down = True
            log.warning(
                "cache store unreachable at %s (%s); serving without the shared cache until it is back",
                redact_url(self.options.url),
                type(exc).__name__,
            )

    def _ok(self) -> None:
        if self.down:
            self.down = False
            log.warning("cache store at %s is reachable again", redact_url(self.options.url))

    async def get(self, key: str) -> bytes | None:
        if not self._available():
            return None
        try:
            lean = self._lean
            if lean is not None:
                value = await lean.send("GET", self._prefix + key)
            else:
                value = await self._client.get(self._prefix + key)
        except self._errors as exc:
            self._failed(exc)
            return None
        self._ok()
        return value

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        if not self._available():
            return
        try:
            ms = max(1, int(ttl_s * 1000))
            if self._lean is not None:
                await self._lean.send("SET", self._prefix + key, value, "PX", ms)
            else:
                await self._client.set(self._prefix + key, value, px=ms)
        except self._errors as exc:
            self._failed(exc)
            return
        self._ok()

    async def lock(self, key: str, ttl_s: float) -> bool:
        if not self._available():
            return True
        try:
            name, ms = self._prefix + "lock:" + key, max(1, int(ttl_s * 1000))
            if self._lean is not None:
                got = await self._lean.send("SET", name, self._owner, "NX", "PX", ms)
            else:
                got = await self._client.set(name, self._owner, nx=True, px=ms)
        except self._errors as exc:
            self._failed(exc)
            return True
        self._ok()
        return bool(got)

    async def unlock(self, key: str) -> None:
        if not self._available():
            return
        name = self._prefix + "lock:" + key
        try:
            lean = self._lean
            if lean is None:
                await self._unlock(keys=[name], args=[self._owner])
                return
            await lean.run_script(_UNLOCK_SHA, _UNLOCK, [name], [self._owner])
        except self._errors as exc:
            self._failed(exc)

    async def close(self) -> None:
        if self._lean is not None:
            await self._lean.close()
        if self._redis is not None:
            await self._redis.close()


@hookimpl
def register_caches(register: RegisterCacheStore) -> None:
    register(
        "redis",
        RedisCache,
        options=RedisCacheOptions,
        description="Answers in Redis with a TTL, shared by gateways; fill locks across processes.",
    )
