"""``memory``: rate limits kept in the gateway process.

Right for a single gateway, and as the Redis store's fallback while Redis is unreachable.
Each GCRA key is one float in a dict; each concurrency key a dict of the tokens holding a
lease (kept when emptied, until a sweep). Every method runs without awaiting, so within one
event loop each call is atomic.

A key whose ``tat`` is in the past holds no information (it is as if absent), so expired
keys are swept whenever the dict has doubled since the last sweep: amortised O(1) per new
key, and the dict stays near the number of keys used within one period.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Decision, Lease, Rate, RateLimitStore, RegisterRateLimitStore
from shuniu.plugins.ratelimit import loop_binding
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
        self._leases: dict[str, dict[object, float]] = {}
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
                    self._sweep(now)  # (in place: ``tats`` is still the dict)
                tats[key] = tat
            for lease in leases:
                holders = held.get(lease.key)
                if holders is None:
                    holders = self._holders(lease.key, now)
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
            if holders is not None:
                # An emptied holders dict stays for the key's next lease (the sweep drops it).
                holders.pop(token, None)

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
    def _expire(holders: dict[object, float], now: float) -> None:
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
        # In place: a compiled binding holds the dict itself (see loop_binding).
        self._tats.clear()
        self._tats.update(tats)
        for key in list(self._leases):
            holders = self._leases[key]
            self._expire(holders, now)
            if not holders:
                del self._leases[key]
        self._sweep_at = min(max(2 * len(tats), 2 * len(self._leases), _MIN_SWEEP), max_keys)

    def _holders(self, key: str, now: float) -> dict[object, float]:
        """A new, empty holders dict for the concurrency key ``key``, in ``_leases``. A
        released lease leaves its key's dict behind, emptied, for the key's next request
        (making and dropping one per request cost more than the lease); the sweep drops
        them, and runs here too when the concurrency keys alone have grown to its
        threshold (a deployment with concurrency limits only)."""
        if len(self._leases) >= self._sweep_at:
            self._sweep(now)
        holders: dict[object, float] = {}
        self._leases[key] = holders
        return holders


class MemoryBinding:
    """One principal's limits in a :class:`MemoryRateLimitStore`, checked per request by two
    functions written for exactly these limits when the binding is made (keys, emission
    intervals and scaled limits in the code as constants, one straight line per limit).

    Only the common case is handled here: :attr:`take` returns ``None`` for a request that
    any limit refuses, and the caller asks :meth:`MemoryRateLimitStore.acquire_now` for the
    refusal's full :class:`~shuniu.core.contracts.Decision` (nothing was recorded, and the
    store's state is the same for that call: it runs without awaiting).

    Why generated code: with the limits a deployment usually sets (RPM, TPM and concurrency
    for a key and for its tenant), a loop over tuples of them spent more on the loops
    (``enumerate``, unpacking six fields, the list of bookings, ``zip``) than on the GCRA
    arithmetic; the straight-line functions take about half the interpreter's work (counted
    in instructions: ``benchmarks/inprocess_overhead.py``'s ``limits`` configuration). The
    arithmetic is :meth:`MemoryRateLimitStore.acquire_now`'s, in the same order, so both
    book the same bits (``tests/test_ratelimit_binding.py`` compares them).

    A compiled build (``setup.py``) checks with the loops of
    :mod:`~shuniu.plugins.ratelimit.loop_binding` instead, which mypyc turns into C: there
    they cost about half of the straight lines (:meth:`use_loops`)."""

    __slots__ = ("_keys", "_lease_keys", "_leases", "_max_cost", "_never", "_requests", "_store", "_tokens",
                 "give_back", "native", "source", "take")  # fmt: skip

    take: Callable[[float, object], tuple[int, int, float, int, int, float] | None]
    """``take(cost, token)``: book one request (one unit of each request rate, ``cost`` of
    each token rate, a lease of each concurrency limit) and return, for the response
    headers, the tightest request rate and token rate after it: ``(index, remaining,
    reset_s)`` each, the index ``-1`` where there are none; ``None`` (nothing booked) when
    any limit refuses."""
    give_back: Callable[[float, object], None]
    """``give_back(delta, token)``: the request ended: move each token rate by ``delta``
    units (negative gives back an unused reservation) and release its leases."""

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
        self.native: loop_binding.LoopBinding | None = None
        """The compiled loops that ``take`` and ``give_back`` are bound to, after
        :meth:`use_loops` (the compiled tenancy calls them directly); else ``None``."""
        self.source = self._write()
        """The two functions' code (for a reader, and for a test that wants to see it)."""
        if loop_binding.COMPILED:  # compiled loops beat the interpreted straight lines
            self.use_loops()
            return
        # repr() writes an infinite float as ``inf``: the name is defined for it.
        namespace: dict[str, Any] = {"store": store, "record": self._record, "inf": INF}
        exec(compile(self.source, f"<rate limits {keys!r}>", "exec"), namespace)
        self.take = namespace["take"]
        self.give_back = namespace["give_back"]

    def use_loops(self) -> None:
        """Check with :class:`~shuniu.plugins.ratelimit.loop_binding.LoopBinding` instead of
        the generated functions: what a compiled build does (the same bookings)."""
        loops = loop_binding.LoopBinding(
            self._store,
            [loop_binding.RateLimit(*rate) for rate in self._requests],
            [loop_binding.RateLimit(*rate) for rate in self._tokens],
            [loop_binding.LeaseLimit(*lease) for lease in self._leases],
            self._max_cost,
            self._never,
            self._record,
        )
        self.native = loops
        self.take = loops.take
        self.give_back = loops.give_back

    def _write(self) -> str:
        """The source of ``take`` and ``give_back`` for these limits (every constant written
        with ``repr``, which gives back the same float, bit for bit)."""
        if self._never:
            take = ["def take(cost, token):", "    return None"]
        else:
            take = ["def take(cost, token):"]
            if self._max_cost != INF:
                take.append(f"    if cost > {self._max_cost!r}:")
                take.append("        return None")
            take += ["    now = store.clock()", "    tats = store._tats", "    get = tats.get"]
            for i, (key, interval, cap, _limit, _period, _most) in enumerate(self._requests):
                take += [
                    f"    tat = get({key!r}, now)",
                    f"    r{i} = tat - now + {interval!r} if tat > now else {interval!r}",
                    f"    if r{i} > {cap!r}:",
                    "        return None",
                ]
            for i, (key, _interval, cap, limit, period, _most) in enumerate(self._tokens):
                take += [
                    f"    tat = get({key!r}, now)",
                    f"    t{i} = cost * {period!r} / {limit!r}",  # as acquire_now computes it
                    "    if tat > now:",
                    f"        t{i} += tat - now",
                    f"    if t{i} > {cap!r}:",
                    "        return None",
                ]
            if self._leases:
                take.append("    held = store._leases")
            for i, (key, limit_n, _ttl) in enumerate(self._leases):
                take += [
                    f"    h{i} = held.get({key!r})",
                    f"    if h{i} and len(h{i}) >= {limit_n!r}:",
                    f"        store._expire(h{i}, now)",
                    f"        if len(h{i}) >= {limit_n!r}:",
                    "            return None",
                ]
            # Every limit allows it: record (a cost-0 check of a full key leaves no entry).
            booked = [f"now + r{i}" for i in range(len(self._requests))]
            booked += [f"now + t{i}" for i in range(len(self._tokens))]
            if booked:
                take.append(f"    if len(tats) + {len(booked)} >= store._sweep_at or not cost:")
                take.append(f"        record(now, ({', '.join(booked)},))")
                take.append("    else:")
                for key, value in zip(self._keys, booked, strict=True):
                    take.append(f"        tats[{key!r}] = {value}")
            # Looked up again, not reused from the check: a sweep in ``record`` may have
            # dropped an emptied holders dict from ``held``.
            for i, (key, _limit_n, ttl) in enumerate(self._leases):
                take += [
                    f"    h{i} = held.get({key!r})",
                    f"    if h{i} is None:",
                    f"        h{i} = store._holders({key!r}, now)",
                    f"    h{i}[token] = now + {ttl!r}",
                ]
            # For each kind, the limit with the fewest units left after this request (a
            # request passes ``debt <= cap``, so ``left`` is never negative); the first wins
            # a tie.
            for kind, rates in (("r", self._requests), ("t", self._tokens)):
                if not rates:
                    take.append(f"    {kind}_i, {kind}_left, {kind}_reset = -1, 0, 0.0")
                    continue
                for i, (_key, _interval, cap, limit, period, most) in enumerate(rates):
                    take += [
                        f"    left = int(({cap!r} - {kind}{i}) * {limit!r} / {period!r})",
                        f"    if left > {most!r}:",
                        f"        left = {most!r}",
                    ]
                    if i == 0:
                        take.append(f"    {kind}_i, {kind}_left, {kind}_reset = 0, left, {kind}0")
                    else:
                        take += [
                            f"    if left < {kind}_left:",
                            f"        {kind}_i, {kind}_left, {kind}_reset = {i}, left, {kind}{i}",
                        ]
            take.append("    return r_i, r_left, r_reset, t_i, t_left, t_reset")
        give = ["def give_back(delta, token):"]
        if self._tokens:
            # MemoryRateLimitStore._move, inline for each token rate (the same arithmetic).
            give += ["    if delta:", "        now = store.clock()", "        tats = store._tats"]
            for key, _interval, _cap, limit, period, _most in self._tokens:
                give += [
                    f"        tat = tats.get({key!r}, now)",
                    "        if tat > now or delta > 0:",  # else nothing booked to give back
                    "            if tat <= now:",
                    "                tat = now",
                    f"            tat += delta * {period!r} / {limit!r}",
                    "            if tat > now:",
                    f"                if {key!r} not in tats and len(tats) >= store._sweep_at:",
                    "                    store._sweep(now)",
                    f"                tats[{key!r}] = tat",
                    "            else:",
                    f"                tats.pop({key!r}, None)",
                ]
        if self._lease_keys:
            give.append("    held = store._leases")
            for key in self._lease_keys:
                give += [
                    f"    h = held.get({key!r})",
                    "    if h is not None:",
                    "        h.pop(token, None)",
                ]
        if len(give) == 1:
            give.append("    return None")
        return "\n".join([*take, "", *give, ""])

    def _record(self, now: float, booked: tuple[float, ...]) -> None:
        """Record the bookings one by one, when the dict is due a sweep or the cost is 0."""
        store = self._store
        tats = store._tats
        for key, tat in zip(self._keys, booked, strict=True):
            if tat > now:
                if key not in tats and len(tats) >= store._sweep_at:
                    store._sweep(now)  # (in place: ``tats`` is still the dict)
                tats[key] = tat


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
