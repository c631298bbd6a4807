"""Ids of the objects the gateway makes (files, batches)."""

from __future__ import annotations

import secrets
import time

__all__ = ["new_id"]


def new_id(prefix: str) -> str:
    """``prefix`` and 24 hex digits: the creation time in nanoseconds, then random bits,
    so ids made one after another sort in the order they were made (listings break ties
    of ``created_at``, a whole second, by id)."""
    return f"{prefix}{time.time_ns():016x}{secrets.token_hex(4)}"
