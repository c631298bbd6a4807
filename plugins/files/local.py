"""``local``: files on this host's disk, one folder per gateway (or shared by the gateways
of one host).

Each file is two entries in ``dir``: ``<id>.data`` (its bytes) and ``<id>.json`` (its
record), each written to a temporary name and renamed, so a crash leaves a whole file or
none. Disk calls run in a thread: the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import msgspec
from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import FileStore, RegisterFileStore, StoredFile

__all__ = ["LocalFileStore", "LocalFileStoreOptions"]

_decode = msgspec.json.Decoder(StoredFile).decode
_encode = msgspec.json.Encoder().encode


class LocalFileStoreOptions(Options):
    """Options of the ``local`` file store."""

    dir: str = Field("shuniu-files", min_length=1)
    """The folder (created on the first upload); a relative one is taken from the gateway's
    working directory."""


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


class LocalFileStore(FileStore):
    """Files in a folder."""

    def __init__(self, options: LocalFileStoreOptions | None) -> None:
        self.dir = Path((options or LocalFileStoreOptions()).dir)

    def _paths(self, file_id: str) -> tuple[Path, Path]:
        if not file_id.replace("-", "").replace("_", "").isalnum():
            raise ValueError("not a file id")
        return self.dir / f"{file_id}.data", self.dir / f"{file_id}.json"

    async def put(self, record: StoredFile, content: bytes) -> None:
        data, meta = self._paths(record.id)

        def write() -> None:
            self.dir.mkdir(parents=True, exist_ok=True)
            _write(data, content)
            _write(meta, _encode(record))  # the record last: a file without one is not listed

        await asyncio.to_thread(write)

    async def get(self, file_id: str) -> StoredFile | None:
        try:
            _data, meta = self._paths(file_id)
        except ValueError:
            return None

        def read() -> StoredFile | None:
            try:
                return _decode(meta.read_bytes())
            except (OSError, msgspec.DecodeError):
                return None

        return await asyncio.to_thread(read)

    async def content(self, file_id: str) -> bytes | None:
        try:
            data, meta = self._paths(file_id)
        except ValueError:
            return None

        def read() -> bytes | None:
            if not meta.exists():
                return None
            try:
                return data.read_bytes()
            except OSError:
                return None

        return await asyncio.to_thread(read)

    async def list(self) -> list[StoredFile]:
        def read() -> list[StoredFile]:
            out = []
            if not self.dir.is_dir():
                return out
            for meta in self.dir.glob("*.json"):
                try:
                    out.append(_decode(meta.read_bytes()))
                except (OSError, msgspec.DecodeError):
                    continue  # removed meanwhile, or not one of ours
            return out

        return await asyncio.to_thread(read)

    async def delete(self, file_id: str) -> bool:
        try:
            data, meta = self._paths(file_id)
        except ValueError:
            return False

        def remove() -> bool:
            try:
                meta.unlink()  # the record first: from now on the file does not exist
            except FileNotFoundError:
                return False
            data.unlink(missing_ok=True)
            return True

        return await asyncio.to_thread(remove)

    async def close(self) -> None:
        pass


@hookimpl
def register_file_stores(register: RegisterFileStore) -> None:
    register(
        "local",
        LocalFileStore,
        options=LocalFileStoreOptions,
        description="Files on this host's disk (a folder).",
    )
