"""The rate-limit store contract, and the values that pass between the gateway and a store.

Where it runs: after routing, before the response cache, for every request a tier or a
credential limits: one :meth:`RateLimitStore.acquire` per request (all its limits at
once), and one :meth:`RateLimitStore.settle` when it ends. A ``register_rate_limiters``
hook registers ``factory(options) -> RateLimitStore`` per ``rate_limits.store``.

The algorithm is GCRA (the generic cell rate algorithm, a token bucket written as one
timestamp per key). A limit of ``limit`` units per ``period_s`` has the emission interval
``T = period_s / limit``; each key stores its theoretical arrival time ``tat``. A request
costing ``c`` units is allowed when ``max(tat, now) + c*T - now <= period_s``, which lets an
idle key take its whole ``limit`` at once (a burst of one period's worth, as "N per minute"
reads) and then refills continuously. Why GCRA rather than a fixed window or a sliding log:
one number per key (cheap in memory and in Redis), no burst of twice the limit at window
edges, exact for any cost (tokens as well as requests), and the "try again in" time falls
out of it.

Tokens are reserved at admission (prompt + ``max_tokens``) and settled with the real usage
when the request ends: :meth:`RateLimitStore.settle` moves the key's ``tat`` by the
difference, so an unused reservation is given back.

Concurrency limits are leases: a request holds one per scope until it ends. Stores that are
shared between processes give leases an expiry, so a crashed gateway cannot leak them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

__all__ = ["Decision", "Lease", "Rate", "RateLimitStore"]


class Rate(msgspec.Struct, frozen=True):
    """One GCRA limit checked for a request."""

    key: str
    """The store key of the limited scope and kind, e.g. ``k:team-a-prod:rpm``. Stores may
    prefix it (a Redis key prefix); it is never a credential."""
    limit: float
    """Units allowed per period (and the largest burst)."""
    period_s: float
    """60 for per-minute limits, 86400 for per-day."""
    cost: float
    """Units this request takes: 1 for request limits, the reserved tokens for token limits."""


class Lease(msgspec.Struct, frozen=True):
    """One concurrency limit checked for a request."""

    key: str
    """The store key, e.g. ``t:team-a:concurrency``."""
    limit: int
    """Requests that may hold a lease at once."""
    ttl_s: float = 900.0
    """Shared stores drop a lease not released after this long (a gateway that died)."""


class Decision(msgspec.Struct):
    """A store's answer to :meth:`RateLimitStore.acquire`."""

    allowed: bool
    retry_after_s: float = 0.0
    """When refused: how long until the refusing limit would allow this request."""
    denied: str | None = None
    """When refused: the key of the (first) limit that refused it."""
    remaining: tuple[float, ...] = ()
    """Per rate, in the order given: units left after this request (before it, if refused)."""
    reset_s: tuple[float, ...] = ()
    """Per rate: seconds until the key is back to its full limit."""
    degraded: bool = False
    """The store could not reach its shared state and answered from its fallback."""


class RateLimitStore(Protocol):
    """Keeps GCRA timestamps and concurrency leases. Built once per gateway from options
    (``rate_limits.store`` and ``rate_limits.options`` in the deployment).

    ``acquire`` is all-or-nothing: when any rate or lease refuses, nothing is recorded.
    Methods must not raise for an unreachable backing service: stores decide (by their
    options) whether to allow or refuse then, and say so with ``Decision.degraded``.
    """

    async def acquire(self, rates: Sequence[Rate], leases: Sequence[Lease], token: str) -> Decision:
        """Check every rate and lease for one request and, if all allow it, record it.

        ``token`` identifies the request's leases (unique per request across gateways)."""
        ...

    async def settle(self, adjust: Sequence[tuple[Rate, float]], leases: Sequence[Lease], token: str) -> None:
        """The request ended: change each rate's recorded cost by the given number of units
        (negative gives back an unused reservation) and release its leases."""
        ...

    async def close(self) -> None:
        """Release connections; called once at shutdown."""
        ...

    # A store that keeps its state in the gateway process may also offer
    # ``acquire_now(rates, leases, token) -> Decision`` and ``settle_now(adjust, leases,
    # token) -> None``: the same calls without a coroutine (they must not await). The gateway
    # then uses them on the request path, a coroutine less per request; ``memory`` does.
    # Such a store may further offer ``bind(request_rates, token_rates, leases)``: one
    # principal's limits compiled once, whose ``take(cost, token)`` and ``give_back(delta,
    # token)`` book and settle a request without a Rate or a Decision built for it
    # (``shuniu.plugins.ratelimit.memory.MemoryBinding`` documents the calls).
