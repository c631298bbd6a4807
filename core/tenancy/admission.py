"""A request's hold on its rate limits.

A regular install compiles this module with mypyc (``core/compiled.py``): the tenancy makes
one per limited request and the request path's settle step reads it back, both compiled, so
a native class is made and read in C."""

from __future__ import annotations

from typing import Any

from shuniu.core.contracts import Lease, Rate

__all__ = ["Admission"]


class Admission:
    """A request's hold on its rate limits, settled when it ends."""

    __slots__ = ("binding", "headers", "leases", "reserved", "token", "tokens")

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
    binding: Any
    """The store binding that booked it (then it settles there), else ``None``."""

    def __init__(
        self,
        token: int | str,
        tokens: list[Rate],
        leases: list[Lease],
        reserved: int,
        headers: list[tuple[bytes, bytes]],
        binding: Any = None,
    ) -> None:
        self.token = token
        self.tokens = tokens
        self.leases = leases
        self.reserved = reserved
        self.headers = headers
        self.binding = binding
