"""The file store contract: where uploaded files (``POST /v1/files``) and the files the
gateway writes (a batch's output and errors) are kept.

Where it runs: off the inference path, on the Files API's routes and, for batches, in the
batch runner. A ``register_file_stores`` hook registers ``factory(options) -> FileStore``
per ``files.store``; the built-in ``local`` store keeps each file on local disk. A store
keeps a file's bytes and its :class:`StoredFile` record together; ids are made by the
gateway (``file-`` and 24 random hex digits), so a store never chooses one.
"""

from __future__ import annotations

from typing import Protocol

import msgspec

__all__ = ["FileStore", "StoredFile"]


class StoredFile(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A file's record, as the Files API answers it (plus its owner)."""

    id: str
    tenant: str
    """The tenant it belongs to: other tenants' credentials never see it."""
    filename: str
    purpose: str
    bytes: int
    created_at: int
    """Seconds since 1970."""
    lines: int = 0
    """Requests in a ``batch`` input file (checked at upload)."""
    expires_at: int | None = None


class FileStore(Protocol):
    """Files and their records. Every method may do I/O; none blocks the event loop."""

    async def put(self, record: StoredFile, content: bytes) -> None:
        """Keep ``content`` under ``record.id`` with its record (replacing nothing: ids are
        new)."""
        ...

    async def get(self, file_id: str) -> StoredFile | None:
        """The record, or ``None`` when there is no such file."""
        ...

    async def content(self, file_id: str) -> bytes | None:
        """The bytes, or ``None`` when there is no such file."""
        ...

    async def list(self) -> list[StoredFile]:
        """Every record (the gateway filters by tenant and purpose and orders)."""
        ...

    async def delete(self, file_id: str) -> bool:
        """Remove the file; ``False`` when there was none."""
        ...

    async def close(self) -> None:
        """Release what the store holds (connections, threads)."""
        ...
