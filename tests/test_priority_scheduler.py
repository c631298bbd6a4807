"""The ``priority`` scheduler on real pools (no HTTP): priority order, token-fair tenant
shares, aging, shedding, predicted-wait refusals, deadlines, client priorities,
cancellation, state cleanup and option validation.

Tests that wait for seconds run on the virtual clock (:func:`run_virtual`), where time
jumps to the next timer instead of passing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pydantic
import pytest

from shuniu.core.contracts import BackendBase, Ticket
from shuniu.core.errors import GatewayError
from shuniu.core.pools.pool import EndpointState, Pool
from shuniu.core.types import InferenceRequest, Outcome, Principal
from shuniu.plugins.balancers.round_robin import RoundRobin
from shuniu.plugins.schedulers import priority as priority_plugin
from shuniu.plugins.schedulers.priority import PriorityOptions, PriorityScheduler, TierPolicy
from shuniu.plugins.tools.simulate import run_virtual

OK = Outcome.OK


def _pool(slots: list[int], versions: list[str] | None = None, **opts: Any) -> tuple[Pool, PriorityScheduler]:
    versions = versions or ["v1"] * len(slots)
    endpoints = [
        EndpointState(f"e{i}", BackendBase(), max_concurrency=s, version=v)
        for i, (s, v) in enumerate(zip(slots, versions, strict=True))
    ]
    scheduler = PriorityScheduler(PriorityOptions(**opts))
    return Pool("m", endpoints, RoundRobin(), scheduler), scheduler


def _req(
    n: int,
    *,
    tenant: str = "t",
    tier: str = "default",
    prompt: int = 100,
    max_tokens: int | None = 100,
    version: str | None = None,
    deadline: float | None = None,
    priority: int = 0,
    body: dict[str, Any] | None = None,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> InferenceRequest:
    return InferenceRequest(
        id=f"r{n}",
        api="chat",
        model="m",
        body=body or {},
        prompt="",
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        version=version,
        deadline=deadline,
        priority=priority,
        principal=Principal(tenant=tenant, tier=tier),
        headers=tuple(headers),
    )


async def _queue(
    s: PriorityScheduler, pool: Pool, reqs: list[InferenceRequest], grows: int | None = None
) -> list[asyncio.Task[Ticket]]:
    """Start ``admit`` for each request, in order, and let each reach its wait; the queue
    grows by ``grows`` (default: one per request)."""
    before = s.queued
    tasks = [asyncio.create_task(s.admit(r, pool)) for r in reqs]
    await asyncio.sleep(0)  # one step each: admit runs up to its await without yielding
    assert s.queued == before + (len(reqs) if grows is None else grows)
    return tasks


async def _next(pending: set[asyncio.Task[Ticket]]) -> Ticket:
    """The one task of ``pending`` that just got a slot (removed from the set)."""
    done, rest = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
    assert len(done) == 1
    pending.intersection_update(rest)
    return done.pop().result()


async def _drain(s: PriorityScheduler, held: Ticket, tasks: list[asyncio.Task[Ticket]]) -> list[Ticket]:
    """On a one-slot pool: release the slot again and again; the tickets in dispatch order."""
    pending = set(tasks)
    order: list[Ticket] = []
    ticket = held
    while pending:
        s.release(ticket, OK)
        ticket = await _next(pending)
        order.append(ticket)
    s.release(ticket, OK)
    return order


async def _cancel(tasks: Iterable[asyncio.Task[Any]]) -> None:
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _ids(tickets: list[Ticket]) -> list[str]:
    return [t.request.id for t in tickets]


# -- order ----------------------------------------------------------------------------------


async def test_higher_priority_queued_later_dispatches_first() -> None:
    pool, s = _pool([1], tiers={"batch": {"priority": 5}, "chat": {"priority": 0}})
    held = await s.admit(_req(0, tier="chat"), pool)
    tasks = await _queue(s, pool, [_req(1, tier="batch"), _req(2, tier="batch"), _req(3, tier="chat")])
    assert s.snapshot()["priorities"] == {0: 1, 5: 2}
    order = await _drain(s, held, tasks)
    assert _ids(order) == ["r3", "r1", "r2"]
    assert [t.request.priority for t in order] == [0, 5, 5]  # written back for the engines
    assert pool.endpoints[0].in_flight == 0


async def test_unknown_tier_uses_the_default_tier() -> None:
    pool, s = _pool([1], tiers={"std": {"priority": 4}, "vip": {"priority": 1}}, default_tier="std")
    held = await s.admit(_req(0), pool)
    tasks = await _queue(s, pool, [_req(1, tier="nonesuch"), _req(2, tier="vip")])
    order = await _drain(s, held, tasks)
    assert [(t.request.id, t.request.priority) for t in order] == [("r2", 1), ("r1", 4)]


async def test_each_tenant_is_served_in_arrival_order() -> None:
    pool, s = _pool([1])
    costs = [500, 10, 300, 20, 1, 250]
    reqs = []
    for i, c in enumerate(costs):
        reqs.append(_req(i, tenant="a", prompt=c))
        reqs.append(_req(100 + i, tenant="b", prompt=costs[-1 - i]))
    held = await s.admit(_req(-1), pool)
    order = await _drain(s, held, await _queue(s, pool, reqs))
    assert [t.request.id for t in order if t.request.principal.tenant == "a"] == [f"r{i}" for i in range(6)]
    b_ids = [t.request.id for t in order if t.request.principal.tenant == "b"]
    assert b_ids == [f"r{100 + i}" for i in range(6)]


# -- fairness -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "opts",
    [
        {"tenant_weights": {"a": 1.0, "b": 3.0}},
        {"tiers": {"free": {"weight": 1.0}, "pro": {"weight": 3.0}}},
    ],
    ids=["tenant_weights", "tier_weights"],
)
async def test_flooding_tenants_share_tokens_by_weight(opts: dict[str, Any]) -> None:
    pool, s = _pool([1], **opts)
    held = await s.admit(_req(-1), pool)
    reqs = []
    for i in range(40):  # interleaved arrivals, equal costs (200 tokens)
        reqs.append(_req(i, tenant="a", tier="free"))
        reqs.append(_req(100 + i, tenant="b", tier="pro"))
    order = await _drain(s, held, await _queue(s, pool, reqs))
    first = order[:40]  # while both still have a backlog
    tokens = {"a": 0, "b": 0}
    for t in first:
        tokens[t.request.principal.tenant] += t.request.prompt_tokens + (t.request.max_tokens or 0)
    # Fair queueing keeps each tenant within one request's cost (200) of its exact share,
    # so b - 3a is off by at most 200 * (1 + 3) tokens; equal shares would be off by 8000.
    assert abs(tokens["b"] - 3 * tokens["a"]) <= 800
    assert tokens["a"] + tokens["b"] == 40 * 200


async def test_long_requests_get_fewer_slots_but_equal_tokens() -> None:
    pool, s = _pool([1], default_output_tokens=50)
    held = await s.admit(_req(-1), pool)
    longs = [_req(i, tenant="long", prompt=500, max_tokens=500) for i in range(20)]  # 1000 each
    shorts = [_req(100 + i, tenant="short", prompt=50, max_tokens=None) for i in range(200)]  # 100
    order = await _drain(s, held, await _queue(s, pool, [*longs, *shorts]))
    first = order[:110]  # both backlogged throughout
    n_long = sum(t.request.principal.tenant == "long" for t in first)
    tok_long = n_long * 1000
    tok_short = (110 - n_long) * 100
    # Within one request of the larger cost of each other (the fair-queueing lag bound).
    assert abs(tok_long - tok_short) <= 1100
    assert 110 - n_long >= 8 * n_long  # many more short requests than long ones


# -- aging ----------------------------------------------------------------------------------


@pytest.mark.parametrize("aging", [5.0, None])
def test_aging_lets_low_priority_through_under_continuous_load(aging: float | None) -> None:
    async def main() -> float | None:
        loop = asyncio.get_running_loop()
        pool, s = _pool([1], aging_s=aging, tiers={"hi": {"priority": 0}, "lo": {"priority": 9}})
        ticket = await s.admit(_req(0, tier="hi"), pool)
        (low,) = await _queue(s, pool, [_req(1, tier="lo")])
        pending = {low}
        low_at = None
        for i in range(20):
            # A new high-priority request is always waiting when the slot frees up.
            pending.update(await _queue(s, pool, [_req(100 + i, tier="hi")]))
            await asyncio.sleep(1.0)
            s.release(ticket, OK)
            ticket = await _next(pending)
            if ticket.request.id == "r1":
                low_at = loop.time()
        s.release(ticket, OK)
        await _cancel(pending)
        assert s.queued == 0 and pool.endpoints[0].in_flight == 0
        return low_at

    low_at = run_virtual(main())
    if aging is None:
        assert low_at is None  # starved: every release went to a high-priority request
    else:
        assert low_at == 5.0  # the first release after it had waited aging_s


# -- shedding ---------------------------------------------------------------------------------


def _retry_after(err: GatewayError) -> int:
    value = int(err.headers["retry-after"])
    assert value >= 1
    return value


async def test_a_full_tier_queue_is_429_at_once() -> None:
    pool, s = _pool([1], tiers={"free": {"max_queue": 1}})
    held = await s.admit(_req(0), pool)
    tasks = await _queue(s, pool, [_req(1, tier="free")])
    with pytest.raises(GatewayError) as info:
        await s.admit(_req(2, tier="free"), pool)
    err = info.value
    assert (err.status, err.type, err.code) == (429, "rate_limit_error", "queue_full")
    _retry_after(err)
    tasks += await _queue(s, pool, [_req(3)])  # other tiers still queue
    assert s.rejected == {"queue_full": 1}
    assert _ids(await _drain(s, held, tasks)) == ["r1", "r3"]


async def test_a_full_queue_sheds_lower_priority_for_higher() -> None:
    pool, s = _pool([1], max_queue=2, tiers={"lo": {"priority": 5}, "hi": {"priority": 0}})
    held = await s.admit(_req(0), pool)
    lo1, lo2 = await _queue(s, pool, [_req(1, tier="lo"), _req(2, tier="lo")])
    (hi1,) = await _queue(s, pool, [_req(3, tier="hi")], grows=0)  # displaces the latest lo
    with pytest.raises(GatewayError) as info:
        await lo2
    err = info.value
    assert (err.status, err.type, err.code) == (503, "server_error", "shed")
    assert "higher-priority" in err.message
    _retry_after(err)
    with pytest.raises(GatewayError) as info:  # not better than the worst queued: refused
        await s.admit(_req(4, tier="lo"), pool)
    assert (info.value.status, info.value.code) == (429, "queue_full")
    _retry_after(info.value)
    (hi2,) = await _queue(s, pool, [_req(5, tier="hi")], grows=0)  # displaces lo1
    with pytest.raises(GatewayError, match="higher-priority"):
        await lo1
    with pytest.raises(GatewayError) as info:  # only high priorities left: nothing to shed
        await s.admit(_req(6, tier="hi"), pool)
    assert info.value.code == "queue_full"
    assert s.shed == 2 and s.rejected == {"shed": 2, "queue_full": 2}
    assert _ids(await _drain(s, held, [hi1, hi2])) == ["r3", "r5"]
    assert s.snapshot()["tiers"] == {"default": 0, "lo": 0, "hi": 0}


async def test_max_queue_zero_refuses_instead_of_queueing() -> None:
    pool, s = _pool([1], max_queue=0)
    held = await s.admit(_req(0), pool)
    with pytest.raises(GatewayError) as info:
        await s.admit(_req(1, tier="default"), pool)
    assert info.value.code == "queue_full" and s.queued == 0
    s.release(held, OK)


async def _build_backlog(
    s: PriorityScheduler, pool: Pool, backlog: int, dispatches: int
) -> tuple[Ticket, set[asyncio.Task[Ticket]]]:
    """Queue ``backlog`` bulk requests behind a held slot, then free it once a second
    ``dispatches`` times (a dispatch rate of 1/s)."""
    ticket = await s.admit(_req(0, tier="bulk"), pool)
    pending = set(await _queue(s, pool, [_req(1000 + i, tier="bulk") for i in range(backlog)]))
    for _ in range(dispatches):
        await asyncio.sleep(1.0)
        s.release(ticket, OK)
        ticket = await _next(pending)
    return ticket, pending


_WAIT_TIERS = {
    "bulk": {"max_wait_s": 1000},
    "quick": {"max_wait_s": 5},
    "urgent": {"priority": -1, "max_wait_s": 5},
}


def test_a_predicted_wait_beyond_the_limit_is_refused_at_once() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool, s = _pool([1], tiers=_WAIT_TIERS)
        ticket, pending = await _build_backlog(s, pool, backlog=30, dispatches=10)
        assert s.queued == 20
        t0 = loop.time()
        with pytest.raises(GatewayError) as info:
            await s.admit(_req(1, tier="quick"), pool)  # 20 ahead at 1/s: about 20 s > 5 s
        assert loop.time() == t0  # refused at once, not after waiting its 5 s
        err = info.value
        assert (err.status, err.type, err.code) == (503, "server_error", "queue_wait_exceeded")
        assert _retry_after(err) == 20
        # A better priority has nobody ahead of it: queued, and served next.
        pending.update(await _queue(s, pool, [_req(2, tier="urgent")]))
        s.release(ticket, OK)
        ticket = await _next(pending)
        assert ticket.request.id == "r2"
        assert s.rejected == {"queue_wait_exceeded": 1}
        s.release(ticket, OK)
        await _cancel(pending)

    run_virtual(main())


def test_a_new_burst_is_not_refused_on_an_old_estimate() -> None:
    async def main() -> None:
        pool, s = _pool([1], tiers=_WAIT_TIERS)
        ticket, pending = await _build_backlog(s, pool, backlog=10, dispatches=10)
        assert s.queued == 0 and not pending  # the backlog drained: its estimate goes with it
        await asyncio.sleep(100)
        burst = await _queue(s, pool, [_req(2000 + i, tier="bulk") for i in range(30)])
        burst += await _queue(s, pool, [_req(1, tier="quick")])  # 30 ahead, still queued
        assert s.rejected == {}
        s.release(ticket, OK)
        await _cancel(burst)
        assert s.queued == 0 and pool.endpoints[0].in_flight == 0

    run_virtual(main())


async def test_no_healthy_endpoint_is_503_at_once() -> None:
    pool, s = _pool([1, 1], versions=["v1", "v2"])
    pool.set_healthy(pool.endpoints[1], False)
    with pytest.raises(GatewayError) as info:
        await s.admit(_req(0, version="v2"), pool)  # v1 is up, but this one needs v2
    assert (info.value.status, info.value.code) == (503, "no_healthy_endpoint")
    pool.set_healthy(pool.endpoints[0], False)
    with pytest.raises(GatewayError):
        await s.admit(_req(1), pool)
    assert s.queued == 0 and s.rejected == {"no_healthy_endpoint": 2}


# -- deadlines and wait limits ------------------------------------------------------------------


async def test_a_deadline_passed_on_arrival_is_504_at_once() -> None:
    pool, s = _pool([1])
    now = asyncio.get_running_loop().time()
    with pytest.raises(GatewayError) as info:
        await s.admit(_req(0, deadline=now - 0.001), pool)  # even with a free slot
    err = info.value
    assert (err.status, err.type, err.code) == (504, "timeout_error", "deadline_exceeded")
    assert pool.endpoints[0].in_flight == 0 and pool.dispatched == 0


def test_a_deadline_expiring_in_the_queue_is_504() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool, s = _pool([1])
        held = await s.admit(_req(0), pool)
        with pytest.raises(GatewayError) as info:
            await s.admit(_req(1, deadline=loop.time() + 2.0), pool)
        assert loop.time() == 2.0  # the deadline, not the 60 s wait limit
        err = info.value
        assert (err.status, err.type, err.code) == (504, "timeout_error", "deadline_exceeded")
        assert "deadline passed while it was queued" in err.message
        assert s.queued == 0 and s.expired == 1 and s.snapshot()["priorities"] == {}
        s.release(held, OK)
        assert pool.endpoints[0].in_flight == 0

    run_virtual(main())


def test_the_wait_limit_is_503_and_leaves_the_queue() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool, s = _pool([1], tiers={"short": {"max_wait_s": 3}})
        held = await s.admit(_req(0), pool)
        with pytest.raises(GatewayError) as info:
            await s.admit(_req(1, tier="short", deadline=loop.time() + 10), pool)
        assert loop.time() == 3.0
        err = info.value
        assert (err.status, err.code) == (503, "queue_timeout")
        _retry_after(err)
        assert s.queued == 0 and s.expired == 1
        assert s.rejected == {"queue_timeout": 1}
        s.release(held, OK)
        again = await s.admit(_req(2), pool)  # the queue is empty: straight through
        assert again.endpoint.in_flight == 1

    run_virtual(main())


# -- client priority ---------------------------------------------------------------------------


async def test_client_priority_can_only_make_a_request_worse() -> None:
    pool, s = _pool(
        [0],  # no limit: every admit dispatches at once, priority written all the same
        tiers={
            "std": {"priority": 5, "client_priority": True},
            "fixed": {"priority": 5},
            "gold": {"priority": -3, "client_priority": True},
        },
    )
    cases = [
        ({"tier": "std", "priority": 1, "body": {"priority": 1}}, 5),  # better: clamped
        ({"tier": "std", "priority": 9, "body": {"priority": 9}}, 9),
        ({"tier": "std", "headers": [(b"x-shuniu-priority", b"7")]}, 7),
        ({"tier": "std", "headers": [(b"x-shuniu-priority", b"2")]}, 5),
        ({"tier": "std", "priority": 9, "headers": [(b"x-shuniu-priority", b"6")]}, 6),  # header wins
        ({"tier": "std", "headers": [(b"x-shuniu-priority", b"soon")]}, 5),  # malformed: ignored
        ({"tier": "fixed", "priority": 9, "body": {"priority": 9}}, 5),  # not allowed to ask
        ({"tier": "gold"}, -3),  # asked for nothing: the tier's, not the field's default 0
        ({"tier": "gold", "body": {"priority": 0}}, 0),
    ]
    for i, (kwargs, expected) in enumerate(cases):
        ticket = await s.admit(_req(i, **kwargs), pool)
        assert ticket.request.priority == expected, kwargs
        s.release(ticket, OK)


async def test_a_client_lowered_priority_orders_the_queue() -> None:
    pool, s = _pool([1], tiers={"std": {"client_priority": True}})
    held = await s.admit(_req(0), pool)
    tasks = await _queue(
        s, pool, [_req(1, tier="std", priority=3, body={"priority": 3}), _req(2, tier="std")]
    )
    assert _ids(await _drain(s, held, tasks)) == ["r2", "r1"]


# -- cancellation, pinning, state ------------------------------------------------------------------


async def test_a_waiter_cancelled_in_the_queue_takes_nothing() -> None:
    pool, s = _pool([1])
    held = await s.admit(_req(0), pool)
    (waiter,) = await _queue(s, pool, [_req(1)])
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert s.queued == 0 and s.snapshot()["tenants"] == 0
    s.release(held, OK)
    assert pool.endpoints[0].in_flight == 0 and pool.dispatched == 1
    ticket = await s.admit(_req(2), pool)
    assert ticket.endpoint.in_flight == 1


async def test_a_slot_handed_to_a_cancelled_waiter_is_given_back() -> None:
    pool, s = _pool([1])
    held = await s.admit(_req(0), pool)
    waiter, other = await _queue(s, pool, [_req(1), _req(2)])
    s.release(held, OK)  # the slot goes to r1 ...
    waiter.cancel()  # ... whose client leaves before it runs again
    with pytest.raises(asyncio.CancelledError):
        await waiter
    ticket = await other  # the slot came back and went on to r2
    assert ticket.request.id == "r2" and pool.dispatched == 3
    s.release(ticket, OK)
    assert pool.endpoints[0].in_flight == 0


async def test_a_withdrawn_request_is_not_charged_to_its_tenant() -> None:
    pool, s = _pool([1])
    held = await s.admit(_req(0), pool)
    a1, a2 = await _queue(s, pool, [_req(1, tenant="a"), _req(2, tenant="a")])
    await _cancel([a2])  # a's second request leaves unserved
    tasks = [a1, *await _queue(s, pool, [_req(3, tenant="b"), _req(4, tenant="a"), _req(5, tenant="b")])]
    # r4 is a's second request, not its third: it goes before b's second one.
    assert _ids(await _drain(s, held, tasks)) == ["r1", "r3", "r4", "r5"]


async def test_an_endpoint_turning_healthy_wakes_waiters() -> None:
    pool, s = _pool([1, 1])
    pool.set_healthy(pool.endpoints[1], False)
    held = await s.admit(_req(0), pool)
    (waiter,) = await _queue(s, pool, [_req(1)])
    pool.set_healthy(pool.endpoints[1], True)  # capacity appears: the waiter is dispatched
    assert s.queued == 0 and pool.endpoints[1].in_flight == 1
    ticket = await waiter
    assert ticket.endpoint.name == "e1"
    s.release(ticket, OK)
    s.release(held, OK)


async def test_a_pinned_waiter_does_not_block_other_versions() -> None:
    pool, s = _pool([1, 1], versions=["v1", "v2"])
    a = await s.admit(_req(0, version="v1"), pool)
    # v2 is free, v1 busy: the pinned request waits, later ones must still reach v2.
    pinned, free = await _queue(s, pool, [_req(1, version="v1"), _req(2)], grows=1)
    assert free.done() and (await free).endpoint.version == "v2"
    assert not pinned.done()
    b = await free
    tasks = await _queue(s, pool, [_req(3), _req(4, version="v1")])  # everything busy now
    s.release(b, OK)  # a v2 slot: the pinned head cannot use it, r3 can
    assert (await _next(set(tasks))).request.id == "r3"
    s.release(a, OK)
    assert (await pinned).endpoint.version == "v1"
    await _cancel(tasks)
    assert s.queued == 0


async def test_tenant_state_is_dropped_once_a_flood_drains() -> None:
    pool, s = _pool([1], tiers={"lo": {"priority": 1}})
    held = await s.admit(_req(0), pool)
    reqs = [
        _req(10 * i + t, tenant=f"t{t}", tier="lo" if t % 2 else "default")
        for i in range(10)
        for t in range(5)
    ]
    tasks = await _queue(s, pool, reqs)
    snap = s.snapshot()
    assert snap["tenants"] == 5 and snap["priorities"] == {0: 30, 1: 20}
    await _drain(s, held, tasks)
    snap = s.snapshot()
    assert snap["tenants"] == 0 and snap["priorities"] == {} and snap["queued"] == 0
    assert snap["oldest_wait_s"] is None


async def test_passing_tenants_are_forgotten_during_a_long_backlog() -> None:
    pool, s = _pool([1])
    ticket = await s.admit(_req(0), pool)
    pending = set(await _queue(s, pool, [_req(1000 + i, tenant="bg") for i in range(200)]))
    most = 0
    for i in range(60):  # a new tenant every other dispatch, each with one request
        pending.update(await _queue(s, pool, [_req(i, tenant=f"x{i}")]))
        for _ in range(2):
            s.release(ticket, OK)
            ticket = await _next(pending)
            most = max(most, s.snapshot()["tenants"])  # type: ignore[call-overload]
    assert s.queued > 0  # the backlog never drained ...
    assert most <= 4  # ... yet tenants that were served and left are not kept
    s.release(ticket, OK)
    await _cancel(pending)
    assert s.snapshot()["tenants"] == 0


# -- options --------------------------------------------------------------------------------


def test_options_defaults_and_validation() -> None:
    opts = PriorityOptions()
    assert (opts.max_queue, opts.max_wait_s, opts.aging_s, opts.default_output_tokens) == (
        1024,
        60.0,
        30.0,
        256,
    )
    assert PriorityOptions(tiers={"gold": {}}, default_tier="gold").default_tier == "gold"
    with pytest.raises(pydantic.ValidationError, match="default_tier 'gold' is not a tier"):
        PriorityOptions(default_tier="gold")
    with pytest.raises(pydantic.ValidationError, match="greater than 0"):
        PriorityOptions(tiers={"free": {"weight": -1}})
    with pytest.raises(pydantic.ValidationError, match="greater than 0"):
        PriorityOptions(tenant_weights={"acme": 0})
    with pytest.raises(pydantic.ValidationError, match="Extra inputs"):
        PriorityOptions(max_queu=5)  # type: ignore[call-arg]
    with pytest.raises(pydantic.ValidationError, match="Extra inputs"):
        TierPolicy(prio=1)  # type: ignore[call-arg]
    for name, field in [*PriorityOptions.model_fields.items(), *TierPolicy.model_fields.items()]:
        assert field.description, name


async def test_the_default_tier_can_be_reconfigured() -> None:
    pool, s = _pool([0], tiers={"default": {"priority": 3}})
    ticket = await s.admit(_req(0, tier="whatever"), pool)
    assert ticket.request.priority == 3
    s.release(ticket, OK)


def test_registered_as_priority() -> None:
    seen: dict[str, Any] = {}

    def register(name: str, factory: Any, **kwargs: Any) -> None:
        seen[name] = (factory, kwargs)

    priority_plugin.register_schedulers(register)
    factory, kwargs = seen["priority"]
    assert factory is PriorityScheduler and kwargs["options"] is PriorityOptions
    assert kwargs["description"]
    assert isinstance(factory(None), PriorityScheduler)


# -- max_share: headroom for higher tiers ---------------------------------------------------


async def test_max_share_caps_a_tier_and_keeps_headroom() -> None:
    pool, s = _pool([5, 5], tiers={"free": TierPolicy(priority=2, max_share=0.6), "premium": TierPolicy()})
    # 60% of 10 slots: the 7th free request waits although slots are free.
    free = [await s.admit(_req(i, tier="free"), pool) for i in range(6)]
    waiting = await _queue(s, pool, [_req(6, tier="free")])
    assert sum(e.in_flight for e in pool.endpoints) == 6
    # Premium traffic still finds slots at once.
    premium = [await s.admit(_req(10 + i, tier="premium"), pool) for i in range(4)]
    assert sum(e.in_flight for e in pool.endpoints) == 10
    assert not waiting[0].done()
    # A free request finishing lets the waiting one in (still at most 6 free in flight).
    s.release(free[0], OK)
    t = await waiting[0]
    assert s.snapshot()["in_flight"]["free"] == 6  # type: ignore[index]
    for ticket in [*free[1:], t, *premium]:
        s.release(ticket, OK)
    assert s.snapshot()["in_flight"] == {"default": 0, "free": 0, "premium": 0}


async def test_max_share_does_not_apply_without_limits() -> None:
    pool, s = _pool([0, 0], tiers={"free": TierPolicy(max_share=0.1)})
    tickets = [await s.admit(_req(i, tier="free"), pool) for i in range(20)]
    assert s.queued == 0 and len(tickets) == 20


async def test_headroom_leaves_slots_for_better_tiers() -> None:
    pool, s = _pool([5, 5], tiers={"free": TierPolicy(priority=2, headroom=0.3), "premium": TierPolicy()})
    premium = [await s.admit(_req(i, tier="premium"), pool) for i in range(2)]
    # 10 slots, 30% kept free: free requests may fill up to 7 in flight, premium's included.
    free = [await s.admit(_req(10 + i, tier="free"), pool) for i in range(5)]
    waiting = await _queue(s, pool, [_req(20, tier="free")])
    assert sum(e.in_flight for e in pool.endpoints) == 7
    more = [await s.admit(_req(30 + i, tier="premium"), pool) for i in range(3)]
    assert sum(e.in_flight for e in pool.endpoints) == 10
    # Premium leaving makes room for the waiting free request only once 30% would stay free.
    s.release(more[0], OK)
    s.release(more[1], OK)
    await asyncio.sleep(0)
    assert not waiting[0].done()
    s.release(more[2], OK)
    await asyncio.sleep(0)
    assert not waiting[0].done()  # 7 of 10 busy: one more would leave only 20% free
    s.release(premium[0], OK)
    t = await waiting[0]
    for ticket in [premium[1], *free, t]:
        s.release(ticket, OK)
    assert s.queued == 0 and sum(e.in_flight for e in pool.endpoints) == 0


# -- the fleet (fleet:) -----------------------------------------------------------------------


async def test_service_a_tenant_got_through_another_gateway_counts_here() -> None:
    """Tenants a and b with equal weights queue alternately on a one-slot pool. Alone, the
    queue alternates them; told, once the backlog has begun, that a was already served 1,000
    tokens' worth elsewhere in the fleet, it serves b's first five (200 tokens each) before
    a's turn comes."""

    async def order(charge: float) -> list[str]:
        pool, s = _pool([1])
        s.fleet_state()  # a fleet takes this queue's state from now on
        held = await s.admit(_req(0, tenant="x"), pool)
        tasks = await _queue(s, pool, [_req(1, tenant="b")])
        if charge:
            s.merge_fleet([{"service": {"0": {"a": charge}}}])
        reqs = [_req(i, tenant="a" if i % 2 == 0 else "b") for i in range(2, 13)]
        tasks += await _queue(s, pool, reqs)
        return [t.request.principal.tenant for t in await _drain(s, held, tasks)]

    assert await order(0) == ["b", "a"] * 6
    charged = await order(1000.0)
    assert charged[:5] == ["b"] * 5 and charged.count("a") == charged.count("b") == 6
    # Without a backlog here there is nothing to be fair about: a charge is dropped.
    _, s = _pool([1])
    s.merge_fleet([{"service": {"0": {"a": 1000.0}}}])
    assert s.snapshot()["tenants"] == 0


async def test_the_queue_says_the_service_it_charged_once_and_its_tiers_slots() -> None:
    pool, s = _pool([1, 1], tiers={"free": {"max_share": 0.5}})
    assert s.fleet_state() == {"tiers": {}, "service": {}}
    held = await s.admit(_req(0, tenant="a", tier="free"), pool)
    tasks = await _queue(s, pool, [_req(1, tenant="a", tier="free", prompt=300, max_tokens=100)])
    state = s.fleet_state()
    assert state["tiers"] == {"free": 1}
    assert state["service"] == {"0": {"a": pytest.approx(400.0)}}  # cost / weight 1
    assert s.fleet_state()["service"] == {}  # said once
    await _cancel(tasks)
    s.release(held, OK)


async def test_a_tiers_share_counts_the_fleets_slots() -> None:
    """free may hold half of 4 slots. Two of its requests run on another gateway: here it
    gets none; once they end there, it gets its two."""
    pool, s = _pool([2, 2], tiers={"free": {"max_share": 0.5}})
    s.merge_fleet([{"tiers": {"free": 2}}])
    tasks = await _queue(s, pool, [_req(1, tier="free")])
    assert pool.endpoints[0].in_flight + pool.endpoints[1].in_flight == 0
    s.merge_fleet([{"tiers": {}}])
    s.wake(pool)
    await asyncio.wait_for(tasks[0], 1)
    second = await s.admit(_req(2, tier="free"), pool)
    third = await _queue(s, pool, [_req(3, tier="free")])  # its share is full again
    await _cancel(third)
    s.release(tasks[0].result(), OK)
    s.release(second, OK)


async def test_a_gateway_holds_its_tenants_share_of_the_fleets_slots() -> None:
    """Six slots. This queue holds one tenant (flood); another gateway's queue holds two
    (a and b) at the same level, equal weights: flood may hold a third of the slots here.
    Releases bring it down to two slots before another of its waiters goes; once the other
    backlog is gone, it takes slots as they come again."""
    pool, s = _pool([6])
    s.fleet_state()
    held = [await s.admit(_req(i, tenant="flood"), pool) for i in range(6)]
    tasks = await _queue(s, pool, [_req(10 + i, tenant="flood") for i in range(4)])
    assert s.fleet_state()["backlog"] == [0, {"flood": [4, 1.0]}]
    s.merge_fleet([{"backlog": [0, {"a": [5, 1.0], "b": [5, 1.0]}]}])
    for ticket in held[:4]:
        s.release(ticket, OK)
    await asyncio.sleep(0)
    assert s.queued == 4  # 2 slots held: its share, though 4 are free for the others
    s.release(held[4], OK)
    await asyncio.sleep(0)
    assert s.queued == 3 and sum(t.done() for t in tasks) == 1
    # The others' backlog is gone: slots as they come.
    s.merge_fleet([{"backlog": None}])
    s.wake(pool)
    await asyncio.sleep(0)
    assert s.queued == 0
    for t in tasks:
        s.release(t.result(), OK)
    s.release(held[5], OK)
    assert pool.endpoints[0].in_flight == 0


async def test_the_fleets_slot_split_follows_weights_and_levels() -> None:
    # flood weighs 2 against a and b: half of 6 slots.
    pool, s = _pool([6], tenant_weights={"flood": 2.0})
    held = [await s.admit(_req(i, tenant="flood"), pool) for i in range(6)]
    tasks = await _queue(s, pool, [_req(10 + i, tenant="flood") for i in range(3)])
    s.merge_fleet([{"backlog": [0, {"a": [1, 1.0]}]}, {"backlog": [0, {"b": [9, 1.0]}]}])
    for ticket in held[:3]:
        s.release(ticket, OK)
    await asyncio.sleep(0)
    assert s.queued == 3  # three held: its half
    s.release(held[3], OK)
    await asyncio.sleep(0)
    assert s.queued == 2
    # A backlog at another level is not split with this one (priority is per queue), and
    # with `fleet_slots: demand` nothing is.
    s.merge_fleet([{"backlog": [2, {"a": [50, 1.0]}]}])
    s.wake(pool)
    await asyncio.sleep(0)
    assert s.queued == 0
    for t in tasks:
        s.release(t.result(), OK)
    for ticket in held[4:]:
        s.release(ticket, OK)
    pool, d = _pool([2], fleet_slots="demand")
    first = [await d.admit(_req(i, tenant="flood"), pool) for i in range(2)]
    waiting = await _queue(d, pool, [_req(5, tenant="flood")])
    d.merge_fleet([{"backlog": [0, {"a": [50, 1.0], "b": [50, 1.0]}]}])
    d.release(first[0], OK)
    await asyncio.wait_for(waiting[0], 1)
    d.release(first[1], OK)
    d.release(waiting[0].result(), OK)


def test_a_tenant_without_a_backlog_is_not_refused_for_anothers() -> None:
    """One slot at one dispatch a second, 20 of tenant t's requests queued: t's next one
    would wait about 20 s and is refused (its limit is 5 s); a tenant with nothing queued
    is served at its fair share's pace, so it is queued, and served within its limit."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool, s = _pool([1], tiers=_WAIT_TIERS)
        ticket, pending = await _build_backlog(s, pool, backlog=30, dispatches=10)
        with pytest.raises(GatewayError) as info:
            await s.admit(_req(1, tier="quick"), pool)  # t: behind its own 20
        assert info.value.code == "queue_wait_exceeded"
        other = asyncio.create_task(s.admit(_req(2, tier="quick", tenant="other"), pool))
        await asyncio.sleep(0)
        assert s.queued == 21
        pending.add(other)
        t0 = loop.time()
        while not other.done():
            await asyncio.sleep(1.0)
            s.release(ticket, OK)
            ticket = await _next(pending)
        assert other.result() is ticket and loop.time() - t0 <= 5
        s.release(ticket, OK)
        await _cancel(pending)

    run_virtual(main())
