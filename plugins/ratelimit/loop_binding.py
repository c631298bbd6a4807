"""A principal's memory-store limits checked by loops over typed rates: what a compiled build
runs for :class:`~shuniu.plugins.ratelimit.memory.MemoryBinding`.

A regular install compiles this module with mypyc (``setup.py``; the list is
``core/compiled.py``). Compiled, its loops over native objects with float fields cost about
half of what the interpreter spends on the straight-line functions that
:class:`~shuniu.plugins.ratelimit.memory.MemoryBinding` writes for each principal; run by the
interpreter, those straight lines are the cheaper of the two, so a pure-Python install keeps
them (``MemoryBinding`` chooses by :data:`COMPILED`). Both book the same bits as
:meth:`~shuniu.plugins.ratelimit.memory.MemoryRateLimitStore.acquire_now` (the arithmetic is
the same, in the same order): ``tests/test_ratelimit_binding.py`` checks each against it,
this one also compiled (``tests/test_compiled_build.py``).

The store is reached through the few attributes the binding needs (its clock, its sweep
threshold and its bookkeeping methods), the same ones the generated functions read; its two
dicts are held here (the store never replaces them: its sweep empties and refills them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shuniu.core.tenancy.binding import Binding

__all__ = ["COMPILED", "LeaseLimit", "LoopBinding", "RateLimit"]

COMPILED = not __file__.endswith(".py")
"""Whether this module runs compiled (loaded from an extension module)."""


class RateLimit:
    """One GCRA rate of a binding, its limit already scaled (see ``memory._compiled``)."""

    key: str
    interval: float
    """Seconds one unit adds to the key's debt: ``period / limit``."""
    cap: float
    """The most debt a request may leave: ``period`` plus the tolerance."""
    limit: float
    period: float
    most: int
    """The most units a header may show: ``int(limit)``."""
    debt: float
    """Scratch: the debt the request being checked would leave (a native float field, not a
    list of boxed ones; ``take`` runs without awaiting, so one binding's calls never
    interleave)."""

    def __init__(self, key: str, interval: float, cap: float, limit: float, period: float, most: int) -> None:
        self.key = key
        self.interval = interval
        self.cap = cap
        self.limit = limit
        self.period = period
        self.most = most
        self.debt = 0.0


class LeaseLimit:
    """One concurrency limit of a binding, scaled."""

    key: str
    limit: int
    ttl: float

    def __init__(self, key: str, limit: int, ttl: float) -> None:
        self.key = key
        self.limit = limit
        self.ttl = ttl


class LoopBinding(Binding):
    """``take`` and ``give_back`` of :class:`~shuniu.plugins.ratelimit.memory.MemoryBinding`
    (see there for what they answer), for one principal's rates and leases. A
    :class:`~shuniu.core.tenancy.binding.Binding`: the compiled tenancy calls it directly."""

    store: Any
    tats: dict[str, float]
    """The store's GCRA keys (its ``_tats``)."""
    held: dict[str, dict[object, float]]
    """The store's concurrency keys (its ``_leases``)."""
    requests: list[RateLimit]
    tokens: list[RateLimit]
    leases: list[LeaseLimit]
    max_cost: float
    """A token cost above this refuses (infinite without token rates)."""
    never: bool
    """A limit refuses every request (0, or below one request once scaled)."""
    record: Callable[[float, tuple[float, ...]], None]
    """Books one by one, sweeping when due: ``MemoryBinding._record``."""

    def __init__(
        self,
        store: Any,
        requests: list[RateLimit],
        tokens: list[RateLimit],
        leases: list[LeaseLimit],
        max_cost: float,
        never: bool,
        record: Callable[[float, tuple[float, ...]], None],
    ) -> None:
        self.store = store
        self.tats = store._tats
        self.held = store._leases
        self.requests = requests
        self.tokens = tokens
        self.leases = leases
        self.max_cost = max_cost
        self.never = never
        self.record = record

    def take(self, cost: float, token: object) -> tuple[int, int, float, int, int, float] | None:
        if self.never or cost > self.max_cost:
            return None
        store = self.store
        now: float = store.clock()
        tats = self.tats
        requests = self.requests
        tokens = self.tokens
        for rate in requests:
            tat = tats.get(rate.key, now)
            debt = tat - now + rate.interval if tat > now else rate.interval
            if debt > rate.cap:
                return None
            rate.debt = debt
        for rate in tokens:
            tat = tats.get(rate.key, now)
            debt = cost * rate.period / rate.limit  # as acquire_now computes it
            if tat > now:
                debt += tat - now
            if debt > rate.cap:
                return None
            rate.debt = debt
        leases = self.leases
        held = self.held
        for lease in leases:
            holders = held.get(lease.key)
            if holders and len(holders) >= lease.limit:
                store._expire(holders, now)
                if len(holders) >= lease.limit:
                    return None
        # Every limit allows it: record (a cost-0 check of a full key leaves no entry).
        n = len(requests) + len(tokens)
        if n:
            if len(tats) + n >= store._sweep_at or not cost:
                booked = [now + rate.debt for rate in requests]
                booked.extend([now + rate.debt for rate in tokens])
                self.record(now, tuple(booked))
            else:
                for rate in requests:
                    tats[rate.key] = now + rate.debt
                for rate in tokens:
                    tats[rate.key] = now + rate.debt
        # Looked up again: a sweep in ``record`` may have dropped an emptied holders dict.
        # (Otherwise an emptied one stays, for the next request to reuse: see give_back.)
        for lease in leases:
            holders = held.get(lease.key)
            if holders is None:
                holders = store._holders(lease.key, now)
            holders[token] = now + lease.ttl
        r_i, r_left, r_reset = _tightest(requests)
        t_i, t_left, t_reset = _tightest(tokens)
        return r_i, r_left, r_reset, t_i, t_left, t_reset

    def give_back(self, delta: float, token: object) -> None:
        store = self.store
        if delta and self.tokens:
            # MemoryRateLimitStore._move for each token rate (the same arithmetic).
            now: float = store.clock()
            tats = self.tats
            for rate in self.tokens:
                key = rate.key
                tat = tats.get(key, now)
                if tat > now or delta > 0:  # else nothing booked to give back
                    if tat <= now:
                        tat = now
                    tat += delta * rate.period / rate.limit
                    if tat > now:
                        if key not in tats and len(tats) >= store._sweep_at:
                            store._sweep(now)
                        tats[key] = tat
                    else:
                        tats.pop(key, None)
        if self.leases:
            held = self.held
            # An emptied holders dict stays (the store's sweep drops it): this principal's
            # next request would only make it again.
            for lease in self.leases:
                holders = held.get(lease.key)
                if holders is not None:
                    holders.pop(token, None)


def _tightest(rates: list[RateLimit]) -> tuple[int, int, float]:
    """The rate with the fewest units left after the booking (each rate's ``debt``; the
    first wins a tie): its index in ``rates``, those units and its debt (its reset);
    ``(-1, 0, 0.0)`` for none."""
    best, fewest, reset = -1, 0, 0.0
    i = 0
    for rate in rates:
        debt = rate.debt
        left = int((rate.cap - debt) * rate.limit / rate.period)
        if left > rate.most:
            left = rate.most
        if best < 0 or left < fewest:
            best, fewest, reset = i, left, debt
        i += 1
    return best, fewest, reset
