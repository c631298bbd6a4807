"""The batch queue in Redis Streams, for fleets that run Redis: any gateway works on any
batch, and the requests of a gateway that died are redone by another.

Per batch, under one Cluster hash tag (``{shuniu:batch:<id>}``, so each script's keys share
a slot):

- ``…:meta`` — a hash: the batch's record (``status``, ``t:<status>_at`` stamps, file ids,
  errors) and its counters (``total``, ``n:done``, ``n:failed``; ``ended``: what a cancel or
  an expiry made of the requests not run);
- ``…:q`` — a stream of its requests, one entry each, read by the consumer group
  ``workers`` in which every gateway is a consumer. ``XREADGROUP`` hands an entry to one
  gateway; it stays in that gateway's pending entries list (the lease) until it is
  acknowledged with its result. The gateway renews it (``XCLAIM … JUSTID`` resets its idle
  time); one idle longer than ``lease_s`` belonged to a gateway that died, and
  ``XAUTOCLAIM`` hands it to another: **at least once**;
- ``…:results`` — line → result, set with ``HSETNX`` in the same script that acknowledges
  the entry: the first result wins, so a request that ran twice is in the output **once**;
- ``…:later`` — requests given back to be tried again after a delay (refused for load),
  as a sorted set by when; due ones go back to the stream;
- ``…:ids`` — line → ``custom_id``, for the error file's lines of requests never run.

Across batches: ``shuniu:batches:all`` and ``shuniu:batches:tenant:<t>`` (sorted by
creation) and ``shuniu:batches:open`` (unfinished ones). A finished batch keeps only its
meta hash: its stream and results are deleted once its files are written.

The initial entries have the ids ``0-1``, ``0-2``, …: adding a batch's requests again
(after a gateway died validating it) adds none twice, since Redis refuses an id that is
not above the stream's last.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from shuniu.core.batch.queue import TERMINAL, BatchQueue, BatchRecord, Item, Result
from shuniu.core.redis_client import RedisConnection, connect_redis
from shuniu.core.types import Principal

__all__ = ["RedisBatchQueue"]

_GROUP = "workers"
_ALL = "shuniu:batches:all"
_OPEN = "shuniu:batches:open"
_CHUNK = 1000
_FIELDS = ("output_file_id", "error_file_id", "errors")

# KEYS: meta q later results ids; ARGV: to, now, terminal, n, frm[1..n], field, value, ...
_MOVE = """
local status = redis.call('HGET', KEYS[1], 'status')
local n = tonumber(ARGV[4])
local ok = false
for i = 5, 4 + n do if status == ARGV[i] then ok = true end end
if not ok then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], 't:' .. ARGV[1] .. '_at', ARGV[2])
for i = 5 + n, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
if ARGV[3] == '1' then redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5]) end
return 1
"""

# KEYS: meta q results; ARGV: line, entry id, result, state
_FINISH = """
local status = redis.call('HGET', KEYS[1], 'status')
local recorded = 0
if (status == 'in_progress' or status == 'cancelling') and redis.call('HGET', KEYS[1], 'ended_all') ~= '1'
   and redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[3]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'n:' .. ARGV[4], 1)
  recorded = 1
end
redis.call('XACK', KEYS[2], 'workers', ARGV[2])
redis.call('XDEL', KEYS[2], ARGV[2])
return recorded
"""

# KEYS: q later results; ARGV: entry id, consumer, line, when, entry
_RETRY = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local p = redis.call('XPENDING', KEYS[1], 'workers', ARGV[1], ARGV[1], 1)
if #p == 0 or p[1][2] ~= ARGV[2] then return 0 end
redis.call('XACK', KEYS[1], 'workers', ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
if redis.call('HEXISTS', KEYS[3], ARGV[3]) == 1 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
return 1
"""

# KEYS: later q; ARGV: now, limit
_PROMOTE = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, entry in ipairs(due) do
  redis.call('XADD', KEYS[2], '*', 'e', entry)
  redis.call('ZREM', KEYS[1], entry)
end
return #due
"""

# KEYS: q; ARGV: consumer, entry ids...
_RENEW = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local n = 0
for i = 2, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], 'workers', ARGV[i], ARGV[i], 1)
  if #p > 0 and p[1][2] == ARGV[1] then
    redis.call('XCLAIM', KEYS[1], 'workers', ARGV[1], 0, ARGV[i], 'JUSTID')
    n = n + 1
  end
end
return n
"""

_encode = msgspec.msgpack.encode
_decode = msgspec.msgpack.decode


class _Keys:
    __slots__ = ("ids", "later", "meta", "q", "results")

    def __init__(self, batch_id: str) -> None:
        tag = "{shuniu:batch:" + batch_id + "}"
        self.meta = f"{tag}:meta"
        self.q = f"{tag}:q"
        self.later = f"{tag}:later"
        self.results = f"{tag}:results"
        self.ids = f"{tag}:ids"

    @property
    def all(self) -> list[str]:
        return [self.meta, self.q, self.later, self.results, self.ids]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _tenant_key(tenant: str) -> str:
    return f"shuniu:batches:tenant:{tenant}"


class RedisBatchQueue(BatchQueue):
    """Batches and their requests in Redis (one server, Sentinel or Cluster)."""

    def __init__(self, url: str, *, lease_s: float, timeout_s: float = 10.0) -> None:
        self.url = url
        self.lease_s = lease_s
        """``batches.lease_s``: a request unacknowledged this long is a dead gateway's."""
        self.timeout_s = timeout_s
        self.opened = False
        self.consumer = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        """This gateway's name in the consumer groups: new at each start, so a gateway
        restarted never takes its former self's entries for its own."""
        self._conn: RedisConnection | None = None
        self._scripts: dict[str, Any] = {}
        self._turn = 0

    def exists(self) -> bool:
        return True

    async def open(self) -> None:
        if self.opened:
            return
        conn = connect_redis(self.url, timeout_s=self.timeout_s, max_connections=32, what="the batch queue")
        client = conn.client
        self._scripts = {
            name: client.register_script(source)
            for name, source in (
                ("move", _MOVE),
                ("finish", _FINISH),
                ("retry", _RETRY),
                ("promote", _PROMOTE),
                ("renew", _RENEW),
            )
        }
        self._conn = conn
        self.opened = True

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
        self.opened = False

    @property
    def _r(self) -> Any:
        assert self._conn is not None, "open() first"
        return self._conn.client

    # -- batches ------------------------------------------------------------------------

    async def create(self, batch: BatchRecord) -> None:
        await self.open()
        keys = _Keys(batch.id)
        fixed = {
            "id": batch.id,
            "tenant": batch.tenant,
            "principal": msgspec.json.encode(batch.principal).decode(),
            "endpoint": batch.endpoint,
            "input_file_id": batch.input_file_id,
            "completion_window": batch.completion_window,
            "created_at": batch.created_at,
            "expires_at": batch.expires_at,
            "status": batch.status,
        }
        if batch.metadata:
            fixed["metadata"] = json.dumps(batch.metadata)
        # The record first, then the indexes: a batch listed is one that can be read.
        await self._r.hset(keys.meta, mapping=fixed)
        pipe = self._r.pipeline(transaction=False)
        pipe.zadd(_ALL, {batch.id: batch.created_at})
        pipe.zadd(_tenant_key(batch.tenant), {batch.id: batch.created_at})
        pipe.sadd(_OPEN, batch.id)
        await pipe.execute()

    async def _records(self, ids: Sequence[Any]) -> list[BatchRecord]:
        if not ids:
            return []
        pipe = self._r.pipeline(transaction=False)
        for batch_id in ids:
            pipe.hgetall(_Keys(_text(batch_id)).meta)
        return [r for r in (_record(h) for h in await pipe.execute()) if r is not None]

    async def get(self, batch_id: str) -> BatchRecord | None:
        await self.open()
        return _record(await self._r.hgetall(_Keys(batch_id).meta))

    async def list(self, tenant: str | None) -> list[BatchRecord]:
        await self.open()
        ids = await self._r.zrange(_ALL if tenant is None else _tenant_key(tenant), 0, -1)
        return await self._records(ids)

    async def with_status(self, *statuses: str) -> list[BatchRecord]:
        await self.open()
        records = await self._records(list(await self._r.smembers(_OPEN)))
        done = [r.id for r in records if r.status in TERMINAL]
        if done:  # a gateway that died between a batch's end and this index's update
            await self._r.srem(_OPEN, *done)
        return [r for r in records if r.status in statuses]

    async def move(self, batch: BatchRecord, frm: Sequence[str], to: str, **fields: Any) -> bool:
        now = int(time.time())
        pairs: list[Any] = []
        for name, value in fields.items():
            if name not in _FIELDS:
                raise ValueError(f"not a batch field: {name}")
            if value is not None:
                pairs += [name, json.dumps(value) if name == "errors" else value]
        terminal = to in TERMINAL
        keys = _Keys(batch.id)
        changed = await self._scripts["move"](
            keys=keys.all, args=[to, now, "1" if terminal else "0", len(frm), *frm, *pairs]
        )
        if not changed:
            return False
        if terminal:
            await self._r.srem(_OPEN, batch.id)
        batch.status = to
        batch.times = {**batch.times, f"{to}_at": now}
        for name, value in fields.items():
            setattr(batch, name, value)
        return True

    async def counts(self, batch_ids: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
        await self.open()
        if batch_ids is None:
            batch_ids = [_text(i) for i in await self._r.zrange(_ALL, 0, -1)]
        if not batch_ids:
            return {}
        pipe = self._r.pipeline(transaction=False)
        for batch_id in batch_ids:
            keys = _Keys(batch_id)
            pipe.hmget(keys.meta, "total", "n:done", "n:failed", "ended", "ended_all")
            pipe.xpending(keys.q, _GROUP)
        replies = await pipe.execute(raise_on_error=False)
        out: dict[str, dict[str, int]] = {}
        for i, batch_id in enumerate(batch_ids):
            meta, pending = replies[2 * i], replies[2 * i + 1]
            if isinstance(meta, Exception):
                raise meta
            total, done, failed = (int(v) if v is not None else 0 for v in meta[:3])
            ended, ended_all = meta[3], meta[4]
            running = 0 if isinstance(pending, Exception) or ended_all else int(pending["pending"])
            left = max(0, total - done - failed - running)
            states = {"done": done, "failed": failed, "running": running}
            states[_text(ended) if ended else "pending"] = left
            out[batch_id] = {k: v for k, v in states.items() if v}
        return out

    # -- requests -----------------------------------------------------------------------

    async def add_items(self, batch_id: str, lines: Sequence[tuple[str, bytes]]) -> None:
        await self.open()
        keys = _Keys(batch_id)
        await self._group(keys.q)
        for start in range(0, len(lines), _CHUNK):
            pipe = self._r.pipeline(transaction=False)
            chunk = lines[start : start + _CHUNK]
            for i, (custom_id, body) in enumerate(chunk, start):
                pipe.xadd(keys.q, {"e": _encode((i, custom_id, body, 0))}, id=f"0-{i + 1}")
            pipe.hset(keys.ids, mapping={str(i): cid for i, (cid, _b) in enumerate(chunk, start)})
            for reply in await pipe.execute(raise_on_error=False):
                # An id at or below the stream's last: added by an earlier try already.
                if isinstance(reply, Exception) and "equal or smaller" not in str(reply):
                    raise reply
        await self._r.hset(keys.meta, "total", len(lines))

    async def _group(self, stream: str) -> None:
        try:
            await self._r.xgroup_create(stream, _GROUP, id="0", mkstream=True)
        except Exception as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def claim(self, batch_ids: Sequence[str], n: int, lease_s: float) -> list[Item]:
        if not batch_ids or n <= 0:
            return []
        await self.open()
        now = time.time()
        out: list[Item] = []
        # Start at a different batch each round, so one large batch does not starve others.
        self._turn = (self._turn + 1) % len(batch_ids)
        for batch_id in [*batch_ids[self._turn :], *batch_ids[: self._turn]]:
            want = n - len(out)
            if want <= 0:
                break
            keys = _Keys(batch_id)
            try:
                entries = await self._take(keys, want, now, lease_s)
            except Exception as exc:
                if "NOGROUP" in str(exc):
                    continue  # finished (and cleared) by another gateway meanwhile
                raise
            for entry_id, data in entries:
                if not data:
                    continue  # deleted meanwhile (its result is in)
                idx, custom_id, body, attempts = _decode(data[b"e"])
                out.append(Item(batch_id, idx, custom_id, body, attempts, _text(entry_id)))
        return out

    async def _take(self, keys: _Keys, want: int, now: float, lease_s: float) -> list[Any]:
        """Up to ``want`` entries of one batch's stream: due retries back in it first, then
        entries a dead gateway held past the lease, then new ones."""
        await self._scripts["promote"](keys=[keys.later, keys.q], args=[now, max(want, 100)])
        _next, stale, _gone = await self._r.xautoclaim(
            keys.q, _GROUP, self.consumer, int(lease_s * 1000), "0-0", count=want
        )
        entries = list(stale)
        if len(entries) < want:
            read = await self._r.xreadgroup(_GROUP, self.consumer, {keys.q: ">"}, count=want - len(entries))
            for _stream, fresh in read or ():
                entries += fresh
        return entries

    async def renew(self, items: Sequence[Item], lease_s: float) -> None:
        by_batch: dict[str, list[str]] = {}
        for item in items:
            by_batch.setdefault(item.batch_id, []).append(item.claim)
        for batch_id, entry_ids in by_batch.items():
            await self._scripts["renew"](keys=[_Keys(batch_id).q], args=[self.consumer, *entry_ids])

    async def finish(
        self, item: Item, state: str, status_code: int | None, response: bytes | None, request_id: str
    ) -> bool:
        keys = _Keys(item.batch_id)
        text = response.decode() if response is not None else None
        result = _encode((state, status_code, text, request_id))
        recorded = await self._scripts["finish"](
            keys=[keys.meta, keys.q, keys.results], args=[item.idx, item.claim, result, state]
        )
        return bool(recorded)

    async def retry_later(self, item: Item, delay_s: float, *, attempt: bool) -> None:
        keys = _Keys(item.batch_id)
        entry = _encode((item.idx, item.custom_id, item.body, item.attempts + (1 if attempt else 0)))
        await self._scripts["retry"](
            keys=[keys.q, keys.later, keys.results],
            args=[item.claim, self.consumer, item.idx, time.time() + delay_s, entry],
        )

    async def end_open(self, batch_id: str, state: str, *, running_too: bool) -> None:
        keys = _Keys(batch_id)
        await self._r.hset(keys.meta, mapping={"ended": state, **({"ended_all": "1"} if running_too else {})})
        if running_too:
            return
        # Requests still held by a gateway that died will never be acknowledged by it: the
        # batch would wait for them for ever. Take them (idle past any lease) and let go.
        try:
            stale = await self._r.xautoclaim(  # with justid, redis-py answers only the ids
                keys.q, _GROUP, self.consumer, int(self.lease_s * 1000), "0-0", count=1000, justid=True
            )
        except Exception as exc:
            if "NOGROUP" in str(exc):
                return  # never validated: nothing was queued
            raise
        if stale:
            await self._r.xack(keys.q, _GROUP, *stale)

    async def results(self, batch_id: str) -> list[Result]:
        keys = _Keys(batch_id)
        pipe = self._r.pipeline(transaction=False)
        pipe.hmget(keys.meta, "total", "ended")
        pipe.hgetall(keys.ids)
        pipe.hgetall(keys.results)
        (total, ended), ids, results = await pipe.execute()
        left = _text(ended) if ended else "pending"
        out: list[Result] = []
        for idx in range(int(total or 0)):
            custom_id = _text(ids.get(str(idx).encode(), b""))
            found = results.get(str(idx).encode())
            if found is None:
                out.append((idx, custom_id, left, None, None, None))
            else:
                state, code, response, request_id = _decode(found)
                out.append((idx, custom_id, state, code, response, request_id))
        return out


def _record(fields: dict[bytes, bytes]) -> BatchRecord | None:
    if not fields:
        return None
    f = {_text(k): _text(v) for k, v in fields.items()}
    if "id" not in f:
        return None  # counters of a batch whose record is gone
    return BatchRecord(
        id=f["id"],
        tenant=f["tenant"],
        principal=msgspec.json.decode(f["principal"], type=Principal),
        endpoint=f["endpoint"],
        input_file_id=f["input_file_id"],
        completion_window=f["completion_window"],
        status=f["status"],
        created_at=int(f["created_at"]),
        expires_at=int(f["expires_at"]),
        times={k[2:]: int(v) for k, v in f.items() if k.startswith("t:")},
        output_file_id=f.get("output_file_id"),
        error_file_id=f.get("error_file_id"),
        metadata=json.loads(f["metadata"]) if "metadata" in f else None,
        errors=json.loads(f["errors"]) if "errors" in f else None,
    )
