"""Budgets: windows, reservations and settlements, soft and hard thresholds, money from
prices, counters in memory and in a real Redis shared by two gateways, and reconciling
counters with the ledger."""

from __future__ import annotations

import calendar
import math
import time

import pytest

from shuniu.core.config import GovernanceConfig
from shuniu.core.errors import GatewayError
from shuniu.core.governance import Budgets, Prices
from shuniu.core.governance.budgets import window, window_start
from shuniu.core.governance.counters import MemoryCounters, RedisCounters
from shuniu.core.types import Budget, InferenceRequest, Principal

GOV = GovernanceConfig.model_validate(
    {
        "ledger": None,
        "prices": {},
        "tenants": {"acme": {"budgets": [{"period": "month", "tokens": 10_000}]}},
        "projects": {"search": {"budgets": [{"period": "total", "cost": 0.01}]}},
    }
)


def _prices() -> Prices:
    from shuniu.core.config import PriceConfig

    return Prices({"chat": PriceConfig(prompt=10.0, completion=30.0)}, "EUR")


def _req(principal: Principal, prompt: int = 100, max_tokens: int | None = 100) -> InferenceRequest:
    return InferenceRequest(
        id="r",
        model="chat",
        api="chat",
        body={},
        prompt="x",
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        principal=principal,
    )


def test_windows_are_utc_calendar_days_and_months() -> None:
    t = calendar.timegm((2026, 12, 31, 23, 59, 0))
    assert window("day", t) == ("d20261231", float(calendar.timegm((2027, 1, 1, 0, 0, 0))))
    assert window("month", t) == ("m202612", float(calendar.timegm((2027, 1, 1, 0, 0, 0))))
    assert window("month", calendar.timegm((2026, 2, 10, 0, 0, 0)))[1] == calendar.timegm(
        (2026, 3, 1, 0, 0, 0)
    )
    assert window("total", t) == ("all", math.inf)
    assert window_start("day", t) == calendar.timegm((2026, 12, 31, 0, 0, 0))
    assert window_start("month", t) == calendar.timegm((2026, 12, 1, 0, 0, 0))


async def test_a_key_budget_runs_out_and_says_when_it_resets() -> None:
    budgets = Budgets(GOV, MemoryCounters(), _prices(), 256)
    key = Principal(tenant="solo", key_id="demo", budgets=(Budget(period="day", tokens=1000, soft=0.5),))
    holds = []
    for _ in range(4):  # 4 x (100 + 100) = 800 reserved
        holds.append(await budgets.reserve(_req(key), "chat"))
    # The soft threshold (500) was passed by the third request: it and the fourth are warned.
    assert [bool(h.headers) for h in holds] == [False, False, True, True]
    assert holds[3].headers[0][1] == b'key="demo"; period=day; unit=tokens; used=80%'
    with pytest.raises(GatewayError) as refused:
        await budgets.reserve(_req(key, max_tokens=300), "chat")  # 800 + 400 > 1000
    err = refused.value
    assert (err.status, err.code) == (429, "budget_exceeded")
    _name, ends = window("day", float(err.headers["x-shuniu-budget-reset"]) - 1)
    assert int(err.headers["x-shuniu-budget-reset"]) == int(ends)
    assert 1 <= int(err.headers["retry-after"]) <= 86400
    assert "800 of its 1,000 tokens" in err.message and "smaller max_tokens" in err.message
    assert budgets.refusals == {("key", "day"): 1}
    # Settling with the real usage gives back what was not used: now 400 tokens fit.
    for hold in holds:
        assert hold is not None
        budgets.settle(hold, 120, 0.0)  # each used 120 of its 200
    assert await budgets.reserve(_req(key, max_tokens=300), "chat") is not None  # 480 + 400 <= 1000


async def test_a_warning_names_its_key_without_any_line_break() -> None:
    # A key named with a line break (keys are named through the admin API) cannot end the
    # header early: the request path vouches that its headers hold no CR or LF.
    budgets = Budgets(GOV, MemoryCounters(), _prices(), 256)
    key = Principal(
        tenant="solo", key_id="a\r\nset-cookie: x", budgets=(Budget(period="day", tokens=100, soft=0.1),)
    )
    hold = await budgets.reserve(_req(key, prompt=10, max_tokens=10), "chat")
    assert hold is not None
    [(name, value)] = hold.headers
    assert name == b"x-shuniu-budget-warning" and value.startswith(b'key="aset-cookie: x"; period=day')
    assert b"\r" not in value and b"\n" not in value


async def test_tenant_and_project_budgets_apply_to_every_key_and_money_comes_from_prices() -> None:
    budgets = Budgets(GOV, MemoryCounters(), _prices(), 256)
    a = Principal(tenant="acme", key_id="a", project="search")
    b = Principal(tenant="acme", key_id="b", project="search")
    # The project may spend 0.01 EUR in total; a request reserves 100 x 10/M + 100 x 30/M = 0.004.
    first = await budgets.reserve(_req(a), "chat")
    second = await budgets.reserve(_req(b), "chat")
    assert first is not None and second is not None
    with pytest.raises(GatewayError) as refused:
        await budgets.reserve(_req(a), "chat")
    assert "project 'search'" in refused.value.message and "EUR" in refused.value.message
    assert "retry-after" not in refused.value.headers  # a total budget never resets
    # Real usage: a short answer cost less; the money comes back and the next one fits.
    budgets.settle(first, 110, 100 * 10e-6 + 10 * 30e-6)
    assert await budgets.reserve(_req(b), "chat") is not None
    # An anonymous caller of another tenant has no budget at all.
    assert await budgets.reserve(_req(Principal()), "chat") is None


async def test_a_request_without_max_tokens_reserves_the_default() -> None:
    budgets = Budgets(GOV, MemoryCounters(), _prices(), 256)
    key = Principal(tenant="solo", key_id="k", budgets=(Budget(period="day", tokens=300),))
    with pytest.raises(GatewayError):
        await budgets.reserve(_req(key, prompt=50, max_tokens=None), "chat")  # 50 + 256 > 300


async def test_two_gateways_share_one_budget_through_redis(redis_url: str) -> None:
    key = Principal(tenant="solo", key_id="shared", budgets=(Budget(period="day", tokens=1000),))
    gateways = [RedisCounters(redis_url, settle_interval_s=0.05) for _ in range(2)]
    budgets = [Budgets(GOV, c, _prices(), 256) for c in gateways]
    for c in gateways:
        await c.start()
    admitted = 0
    for i in range(10):  # each reserves 200: only five fit, whichever gateway they reach
        try:
            await budgets[i % 2].reserve(_req(key), "chat")
            admitted += 1
        except GatewayError as err:
            assert err.code == "budget_exceeded"
    assert admitted == 5
    assert not any(c.degraded for c in gateways)
    for c in gateways:
        await c.close()


async def test_redis_settlements_are_batched_and_reach_the_other_gateway(redis_url: str) -> None:
    key = Principal(tenant="solo", key_id="s", budgets=(Budget(period="day", tokens=400),))
    one, two = (
        RedisCounters(redis_url, settle_interval_s=0.05),
        RedisCounters(redis_url, settle_interval_s=0.05),
    )
    b1, b2 = Budgets(GOV, one, _prices(), 256), Budgets(GOV, two, _prices(), 256)
    await one.start()
    hold = await b1.reserve(_req(key), "chat")
    await b1.reserve(_req(key), "chat")
    with pytest.raises(GatewayError):
        await b2.reserve(_req(key), "chat")
    assert hold is not None
    b1.settle(hold, 0, 0.0)  # the request was answered from nowhere: all 200 back
    await one.close()  # closing sends what is pending
    assert await b2.reserve(_req(key), "chat") is not None
    await two.close()


async def test_redis_down_counts_in_the_process_and_says_so(redis_server_factory, caplog) -> None:  # type: ignore[no-untyped-def]
    server = redis_server_factory()
    counters = RedisCounters(server.url, settle_interval_s=0.05)
    budgets = Budgets(GOV, counters, _prices(), 256)
    key = Principal(tenant="solo", key_id="d", budgets=(Budget(period="day", tokens=500),))
    await budgets.reserve(_req(key), "chat")
    server.stop()
    await budgets.reserve(_req(key), "chat")  # Redis is gone: counted here
    assert counters.degraded
    await budgets.reserve(_req(key), "chat")
    with pytest.raises(GatewayError):
        await budgets.reserve(_req(key), "chat")  # 3 x 200 in the fallback > 500
    assert sum("unavailable" in r.message for r in caplog.records) == 1
    await counters.close()


async def test_reconciling_raises_counters_to_the_ledger_never_lowers_them() -> None:
    counters = MemoryCounters()
    budgets = Budgets(GOV, counters, _prices(), 256)
    key = Principal(tenant="acme", key_id="k", budgets=(Budget(period="day", tokens=1000),))
    now = time.time()
    # What the ledger holds for today (a restarted gateway, another gateway's spend).
    spent = [("acme", "k", None, 700, 0.0), ("acme", "other", None, 9_000, 0.0)]
    await counters.raise_to(budgets.reconcile_values("day", spent, now))
    await counters.raise_to(budgets.reconcile_values("month", spent, now))
    assert await budgets.reserve(_req(key), "chat") is not None  # 700 + 200 <= 1000
    # A lower sum (records not written yet) does not lower the counter: 900 + 200 > 1000.
    await counters.raise_to(budgets.reconcile_values("day", [("acme", "k", None, 10, 0.0)], now))
    with pytest.raises(GatewayError) as refused:
        await budgets.reserve(_req(key), "chat")
    assert "key 'k'" in refused.value.message
    # The tenant's month (10,000) holds 9,700 + 200 of this key: another key is refused too.
    with pytest.raises(GatewayError) as refused:
        await budgets.reserve(_req(Principal(tenant="acme", key_id="z")), "chat")
    assert "tenant 'acme'" in refused.value.message
