"""A request's hold on its rate limits (in its own module: msgspec reads a struct's
annotations from its module, which a compiled ``tenancy`` would not give it)."""

from __future__ import annotations

from typing import Any

import msgspec

from shuniu.core.contracts import Lease, Rate

__all__ = ["Admission"]


class Admission(msgspec.Struct):
    """A request's hold on its rate limits, settled when it ends. A struct: made in C, one
    per limited request."""

    token: int | str
    """The request's booking token (its leases are held under it): a string the store
    shares with other gateways, or an int in a binding of this process's memory store."""
    tokens: list[Rate]
    """The token rates its reservation was booked on (empty when a binding booked it)."""
    leases: list[Lease]
    reserved: int
    """Tokens reserved: prompt plus ``max_tokens`` (or the default)."""
    headers: list[tuple[bytes, bytes]]
    """``x-ratelimit-*`` headers for the response."""
    binding: Any = None
    """The store binding that booked it (then it settles there), else ``None``."""
