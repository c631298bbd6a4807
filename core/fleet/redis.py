"""The fleet's batches in a Redis stream: one ``XADD`` (trimmed to ``max_entries``) and one
``XREAD`` from the last id seen, pipelined into one round trip per sync."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shuniu.core.config import FleetConfig
from shuniu.core.redis_client import connect_redis

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["RedisTransport"]

_FIELD = b"b"


class RedisTransport:
    """A gateway's line to the fleet's stream ``{key_prefix}batches``."""

    __slots__ = ("_client", "_key", "_max", "_redis", "cfg")

    def __init__(self, cfg: FleetConfig) -> None:
        self.cfg = cfg
        # One server, a Sentinel-watched primary or a Cluster (the stream is one key, so
        # one slot): shuniu.core.redis_client.
        self._redis = connect_redis(
            cfg.redis_url, timeout_s=cfg.timeout_s, max_connections=4, what="fleet: shared routing state"
        )
        self._client: Redis = self._redis.client
        self._key = f"{cfg.key_prefix}batches"
        self._max = cfg.max_entries

    async def exchange(self, batch: bytes, cursor: Any) -> tuple[Any, list[bytes]]:
        pipe = self._client.pipeline(transaction=False)
        if batch:
            pipe.xadd(self._key, {_FIELD: batch}, maxlen=self._max, approximate=True)
        pipe.xread({self._key: cursor or "0-0"}, count=self._max)
        replies = await pipe.execute()
        streams = replies[-1] or []
        out: list[bytes] = []
        last = cursor or "0-0"
        for _name, entries in streams:
            for entry_id, fields in entries:
                last = entry_id
                data = fields.get(_FIELD)
                if data:
                    out.append(data)
        return last, out

    async def close(self) -> None:
        await self._redis.close()
