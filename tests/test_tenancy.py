"""Tiers and rate-limit plans on the request path (core/tenancy.py), with the memory store."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from shuniu.core.api.openai import parse_request
from shuniu.core.config import Deployment
from shuniu.core.errors import GatewayError
from shuniu.core.pipeline import identity
from shuniu.core.pipeline.recording import Progress
from shuniu.core.tenancy.binding import Binding
from shuniu.core.tenancy.ratelimit_headers import reset_bytes
from shuniu.core.tenancy.tenancy import Tenancy, format_reset
from shuniu.core.types import InferenceRequest, Limits, Principal
from shuniu.plugins.ratelimit import loop_binding
from shuniu.plugins.ratelimit.memory import MemoryRateLimitStore
from shuniu.plugins.schedulers.priority import PriorityOptions, PriorityScheduler, TierPolicy


def _deployment(**extra: object) -> Deployment:
    return Deployment.model_validate(
        {"models": {"m": {"aliases": ["alias"], "endpoints": [{"kind": "sim"}]}}, **extra}
    )


def _req(body: dict, principal: Principal) -> InferenceRequest:  # type: ignore[type-arg]
    """A chat request; its prompt "hi" is 9 tokens by the estimate: "user", ":", "hi", the
    line break, and 2 + 3 for the chat template's markers (core/tokens.py)."""
    req = parse_request(
        json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}).encode(),
        "chat",
        "r",
        0.0,
    )
    req.principal = principal
    return req


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.02, "20ms"),
        (0.0004, "1ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (3725.25, "1h2m5.25s"),
    ],
)
def test_format_reset_matches_openai_style(seconds: float, text: str) -> None:
    assert format_reset(seconds) == text


def test_reset_headers_say_what_format_reset_says() -> None:
    """The headers' short path for sub-second resets (a table of ``<n>ms``) writes what
    :func:`format_reset` writes, at every millisecond and half millisecond around it."""
    for n in range(0, 2001):
        seconds = n / 2000
        assert reset_bytes(seconds) == format_reset(seconds).encode(), seconds
    assert reset_bytes(0.0125) == b"13ms"  # a half rounds up


def test_tier_checks_models_max_tokens_and_prompt() -> None:
    d = _deployment(
        tiers={
            "free": {
                "models": ["alias"],
                "max_tokens_default": 7,
                "max_tokens_limit": 9,
                "max_prompt_tokens": 10,  # "hi" is 9 (see _req), six words 14
            }
        }
    )
    t = Tenancy(d, [], None)
    tier = t.tier_of(Principal(tier="free"))
    req = _req({}, Principal(tier="free"))
    req.model = "alias"
    t.check(req, tier, "m")
    assert req.max_tokens == 7 and req.body["max_tokens"] == 7
    req = _req({}, Principal(tier="free"))  # "m" is not in the list, only its alias
    with pytest.raises(GatewayError) as e:
        t.check(req, tier, "m")
    assert e.value.status == 404
    req = _req({"max_tokens": 10}, Principal(tier="free"))
    req.model = "alias"
    with pytest.raises(GatewayError, match="above the 9"):
        t.check(req, tier, "m")
    req = _req(
        {"messages": [{"role": "user", "content": "one two three four five six"}]}, Principal(tier="free")
    )
    req.model = "alias"
    with pytest.raises(GatewayError) as e:
        t.check(req, tier, "m")
    assert e.value.code == "prompt_too_long"
    # The credential's own list narrows the tier's.
    req = _req({}, Principal(tier="default", models=frozenset({"other"})))
    with pytest.raises(GatewayError):
        t.check(req, t.tier_of(req.principal), "m")
    with pytest.raises(GatewayError) as e:
        t.tier_of(Principal(tier="platinum"))
    assert e.value.status == 403


def test_key_limits_override_the_tiers_and_all_limits_are_checked_together() -> None:
    async def run() -> None:
        d = _deployment(tiers={"free": {"key_limits": {"rpm": 5, "tpm": 1000}, "tenant_limits": {"rpm": 3}}})
        now = [0.0]
        store = MemoryRateLimitStore(None)
        store.clock = lambda: now[0]
        t = Tenancy(d, [], store)
        tier = t.tiers["free"]
        # Key rpm 5 overridden to 10; the tenant's 3 binds first.
        a = Principal(tenant="acme", key_id="a", tier="free", limits=Limits(rpm=10))
        b = Principal(tenant="acme", key_id="b", tier="free")
        admissions = [await t.acquire(_req({"max_tokens": 10}, p), tier) for p in (a, b, a)]
        assert all(x is not None for x in admissions)
        headers = dict(admissions[-1].headers)  # type: ignore[union-attr]
        assert (
            headers[b"x-ratelimit-limit-requests"] == b"3"
            and headers[b"x-ratelimit-remaining-requests"] == b"0"
        )
        with pytest.raises(GatewayError) as e:
            await t.acquire(_req({"max_tokens": 10}, b), tier)
        assert e.value.status == 429 and "tenant 'acme'" in e.value.message
        assert e.value.headers["retry-after"] == "20"  # one request refills in 60/3 s
        # Another tenant is untouched.
        other = await t.acquire(
            _req({"max_tokens": 10}, Principal(tenant="x", key_id="c", tier="free")), tier
        )
        assert other is not None
        # Admissions carry what settles them.
        # 10 for max_tokens, 9 for the prompt (see _req)
        assert admissions[0] is not None and admissions[0].reserved == 19

    asyncio.run(run())


def test_settling_gives_back_the_unused_reservation() -> None:
    async def run() -> None:
        d = _deployment(tiers={"t": {"key_limits": {"tpm": 100}}})
        store = MemoryRateLimitStore(None)
        store.clock = lambda: 0.0  # no refill during the test
        t = Tenancy(d, [], store)
        p = Principal(tenant="a", key_id="k", tier="t")
        first = await t.acquire(_req({"max_tokens": 50}, p), t.tiers["t"])
        assert first is not None and first.reserved == 59  # 50 + the prompt's 9
        with pytest.raises(GatewayError) as e:
            await t.acquire(_req({"max_tokens": 50}, p), t.tiers["t"])
        assert e.value.type == "tokens"
        await t.settle(first, used_tokens=10)  # 49 of the 59 come back
        second = await t.acquire(_req({"max_tokens": 50}, p), t.tiers["t"])
        assert second is not None
        assert dict(second.headers)[b"x-ratelimit-remaining-tokens"] == b"31"  # 100 - 10 - 59

    asyncio.run(run())


@pytest.mark.parametrize(
    ("rpm", "reset_requests"),
    [(120, b"500ms"), (30, b"2s")],  # one request refills in 60/rpm s: under a second, and over
)
def test_the_headers_of_a_booking_say_what_is_left_and_when_it_refills(
    rpm: int, reset_requests: bytes
) -> None:
    # The in-process store's binding (acquire_now) and its general path (acquire) write the
    # same x-ratelimit-* headers, with the values the limits give.
    d = _deployment(tiers={"t": {"key_limits": {"rpm": rpm, "tpm": 6000}}})
    p = Principal(tenant="a", key_id="k", tier="t")
    seen = []
    for bound in (True, False):
        store = MemoryRateLimitStore(None)
        store.clock = lambda: 1000.0
        t = Tenancy(d, [], store)
        req = _req({"max_tokens": 16}, p)  # 25 tokens reserved: 16 and the prompt's 9
        if bound:
            admission = t.acquire_now(req, t.tiers["t"])
            assert admission is not None and admission.binding is not None
        else:
            admission = asyncio.run(t.acquire(req, t.tiers["t"]))
            assert admission is not None and admission.binding is None
        seen.append(admission.headers)
    assert seen[0] == seen[1]
    assert dict(seen[0]) == {
        b"x-ratelimit-limit-requests": b"%d" % rpm,
        b"x-ratelimit-remaining-requests": b"%d" % (rpm - 1),
        b"x-ratelimit-reset-requests": reset_requests,
        b"x-ratelimit-limit-tokens": b"6000",
        b"x-ratelimit-remaining-tokens": b"5975",
        b"x-ratelimit-reset-tokens": b"250ms",  # 25 tokens of 6000 a minute
    }


@pytest.mark.parametrize("loops", [False, True], ids=["generated", "loops"])
def test_a_bound_booking_is_settled_on_its_binding(loops: bool) -> None:
    # The compiled loops (a core Binding) are booked and given back directly; the generated
    # functions through the binding object. Either way the request's lease is released and
    # its unused tokens are given back.
    d = _deployment(tiers={"t": {"key_limits": {"tpm": 6000, "concurrency": 1}}})
    p = Principal(tenant="a", key_id="k", tier="t")
    store = MemoryRateLimitStore(None)
    store.clock = lambda: 1000.0
    bind = store.bind

    def bind_with(*args: Any) -> Any:
        binding = bind(*args)
        if loops:
            binding.use_loops()
        return binding

    store.bind = bind_with  # type: ignore[method-assign]
    t = Tenancy(d, [], store)
    admission = t.acquire_now(_req({"max_tokens": 16}, p), t.tiers["t"])
    assert admission is not None
    # (A compiled build's bindings take the loops whatever this test asks.)
    assert isinstance(admission.binding, Binding) == (loops or loop_binding.COMPILED)
    with pytest.raises(GatewayError, match="concurrent"):  # the one slot is held
        t.acquire_now(_req({"max_tokens": 16}, p), t.tiers["t"])
    progress = Progress("m", None)
    progress.prompt_tokens = 9  # and no output: the 16 reserved tokens go back
    identity.settle_now(t, admission, progress)
    assert store._leases["k:a:k:conc"] == {}
    assert store._tats == {"k:a:k:tpm": 1000.0 + 9 * 60.0 / 6000}


def test_a_request_too_large_for_a_token_limit_is_refused_at_once() -> None:
    async def run() -> None:
        d = _deployment(tiers={"t": {"key_limits": {"tpm": 100}}})
        t = Tenancy(d, [], MemoryRateLimitStore(None))
        with pytest.raises(GatewayError, match="Request too large"):
            await t.acquire(
                _req({"max_tokens": 200}, Principal(tenant="a", key_id="k", tier="t")), t.tiers["t"]
            )
        # No max_tokens: the default output reservation (256) is above 100 too.
        with pytest.raises(GatewayError, match="requested"):
            await t.acquire(_req({}, Principal(tenant="a", key_id="k", tier="t")), t.tiers["t"])

    asyncio.run(run())


def test_no_limits_no_store_call() -> None:
    async def run() -> None:
        class Exploding:
            async def acquire(self, *a: object) -> None:
                raise AssertionError("store called without limits")

        t = Tenancy(_deployment(tiers={"t": {}}), [], Exploding())  # type: ignore[arg-type]
        assert await t.acquire(_req({}, Principal(tier="t")), t.tiers["t"]) is None

    asyncio.run(run())


def test_priority_scheduler_adopts_deployment_tiers_it_does_not_configure() -> None:
    s = PriorityScheduler(PriorityOptions(tiers={"gold": TierPolicy(priority=1)}))
    s.adopt_tiers({"gold": 9, "free": 5, "pro": 0})
    assert s._tiers["gold"].priority == 1  # its own configuration wins
    assert s._tiers["free"].priority == 5 and s._tiers["pro"].priority == 0
    assert not s._tiers["free"].client_priority


def test_identity_headers_only_without_authenticators() -> None:
    d = _deployment(gateway={"identity_headers": True})
    assert Tenancy(d, [], None).identity_headers

    class Any_:
        def authenticate(self, credential: str, headers: object) -> None:
            return None

    assert not Tenancy(d, [Any_()], None).identity_headers


def test_a_credentials_models_narrow_its_tier() -> None:
    """A key's or token's model list can only take away from its tier's, never add."""
    d = _deployment(tiers={"free": {"models": ["alias"]}})
    t = Tenancy(d, [], None)
    tier = t.tier_of(Principal(tier="free"))
    in_both = _req({}, Principal(tier="free", models=frozenset({"alias"})))
    in_both.model = "alias"
    t.check(in_both, tier, "m")
    only_tier = _req({}, Principal(tier="free", models=frozenset({"other"})))
    only_tier.model = "alias"
    only_token = _req({}, Principal(tier="free", models=frozenset({"m", "other"})))
    only_token.model = "other"
    for req in (only_tier, only_token):
        with pytest.raises(GatewayError) as e:
            t.check(req, tier, req.model)
        assert e.value.status == 404
