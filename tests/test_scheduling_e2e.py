"""Tiers, priorities, queue limits, deadlines, routing rules and version pins through a real
gateway process, with the official OpenAI SDK as the client."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tests.conftest import wait_until

TIERS = """
gateway: {identity_headers: true}
models:
  chat:
    health: {interval_s: 0.05}
    load: {interval_s: 0.05}
    routes:
      - {tiers: [bulk], to: small}
    traffic: {v1: 100, v2: 0}
    scheduler:
      policy: priority
      options:
        tiers:
          premium: {priority: 0}
          free: {priority: 5, max_queue: 1}
    endpoints:
      - {kind: sim, max_concurrency: 1, version: v1, options: {ttft_ms: 0, tokens_per_s: 50}}
      - {kind: sim, version: v2, options: {ttft_ms: 0, tokens_per_s: 0}}
  small:
    endpoints:
      - {kind: sim, options: {ttft_ms: 0, tokens_per_s: 0}}
"""


def _headers(tier: str, tenant: str = "t") -> dict[str, str]:
    return {"x-shuniu-tier": tier, "x-shuniu-tenant": tenant}


def _ready(gw) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return httpx.get(f"{gw.url}/ready", timeout=5).json()  # type: ignore[no-any-return]


def _hold_the_slot(client: openai.OpenAI):  # type: ignore[no-untyped-def]
    """A long stream that holds the only v1 slot until it is closed (its first chunk is read,
    so it is running on the engine)."""
    hold = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "hold"}],
        max_tokens=1000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(hold))
    return hold


@pytest.fixture
def tiers_gateway(gateway_factory):  # type: ignore[no-untyped-def]
    return gateway_factory(TIERS)


def test_premium_overtakes_free_and_a_full_tier_queue_gets_429(tiers_gateway) -> None:  # type: ignore[no-untyped-def]
    gw = tiers_gateway
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)
    finished: list[str] = []
    errors: list[BaseException] = []

    def ask(tier: str) -> None:
        try:
            client.chat.completions.create(
                model="chat",
                messages=[{"role": "user", "content": tier}],
                max_tokens=30,  # 0.6 s each: the finishing order is the serving order
                extra_headers=_headers(tier),
            )
            finished.append(tier)
        except BaseException as exc:  # reported below
            errors.append(exc)

    hold = _hold_the_slot(client)
    free = threading.Thread(target=ask, args=("free",))
    free.start()
    wait_until(lambda: _ready(gw)["models"]["chat"]["queued"] == 1)
    # The free tier may queue one request: the next is refused at once, with Retry-After.
    with pytest.raises(openai.RateLimitError) as err:
        client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=3,
            extra_headers=_headers("free"),
        )
    assert err.value.code == "queue_full"
    assert int(err.value.response.headers["retry-after"]) >= 1
    premium = threading.Thread(target=ask, args=("premium",))
    premium.start()
    wait_until(lambda: _ready(gw)["models"]["chat"]["queued"] == 2)
    hold.close()  # the slot frees: premium, queued later, goes first
    free.join(30)
    premium.join(30)
    assert not errors, errors
    assert finished == ["premium", "free"]


def test_deadline_header(tiers_gateway) -> None:  # type: ignore[no-untyped-def]
    gw = tiers_gateway
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=2,
            extra_headers={"x-shuniu-deadline-ms": "soon"},
        )
    assert err.value.code == "invalid_value"
    assert "x-shuniu-deadline-ms" in err.value.message
    hold = _hold_the_slot(client)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as late:
        client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=2,
            extra_headers={"x-shuniu-deadline-ms": "300"},
        )
    assert late.value.status_code == 504
    assert late.value.code == "deadline_exceeded"
    assert time.monotonic() - started < 10
    hold.close()


def test_routing_rule_and_version_pin(tiers_gateway) -> None:  # type: ignore[no-untyped-def]
    gw = tiers_gateway
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)
    resp = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=2,
        extra_headers=_headers("bulk"),
    )
    assert resp.model == "chat"  # the name the client asked for
    small = _ready(gw)["models"]["small"]["endpoints"][0]
    assert small["completed"] == 1
    # v2 has weight 0 in the split, but a pin reaches it.
    client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=2,
        extra_headers={"x-shuniu-version": "v2"},
    )
    v2 = _ready(gw)["models"]["chat"]["endpoints"][1]
    assert v2["version"] == "v2" and v2["completed"] == 1
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model="chat",
            messages=[{"role": "user", "content": "x"}],
            max_tokens=2,
            extra_headers={"x-shuniu-version": "v9"},
        )
    assert err.value.code == "invalid_version"


def test_identity_headers_are_ignored_unless_enabled(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(TIERS.replace("identity_headers: true", "identity_headers: false"))
    client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=30)
    client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "x"}],
        max_tokens=2,
        extra_headers=_headers("bulk"),
    )
    ready = _ready(gw)["models"]
    assert ready["small"]["endpoints"][0]["completed"] == 0  # not routed as `bulk`
    assert ready["chat"]["endpoints"][0]["completed"] == 1
