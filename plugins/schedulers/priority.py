"""``priority``: priority levels by tier, token-fair shares between tenants, and admission
control that refuses at once what cannot be served in time.

Each waiting request belongs to a priority level (smaller runs first, as in vLLM), taken
from its tier. Within a level, tenants share the pool by weight, measured in tokens (prompt
plus expected output), with start-time fair queueing: every tenant keeps the finish tag of
its last request; a new request starts at ``max(level virtual time, tenant's last finish)``
and finishes ``cost / weight`` later; the smallest finish tag goes first, and the level's
virtual time moves to the start tag of what it dispatched. One heap, keyed by
``(priority, finish, arrival)``, orders every waiter. A request that has waited ``aging_s``
goes ahead of everything, so low priorities are never starved.

Waiters that cannot go although slots are free (pinned to a version without room, or of a
tier over its ``max_share``) are skipped: up to ``_LOOKAHEAD`` further waiters are tried
before a dispatch round stops, and every arrival and release runs a round, so a queue head
of such waiters is a bounded head-of-line block.

Why this file is long: the queue's structures (heap, intrusive lists, levels, tenants) and
what reads them (admission's predicted wait, dispatch, the fleet's backlog and slot budget)
share one set of invariants on the hot path; split across modules they would have to reach
into each other's private state.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping, Sequence
from heapq import heapify, heappop, heappush
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import PoolView, RegisterScheduler, Scheduler, Ticket
from shuniu.core.errors import GatewayError, no_healthy_endpoint
from shuniu.core.running_loop import running_loop
from shuniu.core.timers import cancel_at, timed_out
from shuniu.core.types import InferenceRequest, Outcome

__all__ = ["PriorityOptions", "PriorityScheduler", "TierPolicy"]

_LOOKAHEAD = 8
"""Waiters tried past a pinned one that could not be placed, before a dispatch round stops."""
_ALPHA = 0.1
"""Weight of the newest interval in the dispatch-interval average (after the first 10)."""
_MAX_RETRY_AFTER = 3600
_PRIORITY_HEADER = b"x-shuniu-priority"

_QUEUED, _DISPATCHED, _LEFT = 0, 1, 2


class TierPolicy(Options):
    """How the requests of one tier are queued."""

    priority: int = 0
    """Priority level of the tier's requests; smaller runs first (vLLM's convention)."""
    weight: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Fair-share weight, within its priority level, of each tenant of this tier: tenants
    receive tokens in proportion to their weights while they all have requests waiting."""
    max_queue: int | None = Field(None, ge=0)
    """Requests of this tier allowed to wait; more are refused with 429. ``None``: only the
    scheduler's global ``max_queue`` applies."""
    max_wait_s: float | None = Field(None, gt=0)
    """Longest a request of this tier may wait; ``None``: the scheduler's ``max_wait_s``."""
    max_share: float | None = Field(None, gt=0, le=1)
    """Most of the pool's concurrency (the sum of its endpoints' limits) this tier's requests
    may hold at once; beyond it they wait (and are shed by the wait limits) even while
    slots are free, which keeps headroom for higher tiers and keeps engines out of the
    saturated regime where a newcomer waits behind a full batch. Applies only while every
    endpoint has a limit (``max_concurrency``, or an adaptive limit in force after the
    engines reported a backlog). ``None``: no cap."""
    headroom: float | None = Field(None, gt=0, lt=1)
    """Share of the pool's concurrency this tier leaves to better tiers: its requests are
    dispatched only while, after taking a slot, more than this share of all slots stays
    free. Unlike ``max_share`` it follows the better tiers' own use: with ``headroom: 0.1``
    a free tier may fill 90% of the slots, minus whatever premium traffic holds. Applies
    under the same condition as ``max_share``. ``None``: none."""
    client_priority: bool = False
    """Let clients of this tier ask for a worse (larger) priority, with the body field
    ``priority`` or the ``x-shuniu-priority`` header (the header wins). A better one than
    the tier's is never granted: the request gets the tier's priority instead."""


class PriorityOptions(Options):
    """Options of the ``priority`` scheduler."""

    tiers: dict[str, TierPolicy] = Field(default_factory=dict)
    """Tier name → policy. A tier ``default`` (priority 0, weight 1, ``client_priority``
    on, so an unconfigured gateway passes a client's own, worse, priority on to the engine)
    exists even when not listed here; listing it overrides it."""
    default_tier: str = "default"
    """Tier applied to requests whose tier is not in ``tiers``."""
    max_queue: int = Field(1024, ge=0)
    """Requests allowed to wait, all tiers together. When full, a newcomer with a better
    priority than the worst waiting request displaces the most recent of those (503
    ``shed``); otherwise it is refused with 429."""
    max_wait_s: float = Field(60.0, gt=0)
    """Longest a request may wait in the queue (tiers may override it); then 503."""
    tenant_weights: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default_factory=dict
    )
    """Tenant name → fair-share weight, overriding the weight of the tenant's tier."""
    aging_s: float | None = Field(30.0, gt=0)
    """A request that has waited this long is dispatched ahead of every priority level
    (oldest first), so low priorities are never starved. ``None``: no aging."""
    default_output_tokens: int = Field(256, ge=1)
    """Output tokens assumed, for fair shares, for a request that sets no ``max_tokens``."""
    fleet_slots: Literal["weights", "demand"] = "weights"
    """With ``fleet:``, how the gateways' queues split the pool's slots while more than
    one has a backlog at the same priority level: ``weights``, by the weights of the
    tenants each holds (a gateway whose queue holds one tenant of three takes a third of
    the slots, however fast it asks); ``demand``, as they come (each gateway takes what
    frees first, so the split follows the gateways' demand). Within each queue tenants
    share by weight either way."""
    min_rate_samples: int = Field(8, ge=1)
    """Dispatches from the queue observed in the current backlog before a request whose
    predicted wait exceeds its limit is refused at once (503 ``queue_wait_exceeded``).
    Fewer: every request is queued and only the wait limit applies."""

    @model_validator(mode="after")
    def _default_tier_exists(self) -> PriorityOptions:
        if self.default_tier != "default" and self.default_tier not in self.tiers:
            known = ", ".join(sorted({"default", *self.tiers}))
            raise ValueError(f"default_tier {self.default_tier!r} is not a tier (tiers: {known})")
        return self


def _limits(pool: PoolView) -> tuple[int, int] | None:
    """The concurrency limits of the pool's serving endpoints, summed, and their slots in
    use (the fleet's, with ``fleet:``); ``None`` when an endpoint has no limit."""
    total = busy = 0
    for e in pool.endpoints:
        if e.healthy and not e.draining:
            if e.limit == 0:
                return None
            total += e.limit
            busy += e.in_flight + e.remote_in_flight
    return total, busy


class _Tier:
    __slots__ = (
        "capped",
        "client_priority",
        "headroom",
        "in_flight",
        "max_queue",
        "max_share",
        "max_wait_s",
        "name",
        "priority",
        "queued",
        "remote_in_flight",
        "weight",
    )

    def __init__(self, name: str, policy: TierPolicy, max_wait_s: float) -> None:
        self.name = name
        self.priority = policy.priority
        self.weight = policy.weight
        self.max_queue = policy.max_queue
        self.max_wait_s = policy.max_wait_s if policy.max_wait_s is not None else max_wait_s
        self.client_priority = policy.client_priority
        self.max_share = policy.max_share
        self.headroom = policy.headroom
        self.capped = policy.max_share is not None or policy.headroom is not None
        """Whether ``max_share`` or ``headroom`` can hold the tier back (else it always
        has room, and the hot path skips :meth:`has_room`)."""
        self.queued = 0
        self.in_flight = 0
        """Requests of this tier holding a slot (for ``max_share``)."""
        self.remote_in_flight = 0
        """The fleet's other gateways' requests of this tier holding a slot (``fleet:``)."""

    def has_room(self, pool: PoolView) -> bool:
        """Under ``max_share`` of the pool's current concurrency limits, and leaving
        ``headroom`` of them free."""
        share = self.max_share
        headroom = self.headroom
        if share is None and headroom is None:
            return True
        limits = _limits(pool)
        if limits is None:
            return True  # an endpoint without a limit: no contention to share
        total, busy = limits
        if share is not None and self.in_flight + self.remote_in_flight >= share * total:
            return False
        return headroom is None or busy + 1 <= (1.0 - headroom) * total


class _Tenant:
    """A tenant's fair-queueing state within one priority level."""

    __slots__ = ("finish", "idle_key", "in_idle", "name", "queued", "weight")

    def __init__(self, name: str) -> None:
        self.name = name
        self.finish = 0.0
        self.queued = 0
        self.weight = 1.0
        """The weight of its latest queued request: what it adds to its level's ``weight``
        while it has waiters, and what the fleet's slot budget counts."""
        self.idle_key = 0.0
        """``finish`` when pushed on the level's idle heap (the heap's key must not move)."""
        self.in_idle = False

    def __lt__(self, other: _Tenant) -> bool:
        return self.idle_key < other.idle_key


class _Level:
    """One priority level: virtual time, tenants, and its waiters in arrival order."""

    __slots__ = ("count", "head", "idle", "priority", "tail", "tenants", "vtime", "weight")

    def __init__(self, priority: int) -> None:
        self.priority = priority
        self.vtime = 0.0
        self.count = 0
        self.weight = 0.0
        """The weights of its tenants with waiters, summed (how fast virtual time moves)."""
        self.tenants: dict[str, _Tenant] = {}
        self.idle: list[_Tenant] = []
        """Tenants with nothing queued whose finish tag is still ahead of ``vtime``."""
        self.head: _Waiter | None = None
        self.tail: _Waiter | None = None


class _Waiter:
    # Two intrusive lists (all waiters by arrival, for aging; a level's, for eviction) keep
    # removal O(1) without extra allocations.
    __slots__ = (
        "enqueued",
        "finish",
        "future",
        "g_next",
        "g_prev",
        "l_next",
        "l_prev",
        "level",
        "missed",
        "request",
        "start",
        "state",
        "tenant",
        "tier",
    )

    def __init__(
        self,
        request: InferenceRequest,
        future: asyncio.Future[Ticket],
        tier: _Tier,
        level: _Level,
        tenant: _Tenant,
        start: float,
        finish: float,
        enqueued: float,
    ) -> None:
        self.request = request
        self.future = future
        self.tier = tier
        self.level = level
        self.tenant = tenant
        self.start = start
        self.finish = finish
        self.enqueued = enqueued
        self.state = _QUEUED
        self.missed = False
        self.g_prev: _Waiter | None = None
        self.g_next: _Waiter | None = None
        self.l_prev: _Waiter | None = None
        self.l_next: _Waiter | None = None


def _retry_after(seconds: float) -> dict[str, str]:
    return {"retry-after": str(max(1, min(_MAX_RETRY_AFTER, math.ceil(seconds))))}


class PriorityScheduler(Scheduler):
    """Priority levels from tiers, weighted token-fair queueing of tenants within a level,
    aging, and admission control (queue limits, shedding, predicted waits, deadlines).

    Counters: ``shed`` (waiters displaced by higher-priority traffic), ``expired`` (waiters
    that reached their wait limit or deadline in the queue), ``rejected`` (every refusal
    by error code, those two included).
    """

    steps_without_task = True  # admit waits on a timer of its own (core.timers.cancel_at)

    def __init__(self, options: PriorityOptions | None = None) -> None:
        self.options = opts = options or PriorityOptions()
        policies = {"default": TierPolicy(client_priority=True), **opts.tiers}
        self._tiers = {name: _Tier(name, p, opts.max_wait_s) for name, p in policies.items()}
        self._default = self._tiers[opts.default_tier]
        self._weights = opts.tenant_weights
        self._aging_s = opts.aging_s
        self._levels: dict[int, _Level] = {}
        self._heap: list[tuple[int, float, int, _Waiter]] = []
        self._seq = 0
        self._count = 0
        self._head: _Waiter | None = None
        self._tail: _Waiter | None = None
        # Dispatch-rate estimate, from the queue's own dispatches during the current backlog
        # only: an idle pool has no rate to speak of, and a burst starts with no estimate.
        self._mark: float | None = None
        self._interval = 0.0
        self._cost = 0.0
        """Mean cost (prompt plus expected output tokens) per dispatch, over the same samples."""
        self._samples = 0
        self.shed = 0
        self.expired = 0
        self._rejected: dict[str, int] = {}
        self._fleet = False
        """Whether a fleet takes this queue's state (then queued service is counted)."""
        self._service: dict[str, dict[str, float]] = {}
        """Priority (as text) → tenant → fair-share service (cost / weight) queued here
        since the last :meth:`fleet_state`."""
        self._slots = 0
        """Requests holding a slot through this queue, all tiers."""
        self._budget: float | None = None
        """This gateway's share of the pool's slots while the fleet's queues contend for
        them (from :meth:`merge_fleet`); ``None``: no other gateway has a backlog that
        competes with this one's, so slots are taken as they come."""

    @property
    def rejected(self) -> dict[str, int]:
        """Refusals since start, by error code."""
        return self._rejected

    @property
    def queued(self) -> int:
        return self._count

    def adopt_tiers(self, priorities: dict[str, int]) -> None:
        """Take the deployment's tiers (``tiers:``, name → priority) for those this
        scheduler's own ``tiers`` options do not name; called once, before traffic."""
        for name, priority in priorities.items():
            if name not in self.options.tiers:
                policy = TierPolicy(priority=priority, client_priority=name == "default")
                tier = _Tier(name, policy, self.options.max_wait_s)
                self._tiers[name] = tier
                if self._default.name == name:
                    self._default = tier

    # -- admission -------------------------------------------------------------------------

    async def admit(self, req: InferenceRequest, pool: PoolView) -> Ticket:
        loop = running_loop()
        now = loop.time()
        tier = self._tiers.get(req.principal.tier, self._default)
        prio = tier.priority
        if tier.client_priority:
            raw = req.header(_PRIORITY_HEADER)
            # Most requests ask for nothing: the tier's priority, without parsing a thing.
            if raw is not None or req.priority != 0 or "priority" in req.body:
                prio = self._asked_priority(req, raw, prio)
        req.priority = prio
        deadline = req.deadline
        if deadline is not None and deadline <= now:
            raise self._reject(
                GatewayError(
                    504,
                    "The request's deadline had already passed when it reached the queue.",
                    type="timeout_error",
                    code="deadline_exceeded",
                    headers=_retry_after(1),
                )
            )
        if not self._count and (not tier.capped or tier.has_room(pool)):
            ticket = pool.try_dispatch(req, now)
            if ticket is not None:
                ticket.tag = tier
                tier.in_flight += 1
                self._slots += 1
                return ticket
        if not pool.has_healthy(req.version):
            raise self._reject(no_healthy_endpoint(pool.name))
        limit = tier.max_wait_s
        by_deadline = False
        if deadline is not None and deadline - now < limit:
            limit = deadline - now
            by_deadline = True
        if tier.max_queue is not None and tier.queued >= tier.max_queue:
            raise self._reject(
                GatewayError(
                    429,
                    f"The queue of tier `{tier.name}` for `{pool.name}` is full "
                    f"({tier.queued} waiting); retry later.",
                    type="rate_limit_error",
                    code="queue_full",
                    headers=_retry_after(min(self._predicted(prio), limit)),
                )
            )
        if self._samples >= self.options.min_rate_samples:
            predicted = self._predicted_for(req, tier, prio)
            if predicted > limit:
                raise self._reject(
                    GatewayError(
                        503,
                        f"Requests queued for `{pool.name}` would hold this one about "
                        f"{predicted:.0f} s, longer than the {limit:g} s it may wait; retry later.",
                        type="server_error",
                        code="queue_wait_exceeded",
                        headers=_retry_after(predicted),
                    )
                )
        if self._count >= self.options.max_queue and not self._evict_for(prio, pool):
            raise self._reject(
                GatewayError(
                    429,
                    f"The queue for `{pool.name}` is full ({self._count} waiting); retry later.",
                    type="rate_limit_error",
                    code="queue_full",
                    headers=_retry_after(min(self._predicted(prio), limit)),
                )
            )

        waiter = self._enqueue(req, tier, prio, loop.create_future(), now)
        # Run a round now: the newcomer may be able to go ahead of waiters that cannot (a
        # tier over its share, a version without room). Cheap when nothing fits: the first
        # failed dispatch ends it.
        self._dispatch(pool)
        future = waiter.future
        # A timer that cancels the wait, not asyncio.timeout: admit then needs no task (the
        # simulator steps it without one); not wait_for, which on 3.11 can lose a racing
        # cancellation.
        limit_timer = cancel_at(loop, now + limit, future)
        try:
            return await future
        except asyncio.CancelledError as exc:
            if not timed_out(exc):
                # The client left while queued. If a slot was handed over meanwhile, give it back.
                if future.done() and not future.cancelled():
                    if future.exception() is None:  # (a shed waiter's error is simply dropped)
                        self.release(future.result(), Outcome.CANCELLED)
                else:
                    future.cancel()
                    self._leave(waiter)
                raise
        finally:
            limit_timer.cancel()
        # The time limit passed (a slot handed over at that very moment was taken: the
        # timer only cancels a wait still pending).
        self._leave(waiter)
        self.expired += 1
        if by_deadline:
            raise self._reject(
                GatewayError(
                    504,
                    f"The request's deadline passed while it was queued for `{pool.name}`.",
                    type="timeout_error",
                    code="deadline_exceeded",
                    headers=_retry_after(1),
                )
            ) from None
        raise self._reject(
            GatewayError(
                503,
                f"No endpoint of `{pool.name}` could take the request within {limit:g} s.",
                type="server_error",
                code="queue_timeout",
                headers=_retry_after(limit / 10),
            )
        ) from None

    def release(self, ticket: Ticket, outcome: Outcome) -> None:
        if ticket.pool.free(ticket, outcome):
            tier = ticket.tag
            if type(tier) is _Tier:  # (else not dispatched by this queue: nothing counted)
                tier.in_flight -= 1
            self._slots -= 1
            if self._count:
                self._dispatch(ticket.pool)

    def wake(self, pool: PoolView) -> None:
        if self._count:
            self._dispatch(pool)

    def snapshot(self) -> dict[str, object]:
        """The queue's state, for an admin endpoint (not for the hot path)."""
        try:
            now: float | None = asyncio.get_running_loop().time()
        except RuntimeError:  # called off the loop (a test, a debugger)
            now = None
        head = self._head
        return {
            "queued": self._count,
            "tiers": {name: t.queued for name, t in self._tiers.items()},
            "in_flight": {name: t.in_flight for name, t in self._tiers.items()},
            "priorities": {p: lvl.count for p, lvl in sorted(self._levels.items())},
            "tenants": sum(len(lvl.tenants) for lvl in self._levels.values()),
            "oldest_wait_s": now - head.enqueued if head is not None and now is not None else None,
            "dispatch_interval_s": self._interval if self._samples else None,
            "rate_samples": self._samples,
            "shed": self.shed,
            "expired": self.expired,
            "rejected": dict(self._rejected),
        }

    # -- the fleet (fleet:) ------------------------------------------------------------------

    def fleet_state(self) -> dict[str, Any]:
        """Each tier's requests holding a slot here, the fair-share service each tenant
        was charged here (per priority level) since the last call, and (``backlog``,
        while requests wait here) the best waiting priority level with each of its
        tenants' waiters and weight."""
        self._fleet = True
        service, self._service = self._service, {}
        tiers = {name: t.in_flight for name, t in self._tiers.items() if t.in_flight}
        state: dict[str, Any] = {"tiers": tiers, "service": service}
        if self._levels:
            best = min(self._levels)
            tenants = self._levels[best].tenants.values()
            state["backlog"] = [best, {t.name: [t.queued, t.weight] for t in tenants if t.queued}]
        return state

    def merge_fleet(self, states: Sequence[Mapping[str, Any]]) -> None:
        """The other gateways' states: their tiers' slots count against ``max_share`` here,
        and the service their tenants were charged there is charged here too, in a level
        with a backlog here (each tenant's finish tag moves on by it), so a tenant's share
        of contended capacity holds over the whole fleet."""
        remote: dict[str, int] = {}
        for state in states:
            for name, n in (state.get("tiers") or {}).items():
                remote[name] = remote.get(name, 0) + int(n)
            for prio_text, tenants in (state.get("service") or {}).items():
                try:
                    prio = int(prio_text)
                except ValueError:
                    continue
                level = self._levels.get(prio)
                if level is None:
                    # No backlog of that priority here: nothing to be fair about, and a
                    # backlog starts afresh (as in SFQ), so the charge has nowhere to go.
                    continue
                for name, served in tenants.items():
                    tenant = level.tenants.get(name)
                    if tenant is None:
                        tenant = level.tenants[name] = _Tenant(name)
                    start = level.vtime if level.vtime > tenant.finish else tenant.finish
                    tenant.finish = start + float(served)
                    if not tenant.queued:
                        self._retire(level, tenant)  # forgotten once the level catches up
        for name, tier in self._tiers.items():
            tier.remote_in_flight = remote.get(name, 0)
        if self.options.fleet_slots == "weights":
            self._budget = self._slot_budget(states)

    def _slot_budget(self, states: Sequence[Mapping[str, Any]]) -> float | None:
        """This gateway's share of the pool's slots while other gateways' queues have a
        backlog at the same (best) priority level as this one's: the sum, over the tenants
        waiting here, of each tenant's weight times the part of its fleet-wide backlog that
        waits here, over the weights of every tenant waiting anywhere at that level. So
        slots split between gateways by the weights of the tenants they hold, not by how
        fast each asks. ``None`` (slots taken as they come) when no other queue competes
        at this level."""
        if not self._levels:
            return None
        mine = min(self._levels)
        waiting: dict[str, float] = {}
        weights: dict[str, float] = {}
        for state in states:
            backlog = state.get("backlog")
            if not backlog or len(backlog) != 2:
                continue
            prio, tenants = backlog
            if prio != mine:
                # Priority between gateways is not enforced (each queue orders its own
                # levels): the split is between the queues at the same level.
                continue
            for name, (queued, weight) in tenants.items():
                waiting[name] = waiting.get(name, 0.0) + float(queued)
                weights.setdefault(name, float(weight))
        if not waiting:
            return None
        local = [t for t in self._levels[mine].tenants.values() if t.queued]
        for t in local:
            waiting[t.name] = waiting.get(t.name, 0.0) + t.queued
            weights[t.name] = t.weight
        total = sum(weights.values())
        share = sum(t.weight * t.queued / waiting[t.name] for t in local)
        return share / total if total > 0 else None

    # -- helpers ---------------------------------------------------------------------------

    def _reject(self, err: GatewayError) -> GatewayError:
        code = err.code or str(err.status)
        self._rejected[code] = self._rejected.get(code, 0) + 1
        return err

    @staticmethod
    def _asked_priority(req: InferenceRequest, raw: bytes | None, prio: int) -> int:
        """The priority of a request of a tier with ``client_priority``, whose
        ``x-shuniu-priority`` header is ``raw``, and whose tier's priority is ``prio``."""
        asked: int | None = None
        if raw is not None:
            try:
                asked = int(raw)
            except ValueError:
                asked = None  # a malformed header is ignored, as if absent
        # ``req.priority`` defaults to 0: only a value the client (or a simulated workload)
        # actually set counts as a wish, so a tier with a negative priority keeps it.
        if asked is None and (req.priority != 0 or "priority" in req.body):
            asked = req.priority
        return asked if asked is not None and asked > prio else prio

    def _predicted(self, prio: int) -> float:
        """Seconds until the requests queued at a priority ≤ ``prio`` have been dispatched,
        at the rate observed in the current backlog (0 without an estimate)."""
        if not self._samples:
            return 0.0
        ahead = 0
        for p, level in self._levels.items():
            if p <= prio:
                ahead += level.count
        return ahead * self._interval

    def _cost_of(self, req: InferenceRequest) -> int:
        """What fair shares count of a request: prompt plus expected output tokens."""
        return req.prompt_tokens + (req.max_tokens or self.options.default_output_tokens)

    def _predicted_for(self, req: InferenceRequest, tier: _Tier, prio: int) -> float:
        """Seconds until a newcomer would be dispatched: every waiter of a better level
        first, then its own level's share of the rate, as fair queueing serves it. A tenant
        with nothing queued starts at the level's virtual time, so it is not held behind
        another tenant's backlog; one with a backlog waits for its own waiters' service.
        Virtual time moves at the dispatched cost rate over the weights of the tenants
        waiting there, so the wait is ``(start - virtual time) * weights / cost rate``."""
        wait = self._predicted(prio - 1)  # every waiter of a better level
        interval = self._interval
        level = self._levels.get(prio)
        if level is None or self._cost <= 0 or interval <= 0:
            return wait
        name = req.principal.tenant
        tenant = level.tenants.get(name)
        start = level.vtime
        weights = level.weight
        if tenant is None or not tenant.queued:
            weights += self._weights.get(name, tier.weight)
        if tenant is not None and tenant.finish > start:
            start = tenant.finish
        # Virtual time sits at the start tag of the request dispatched last: one mean
        # dispatch of it is already under way.
        own = (start - level.vtime) * weights * interval / self._cost - interval
        return wait + own if own > 0 else wait

    def _evict_for(self, prio: int, pool: PoolView) -> bool:
        """Make room for a newcomer of priority ``prio`` by displacing the most recent
        waiter of the worst priority, if that is worse than ``prio``."""
        if not self._levels:
            return False  # nothing queued at all: ``max_queue`` is 0
        worst = max(self._levels)
        if worst <= prio:
            return False
        victim = self._levels[worst].tail
        assert victim is not None
        self._leave(victim)
        if victim.future.done():
            return True  # it was leaving anyway (cancelled, not yet unwound): room made
        self.shed += 1
        victim.future.set_exception(
            self._reject(
                GatewayError(
                    503,
                    f"The request was displaced from the queue of `{pool.name}` by "
                    "higher-priority traffic; retry later.",
                    type="server_error",
                    code="shed",
                    headers=_retry_after(self._predicted(worst)),
                )
            )
        )
        return True

    def _enqueue(
        self,
        req: InferenceRequest,
        tier: _Tier,
        prio: int,
        future: asyncio.Future[Ticket],
        now: float,
    ) -> _Waiter:
        level = self._levels.get(prio)
        if level is None:
            level = self._levels[prio] = _Level(prio)
        name = req.principal.tenant
        tenant = level.tenants.get(name)
        if tenant is None:
            tenant = level.tenants[name] = _Tenant(name)
        weight = self._weights.get(name, tier.weight)
        cost = self._cost_of(req)
        start = level.vtime if level.vtime > tenant.finish else tenant.finish
        finish = start + cost / weight
        tenant.finish = finish
        level.weight += weight - tenant.weight if tenant.queued else weight
        tenant.weight = weight
        if self._fleet:  # what the fleet's other queues charge this tenant too
            served = self._service.get(str(prio))
            if served is None:
                served = self._service[str(prio)] = {}
            served[name] = served.get(name, 0.0) + cost / weight
        tenant.queued += 1
        waiter = _Waiter(req, future, tier, level, tenant, start, finish, now)
        self._seq += 1
        heappush(self._heap, (prio, finish, self._seq, waiter))
        # All waiters, by arrival.
        tail = self._tail
        waiter.g_prev = tail
        if tail is None:
            self._head = waiter
        else:
            tail.g_next = waiter
        self._tail = waiter
        # The level's, by arrival.
        ltail = level.tail
        waiter.l_prev = ltail
        if ltail is None:
            level.head = waiter
        else:
            ltail.l_next = waiter
        level.tail = waiter
        level.count += 1
        tier.queued += 1
        if not self._count:
            self._mark = now  # a backlog starts: a new rate estimate with it
            self._samples = 0
        self._count += 1
        return waiter

    def _unqueue(self, waiter: _Waiter, state: int) -> None:
        """Take ``waiter`` off every structure but the heap (its entry goes stale there)."""
        waiter.state = state
        self._count -= 1
        waiter.tier.queued -= 1
        prev, nxt = waiter.g_prev, waiter.g_next
        if prev is None:
            self._head = nxt
        else:
            prev.g_next = nxt
        if nxt is None:
            self._tail = prev
        else:
            nxt.g_prev = prev
        waiter.g_prev = waiter.g_next = None
        level = waiter.level
        prev, nxt = waiter.l_prev, waiter.l_next
        if prev is None:
            level.head = nxt
        else:
            prev.l_next = nxt
        if nxt is None:
            level.tail = prev
        else:
            nxt.l_prev = prev
        waiter.l_prev = waiter.l_next = None
        level.count -= 1
        tenant = waiter.tenant
        tenant.queued -= 1
        if not tenant.queued:
            level.weight -= tenant.weight
        if not level.count:
            # The level went idle: its virtual time and tenants start afresh (as in SFQ), so
            # no state outlives a backlog.
            del self._levels[level.priority]
            if not self._count:
                self._mark = None
                self._samples = 0
            return
        if not tenant.queued:
            self._retire(level, tenant)

    @staticmethod
    def _retire(level: _Level, tenant: _Tenant) -> None:
        """Forget an idle tenant once its finish tag is behind the level's virtual time
        (it could not claim anything more from its history), or watch until it is."""
        if tenant.finish <= level.vtime:
            if level.tenants.get(tenant.name) is tenant:
                del level.tenants[tenant.name]
        elif not tenant.in_idle:
            tenant.idle_key = tenant.finish
            tenant.in_idle = True
            heappush(level.idle, tenant)

    def _leave(self, waiter: _Waiter) -> None:
        """A waiter leaves without a slot (timed out, cancelled, shed). Idempotent."""
        if waiter.state != _QUEUED:
            return
        tenant = waiter.tenant
        # Not served: its tenant is not charged for it. Its later waiters keep their tags
        # (the heap holds them); its next arrivals start that much earlier.
        tenant.finish -= waiter.finish - waiter.start
        self._unqueue(waiter, _LEFT)
        heap = self._heap
        if len(heap) > 2 * self._count + 64:
            # Mostly stale entries: rebuild in place (the dispatch loop may hold the list).
            heap[:] = [e for e in heap if e[3].state == _QUEUED]
            heapify(heap)

    def _dispatch(self, pool: PoolView) -> None:
        """Give slots to the best waiters while the pool has room for them."""
        now = asyncio.get_running_loop().time()
        heap = self._heap
        aging = self._aging_s
        held: list[tuple[int, float, int, _Waiter]] | None = None
        missed: list[_Waiter] | None = None
        cap = self._slot_cap(pool) if self._budget is not None else None
        while self._count:
            if cap is not None and self._slots >= cap:
                break  # this gateway holds its share of the fleet's contended slots
            waiter: _Waiter | None = None
            from_heap = False
            if aging is not None:
                w = self._head
                while w is not None and now - w.enqueued >= aging:
                    if not w.missed:
                        waiter = w
                        break
                    w = w.g_next
            if waiter is None:
                while heap:
                    entry = heap[0]
                    w = entry[3]
                    if w.state != _QUEUED:
                        heappop(heap)
                    elif w.missed:
                        heappop(heap)
                        if held is None:
                            held = []
                        held.append(entry)
                    else:
                        waiter = w
                        from_heap = True
                        break
                if waiter is None:
                    break  # only waiters that could not be placed this round are left
            if waiter.future.done():  # cancelled or timed out, not yet unwound
                self._leave(waiter)
                continue
            over_share = not waiter.tier.has_room(pool)
            ticket = None if over_share else pool.try_dispatch(waiter.request, now)
            if ticket is None:
                if waiter.request.version is None and not over_share:
                    break  # no room for anyone
                # Pinned to a version without room, or its tier is over its share; others
                # may still fit.
                waiter.missed = True
                if missed is None:
                    missed = []
                missed.append(waiter)
                if len(missed) >= _LOOKAHEAD:
                    break
                continue
            self._take(waiter, from_heap, now)
            ticket.tag = waiter.tier
            waiter.tier.in_flight += 1
            self._slots += 1
            waiter.future.set_result(ticket)
        if missed is not None:
            for w in missed:
                w.missed = False
        if held is not None:
            for entry in held:
                if entry[3].state == _QUEUED:
                    heappush(heap, entry)

    def _slot_cap(self, pool: PoolView) -> float | None:
        """Slots this gateway may hold: its budget of the pool's concurrency limits
        (``None`` while an endpoint has no limit, so there is nothing to split)."""
        budget = self._budget
        limits = _limits(pool) if budget is not None else None
        return None if budget is None or limits is None else budget * limits[0]

    def _take(self, waiter: _Waiter, from_heap: bool, now: float) -> None:
        """``waiter`` got a slot: account for it and take it off the queue."""
        level = waiter.level
        if from_heap:
            heappop(self._heap)
            if waiter.start > level.vtime:
                level.vtime = waiter.start
        # else: aged out of order; the level's virtual time stays where fair order left it.
        mark = self._mark
        if mark is not None:
            interval = now - mark
            self._samples += 1
            alpha = max(_ALPHA, 1.0 / self._samples)  # a running mean first, then an EWMA
            self._interval += alpha * (interval - self._interval)
            self._cost += alpha * (self._cost_of(waiter.request) - self._cost)
            self._mark = now
        self._unqueue(waiter, _DISPATCHED)
        if from_heap and level.count:
            idle = level.idle
            vtime = level.vtime
            while idle and idle[0].idle_key <= vtime:
                tenant = heappop(idle)
                tenant.in_idle = False
                if not tenant.queued:
                    self._retire(level, tenant)


@hookimpl
def register_schedulers(register: RegisterScheduler) -> None:
    register(
        "priority",
        PriorityScheduler,
        options=PriorityOptions,
        description=(
            "Priority levels by tier, token-fair shares between tenants by weight, aging, "
            "and admission control (queue limits, shedding, predicted waits, deadlines)."
        ),
    )
