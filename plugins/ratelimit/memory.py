"""``memory``: rate limits kept in the gateway process.

Right for a single gateway, and as the Redis store's fallback while Redis is unreachable.
Each GCRA key is one float in a dict; each concurrency key a dict of the tokens holding a
lease. Every method runs without awaiting, so within one event loop each call is atomic.

A key whose ``tat`` is in the past holds no information (it is as if absent), so expired
keys are swept whenever the dict has doubled since the last sweep: amortised O(1) per new
key, and the dict stays near the number of keys used within one period.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Sequence

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Decision, Lease, Rate, RateLimitStore, RegisterRateLimitStore
from shuniu.plugins.ratelimit.gcra import EPSILON_S, INF, remaining

__all__ = ["MemoryBinding", "MemoryRateLimitOptions", "MemoryRateLimitStore"]

log = logging.getLogger("shuniu.ratelimit")

_MIN_SWEEP = 4096
"""No sweep runs while fewer keys than this are held: sweeping tiny dicts buys nothing."""
_LEASE_RETRY_S = 1.0
"""``retry_after_s`` for a full concurrency limit: when a holder finishes is unknowable."""


class MemoryRateLimitOptions(Options):
    """Options of the ``memory`` rate-limit store."""

    max_keys: int = Field(1_000_000, ge=1)
    """Most rate-limit keys kept (one per scope and kind, about 100 bytes each). Keys that
    have refilled are dropped first; if live keys alone exceed this, the ones closest to
    full are forgotten (about a tenth at a time, with a warning), which lets those scopes
    start over with a full allowance: more keys than this means the limits are keyed too
    finely (e.g. by a value clients choose)."""


class MemoryRateLimitStore(RateLimitStore):
    """The :class:`shuniu.core.contracts.RateLimitStore` of one process."""

    clock: Callable[[], float]
    """Seconds on a monotonic clock; tests replace it to move time."""

    def __init__(
        self,
        options: MemoryRateLimitOptions | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        scale: float = 1.0,
    ) -> None:
        """``scale`` multiplies every limit (the Redis store's fail-open fallback uses it)."""
        self.options = options or MemoryRateLimitOptions()
        self.clock = clock
        self.scale = scale
        self._tats: dict[str, float] = {}
        self._leases: dict[str, dict[str, float]] = {}
        """Concurrency key → token → when that lease expires."""
        self._sweep_at = min(_MIN_SWEEP, self.options.max_keys)
        self._warned_full = False

    # -- the protocol --------------------------------------------------------------------

    async def acquire(self, rates: Sequence[Rate], leases: Sequence[Lease], token: str) -> Decision:
        return self.acquire_now(rates, leases, token)

    async def settle(self, adjust: Sequence[tuple[Rate, float]], leases: Sequence[Lease], token: str) -> None:
        self.settle_now(adjust, leases, token)

    async def close(self) -> None:
        self._tats.clear()
        self._leases.clear()

    # -- synchronous versions (atomic by construction) ------------------------------------

    def acquire_now(self, rates: Sequence[Rate], leases: Sequence[Lease], token: str) -> Decision:
        """:meth:`acquire` without the coroutine.

        The GCRA step of :func:`~shuniu.plugins.ratelimit.gcra.check` and
        :func:`~shuniu.plugins.ratelimit.gcra.remaining` is written out inline: this runs for
        every limited request, and two calls per rate were a third of its cost."""
        now = self.clock()
        tats = self._tats
        scale = self.scale
        worst = 0.0
        denied: str | None = None
        debts: list[float] = []
        left: list[float] = []
        booked: dict[str, float] = {}  # keys booked earlier in this call (a key given twice)
        for rate in rates:
            key = rate.key
            limit = rate.limit * scale
            period = rate.period_s
            tat = booked.get(key) if booked else None
            if tat is None:
                tat = tats.get(key, now)
            debt = tat - now if tat > now else 0.0
            cost = rate.cost
            if 0.0 < limit and cost <= limit:
                new_debt = debt + cost * period / limit
                retry = new_debt - period
                if retry <= EPSILON_S:
                    debts.append(new_debt)
                    if new_debt > 0.0:  # a cost-0 check of a full key leaves no entry behind
                        booked[key] = now + new_debt
                    # int() is floor() here: below zero either gives "nothing left".
                    units = int((period + EPSILON_S - new_debt) * limit / period)
                    left.append(0.0 if units <= 0 else float(units) if units < limit else float(int(limit)))
                    continue
            else:
                retry = INF
            # Refused: the figures are recomputed from the stored state below.
            if retry > worst:  # the limit that refuses longest is the one to report
                worst, denied = retry, key
        held = self._leases
        for lease in leases:
            holders = held.get(lease.key)
            if holders is not None and token in holders:
                continue  # already held by this request
            limit_n = lease.limit if scale == 1.0 else max(1, int(lease.limit * scale))
            if holders and len(holders) >= limit_n:
                self._expire(holders, now)
            if (len(holders) if holders else 0) >= limit_n and _LEASE_RETRY_S > worst:
                worst, denied = _LEASE_RETRY_S, lease.key

        if denied is None:
            for key, tat in booked.items():
                if key not in tats and len(tats) >= self._sweep_at:
                    self._sweep(now)
                    tats = self._tats
                tats[key] = tat
            for lease in leases:
                holders = held.get(lease.key)
                if holders is None:
                    held[lease.key] = holders = {}
                holders[token] = now + lease.ttl_s
            return Decision(True, worst, None, tuple(left), tuple(debts))
        # Nothing recorded: report the keys as they were (a refusal is rare: no need to be
        # quick here).
        debts = []
        left = []
        for rate in rates:
            tat = tats.get(rate.key, now)
            debt = tat - now if tat > now else 0.0
            debts.append(debt)
            left.append(remaining(debt, rate.limit * scale, rate.period_s))
        return Decision(False, worst, denied, tuple(left), tuple(debts))

    def settle_now(self, adjust: Sequence[tuple[Rate, float]], leases: Sequence[Lease], token: str) -> None:
        """:meth:`settle` without the coroutine."""
        now = self.clock()
        for rate, delta in adjust:
            limit = rate.limit * self.scale
            if delta and limit > 0:
                self._move(rate.key, delta, rate.period_s, limit, now)
        self._release([lease.key for lease in leases], token)

    def _move(self, key: str, delta: float, period: float, limit: float, now: float) -> None:
        """Move ``key``'s booking by ``delta`` units of its rate (negative gives back)."""
        tats = self._tats
        tat = tats.get(key, now)
        if tat <= now:
            if delta < 0:
                return  # nothing booked to give back
            tat = now
        tat += delta * period / limit
        if tat > now:
            if key not in tats and len(tats) >= self._sweep_at:
                self._sweep(now)
            self._tats[key] = tat
        else:
            tats.pop(key, None)  # refunded past the clock: the key is full again

    def _release(self, keys: Sequence[str], token: object) -> None:
        """Release ``token``'s lease on each concurrency key."""
        held = self._leases
        for key in keys:
            holders = held.get(key)
            if holders is not None and holders.pop(token, None) is not None and not holders:
                del held[key]

    def bind(
        self, request_rates: Sequence[Rate], token_rates: Sequence[Rate], leases: Sequence[Lease]
    ) -> MemoryBinding:
        """The limits of one principal, compiled for :meth:`MemoryBinding.take`: the same
        GCRA and leases as :meth:`acquire_now`, without building a :class:`Rate` per
        request. ``token_rates``' costs are ignored: each request gives its own."""
        return MemoryBinding(self, request_rates, token_rates, leases)

    # -- bookkeeping ---------------------------------------------------------------------

    def __len__(self) -> int:
        """Rate-limit keys held (expired ones included until the next sweep)."""
        return len(self._tats)

    @staticmethod
    def _expire(holders: dict[str, float], now: float) -> None:
        """Drop leases never released (a request that did not settle)."""
        for token in [t for t, until in holders.items() if until <= now]:
            del holders[token]

    def _sweep(self, now: float) -> None:
        """Drop keys that have refilled; forget the fullest live ones beyond ``max_keys``."""
        tats = {k: v for k, v in self._tats.items() if v > now}
        max_keys = self.options.max_keys
        if len(tats) >= max_keys:
            keep = max_keys - max(1, max_keys // 10)
            if not self._warned_full:
                self._warned_full = True
                log.warning(
                    "rate-limit memory store holds %d live keys (max_keys: %d); forgetting "
                    "the ones closest to full, which restarts their allowance",
                    len(tats),
                    max_keys,
                )
            tats = dict(heapq.nlargest(keep, tats.items(), key=lambda kv: kv[1]))
        self._tats = tats
        self._sweep_at = min(max(2 * len(tats), _MIN_SWEEP), max_keys)
        for key in list(self._leases):
            holders = self._leases[key]
            self._expire(holders, now)
            if not holders:
                del self._leases[key]


class MemoryBinding:
    """One principal's limits in a :class:`MemoryRateLimitStore`, checked per request with
    everything that does not change precomputed (keys, emission intervals, scaled limits).

    Only the common case is handled here: :meth:`take` returns ``None`` for a request that
    any limit refuses, and the caller asks :meth:`MemoryRateLimitStore.acquire_now` for the
    refusal's full :class:`~shuniu.core.contracts.Decision` (nothing was recorded, and the
    store's state is the same for that call: it runs without awaiting)."""

    __slots__ = ("_keys", "_lease_keys", "_leases", "_max_cost", "_never", "_requests", "_store", "_tokens")

    def __init__(
        self,
        store: MemoryRateLimitStore,
        request_rates: Sequence[Rate],
        token_rates: Sequence[Rate],
        leases: Sequence[Lease],
    ) -> None:
        keys = tuple(r.key for r in (*request_rates, *token_rates))
        if len(set(keys)) != len(keys):
            raise ValueError("a binding's rates must have distinct keys")
        scale = store.scale
        self._store = store
        self._keys = keys
        self._requests = tuple(_compiled(r, scale) for r in request_rates if r.limit > 0)
        self._tokens = tuple(_compiled(r, scale) for r in token_rates if r.limit > 0)
        self._leases = tuple(
            (lease.key, lease.limit if scale == 1.0 else max(1, int(lease.limit * scale)), lease.ttl_s)
            for lease in leases
        )
        self._lease_keys = tuple(lease.key for lease in leases)
        self._max_cost = min((r.limit * scale for r in token_rates), default=INF)
        """A token cost above this refuses."""
        self._never = (
            len(self._requests) < len(request_rates)
            or len(self._tokens) < len(token_rates)
            or any(limit < 1.0 for _, _, _, limit, _, _ in self._requests)
            or any(limit_n <= 0 for _, limit_n, _ in self._leases)
        )
        """A limit that refuses every request (0, or below one request once scaled)."""

    def take(self, cost: float, token: object) -> tuple[int, int, float, int, int, float] | None:
        """Book one request (one unit of each request rate, ``cost`` of each token rate, a
        lease of each concurrency limit) and return, for the response headers, the tightest
        request rate and token rate after it: ``(index, remaining, reset_s)`` each, the index
        ``-1`` where there are none; ``None`` (nothing booked) when any limit refuses."""
        if self._never or cost > self._max_cost:
            return None
        store = self._store
        now = store.clock()
        tats = store._tats
        get = tats.get
        booked: list[float] = []
        book = booked.append
        # The request rates (one unit each), then the token rates (``cost`` each); for each
        # kind, the limit with the fewest units left after this request (a request passes
        # ``debt <= cap``, so ``left`` is never negative). The two loops differ only in the
        # units booked; written out, not one loop over both kinds, which cost 15% more per
        # request on this path.
        req, req_left, req_reset = -1, 0, 0.0
        for i, (key, interval, cap, limit, period, most) in enumerate(self._requests):
            tat = get(key, now)
            debt = tat - now + interval if tat > now else interval
            if debt > cap:
                return None
            book(now + debt)
            left = int((cap - debt) * limit / period)
            if left > most:
                left = most
            if req < 0 or left < req_left:
                req, req_left, req_reset = i, left, debt
        tok, tok_left, tok_reset = -1, 0, 0.0
        for i, (key, _interval, cap, limit, period, most) in enumerate(self._tokens):
            tat = get(key, now)
            debt = cost * period / limit  # as acquire_now computes it, to the last bit
            if tat > now:
                debt += tat - now
            if debt > cap:
                return None
            book(now + debt)
            left = int((cap - debt) * limit / period)
            if left > most:
                left = most
            if tok < 0 or left < tok_left:
                tok, tok_left, tok_reset = i, left, debt
        held = store._leases
        for key, limit_n, _ttl in self._leases:
            holders = held.get(key)
            if holders and len(holders) >= limit_n:
                store._expire(holders, now)
                if len(holders) >= limit_n:
                    return None
        # Every limit allows it: record (a cost-0 check of a full key leaves no entry).
        if len(tats) + len(booked) >= store._sweep_at or not cost:
            for key, tat in zip(self._keys, booked, strict=True):
                if tat > now:
                    if key not in tats and len(tats) >= store._sweep_at:
                        store._sweep(now)
                        tats = store._tats
                    tats[key] = tat
        else:
            tats.update(zip(self._keys, booked, strict=True))
        for key, _limit_n, ttl in self._leases:
            holders = held.get(key)
            if holders is None:
                held[key] = holders = {}
            holders[token] = now + ttl
        return req, req_left, req_reset, tok, tok_left, tok_reset

    def give_back(self, delta: float, token: object) -> None:
        """The request ended: move each token rate by ``delta`` units (negative gives back
        an unused reservation) and release its leases."""
        store = self._store
        if delta:
            now = store.clock()
            for key, _interval, _cap, limit, period, _most in self._tokens:
                store._move(key, delta, period, limit, now)
        store._release(self._lease_keys, token)


def _compiled(rate: Rate, scale: float) -> tuple[str, float, float, float, float, int]:
    """(key, emission interval, period + tolerance, limit, period, most units a header may
    show), the limit scaled: what a request's check needs. The arithmetic on them is
    :meth:`MemoryRateLimitStore.acquire_now`'s, in the same order, so both book the same
    bits."""
    limit = rate.limit * scale
    return rate.key, rate.period_s / limit, rate.period_s + EPSILON_S, limit, rate.period_s, int(limit)


def _build(options: MemoryRateLimitOptions | None = None) -> MemoryRateLimitStore:
    return MemoryRateLimitStore(options)


@hookimpl
def register_rate_limiters(register: RegisterRateLimitStore) -> None:
    register(
        "memory",
        _build,
        options=MemoryRateLimitOptions,
        description=(
            "Rate and concurrency limits kept in the gateway process (GCRA): exact for one "
            "gateway; with several, each enforces the limits on its own."
        ),
    )
