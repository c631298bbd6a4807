"""The ledger's database engine, chosen from its URL."""

from __future__ import annotations

from pathlib import Path

from shuniu.core.governance.database import Database

__all__ = ["open_database"]


def open_database(url: str, *, base: Path, timeout_s: float) -> Database:
    """The database ``url`` names (not connected yet); a relative SQLite path is taken from
    ``base`` (the deployment file's folder)."""
    if url.startswith("sqlite:///"):
        from shuniu.core.governance.sqlite import SqliteDatabase

        path = Path(url.removeprefix("sqlite:///"))
        return SqliteDatabase(path if path.is_absolute() else base / path, timeout_s=timeout_s)
    from shuniu.core.governance.postgres import PostgresDatabase

    return PostgresDatabase(url, timeout_s=timeout_s)
