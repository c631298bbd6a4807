"""``redis``: files in Redis, shared by every gateway of a fleet (with the Redis batch queue,
any gateway validates, runs and finishes any batch, whichever took the upload).

Each file is ``{<prefix><id>}`` (its bytes, a string) and a field of ``<prefix>index`` (its
record). The bytes go up in chunks to a temporary key that is renamed when whole, and the
record is written last, so a crash or a dead connection leaves a whole file or none; they
come back in chunks too, so no single reply holds a whole large file in Redis's output
buffer. Redis keeps a string up to 512 MB: ``files.max_file_bytes`` stays below it.
"""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import Field, field_validator

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import FileStore, RegisterFileStore, StoredFile
from shuniu.core.redis_client import check_redis_url, connect_redis

__all__ = ["RedisFileStore", "RedisFileStoreOptions"]

_decode = msgspec.json.Decoder(StoredFile).decode
_encode = msgspec.json.Encoder().encode


class RedisFileStoreOptions(Options):
    """Options of the ``redis`` file store."""

    url: str = "redis://127.0.0.1:6379/0"
    """Redis URL (one server, ``redis+sentinel://`` or ``redis+cluster://``; see
    ``docs/high-availability.md``)."""
    key_prefix: str = "shuniu:files:"
    """Prefix of every key this store writes."""
    timeout_s: float = Field(10.0, gt=0)
    """Connect and read timeout of each call."""
    chunk_bytes: int = Field(4 * 1024 * 1024, ge=64 * 1024)
    """Bytes per write and per read of a file's content."""

    @field_validator("url")
    @classmethod
    def _known_shape(cls, url: str) -> str:
        return check_redis_url(url)


class RedisFileStore(FileStore):
    """Files in Redis strings, their records in one hash."""

    def __init__(self, options: RedisFileStoreOptions | None) -> None:
        self.options = opts = options or RedisFileStoreOptions()
        self._conn = connect_redis(
            opts.url, timeout_s=opts.timeout_s, max_connections=16, what="The redis file store"
        )
        self._r: Any = self._conn.client
        self._index = opts.key_prefix + "index"

    def _key(self, file_id: str) -> str:
        # A hash tag: the temporary key and the file's key share a Cluster slot (RENAME).
        return "{" + self.options.key_prefix + file_id + "}"

    async def put(self, record: StoredFile, content: bytes) -> None:
        key = self._key(record.id)
        tmp = key + ":partial"
        step = self.options.chunk_bytes
        await self._r.delete(tmp)
        for start in range(0, len(content), step):
            await self._r.append(tmp, content[start : start + step])
        if content:
            await self._r.rename(tmp, key)
        else:
            await self._r.set(key, b"")
        await self._r.hset(self._index, record.id, _encode(record))  # the record last

    async def get(self, file_id: str) -> StoredFile | None:
        raw = await self._r.hget(self._index, file_id)
        if raw is None:
            return None
        try:
            return _decode(raw)
        except msgspec.DecodeError:
            return None

    async def content(self, file_id: str) -> bytes | None:
        if not await self._r.hexists(self._index, file_id):
            return None
        key = self._key(file_id)
        size = int(await self._r.strlen(key))
        step = self.options.chunk_bytes
        parts = [await self._r.getrange(key, start, start + step - 1) for start in range(0, size, step)]
        return b"".join(parts)

    async def list(self) -> list[StoredFile]:
        out = []
        for raw in await self._r.hvals(self._index):
            try:
                out.append(_decode(raw))
            except msgspec.DecodeError:
                continue
        return out

    async def delete(self, file_id: str) -> bool:
        if not await self._r.hdel(self._index, file_id):  # the record first: gone from now on
            return False
        await self._r.unlink(self._key(file_id))
        return True

    async def close(self) -> None:
        await self._conn.close()


@hookimpl
def register_file_stores(register: RegisterFileStore) -> None:
    register(
        "redis",
        RedisFileStore,
        options=RedisFileStoreOptions,
        description="Files in Redis, shared by the gateways of a fleet.",
    )
