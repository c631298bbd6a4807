"""Rate limits and the response cache shared by two gateway processes through a real
``redis-server``; what happens when Redis goes away. The OpenAI SDK and httpx are the
clients."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time

import httpx
import openai
import pytest

from shuniu.plugins.auth.api_keys import hash_key, new_key
from tests.conftest import GatewayProcess, start_gateway, wait_until

KEYS = {name: new_key() for name in ("daily", "tokens", "x", "y", "minute", "shared")}


def _deployment(url: str, *, on_error: str = "open", ttft_ms: int = 0) -> str:
    return f"""
tiers:
  std: {{}}
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - {{id: daily, hash: "{hash_key(KEYS["daily"])}", tenant: acme, tier: std, limits: {{rpd: 200}}}}
          - {{id: tokens, hash: "{hash_key(KEYS["tokens"])}", tenant: acme, tier: std, limits: {{tpm: 1000}}}}
          - {{id: x, hash: "{hash_key(KEYS["x"])}", tenant: tenant-x, tier: std}}
          - {{id: y, hash: "{hash_key(KEYS["y"])}", tenant: tenant-y, tier: std}}
          - {{id: minute, hash: "{hash_key(KEYS["minute"])}", tenant: m, tier: std, limits: {{rpm: 3}}}}
          - {{id: shared, hash: "{hash_key(KEYS["shared"])}", tenant: s, tier: std, limits: {{rpm: 200}}}}
rate_limits:
  store: redis
  options: {{url: "{url}", on_error: {on_error}, timeout_s: 2, retry_interval_s: 0.2}}
cache:
  store: redis
  options: {{url: "{url}", timeout_s: 2, retry_after_s: 0.2}}
models:
  chat:
    health: {{interval_s: 0.05}}
    endpoints:
      - kind: sim
        replicas: 2
        options: {{ttft_ms: {ttft_ms}, tokens_per_s: 0, output_tokens_min: 4, output_tokens_max: 12}}
"""


def _pair(tmp_path, url: str, **kw: object) -> list[GatewayProcess]:  # type: ignore[no-untyped-def]
    gws = []
    for i in range(2):
        d = tmp_path / f"gw{i}"
        d.mkdir()
        gws.append(start_gateway(_deployment(url, **kw), d))  # type: ignore[arg-type]
    return gws


@pytest.fixture
def pair(tmp_path, redis_url):  # type: ignore[no-untyped-def]
    gws = _pair(tmp_path, redis_url)
    yield gws
    for gw in gws:
        gw.stop()


def _post(gw: GatewayProcess, key: str, body: dict, **headers: str) -> httpx.Response:  # type: ignore[type-arg]
    return httpx.post(
        f"{gw.base_url}/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}", **headers},
        timeout=30,
    )


def _chat(content: str = "hi", **extra: object) -> dict:  # type: ignore[type-arg]
    return {"model": "chat", "messages": [{"role": "user", "content": content}], **extra}


def _completed(gw: GatewayProcess) -> int:
    ready = httpx.get(f"{gw.url}/ready", timeout=5).json()
    return sum(e["completed"] for e in ready["models"]["chat"]["endpoints"])


def _flood(pair, key: str, n: int) -> tuple[list[int], float]:  # type: ignore[no-untyped-def]
    """``n`` requests, 40 at a time, alternately to each gateway: status codes, seconds."""

    async def run() -> list[int]:
        limits = httpx.Limits(max_connections=40)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            gate = asyncio.Semaphore(40)

            async def one(i: int) -> int:
                async with gate:
                    r = await client.post(
                        f"{pair[i % 2].base_url}/chat/completions",
                        json=_chat(max_tokens=1),
                        headers={"authorization": f"Bearer {key}"},
                    )
                    return r.status_code

            return await asyncio.gather(*(one(i) for i in range(n)))

    t0 = time.monotonic()
    codes = asyncio.run(run())
    return codes, time.monotonic() - t0


def test_two_gateways_hold_one_shared_request_limit(pair) -> None:  # type: ignore[no-untyped-def]
    """400 requests against 200 per day: exactly the limit gets through (a day's refill
    during the test is < 0.01 request)."""
    codes, _ = _flood(pair, KEYS["daily"], 400)
    allowed = codes.count(200)
    assert codes.count(429) == 400 - allowed
    assert abs(allowed - 200) <= 2, allowed  # within 1%
    # Both gateways took part.
    assert _completed(pair[0]) > 0 and _completed(pair[1]) > 0


def test_two_gateways_hold_one_shared_rpm_limit(pair) -> None:  # type: ignore[no-untyped-def]
    """400 requests against 200 per minute: the burst of 200 plus what refilled while the
    test ran (200/60 per second), within 1% of the limit."""
    codes, elapsed = _flood(pair, KEYS["shared"], 400)
    allowed = codes.count(200)
    assert codes.count(429) == 400 - allowed
    most = 200 + elapsed * 200 / 60
    assert 200 - 2 <= allowed <= most + 2, (allowed, elapsed)


def test_token_reservations_settle_across_gateways(pair) -> None:  # type: ignore[no-untyped-def]
    key = KEYS["tokens"]  # 1000 tokens per minute
    first = _post(pair[0], key, _chat(max_tokens=600))
    assert first.status_code == 200
    used = first.json()["usage"]["total_tokens"]
    assert used < 100
    # Had gateway 0 kept its reservation (~600), this one (~600 more) would be refused.
    second = _post(pair[1], key, _chat(max_tokens=600))
    assert second.status_code == 200, second.text
    left = int(second.headers["x-ratelimit-remaining-tokens"])
    reserved = second.json()["usage"]["prompt_tokens"] + 600
    assert abs(left - (1000 - used - reserved)) <= 3


def test_cache_is_shared_between_gateways_and_isolated_between_tenants(pair) -> None:  # type: ignore[no-untyped-def]
    body = _chat(content="shared answer", temperature=0, max_tokens=8)
    first = _post(pair[0], KEYS["x"], body)
    assert first.headers["x-shuniu-cache"] == "miss"
    hit = _post(pair[1], KEYS["x"], body)
    assert hit.headers["x-shuniu-cache"] == "hit"
    assert hit.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]
    assert _post(pair[1], KEYS["y"], body).headers["x-shuniu-cache"] == "miss"
    client = openai.OpenAI(base_url=pair[0].base_url, api_key=KEYS["y"], max_retries=0)
    raw = client.chat.completions.with_raw_response.create(**body)
    assert raw.headers["x-shuniu-cache"] == "hit"


def test_concurrent_identical_misses_on_two_gateways_go_upstream_once(tmp_path, redis_url) -> None:  # type: ignore[no-untyped-def]
    gws = _pair(tmp_path, redis_url, ttft_ms=400)
    try:
        body = _chat(content="one fill for the fleet", temperature=0, max_tokens=6)
        barrier = threading.Barrier(10)

        def ask(i: int) -> httpx.Response:
            barrier.wait()
            return _post(gws[i % 2], KEYS["x"], body)

        with concurrent.futures.ThreadPoolExecutor(10) as ex:
            replies = list(ex.map(ask, range(10)))
        assert all(r.status_code == 200 for r in replies)
        assert len({json.dumps(r.json()["choices"][0]["message"]) for r in replies}) == 1
        assert [r.headers["x-shuniu-cache"] for r in replies].count("miss") == 1
        assert _completed(gws[0]) + _completed(gws[1]) == 1
    finally:
        for gw in gws:
            gw.stop()


def test_redis_outage_fail_closed_refuses_fail_open_keeps_local_limits(
    tmp_path, redis_server_factory
) -> None:  # type: ignore[no-untyped-def]
    server = redis_server_factory()
    closed_dir, open_dir = tmp_path / "closed", tmp_path / "open"
    closed_dir.mkdir()
    open_dir.mkdir()
    closed = start_gateway(_deployment(server.url, on_error="closed"), closed_dir)
    opened = start_gateway(_deployment(server.url, on_error="open"), open_dir)
    try:
        for gw in (closed, opened):
            assert _post(gw, KEYS["x"], _chat(max_tokens=1)).status_code == 200
        server.stop()
        refused = _post(closed, KEYS["minute"], _chat(max_tokens=1))
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "rate_limiter_unavailable"
        assert refused.headers["retry-after"] == "1"
        # Open: served, but the key's 3 per minute still hold inside this process.
        codes = [_post(opened, KEYS["minute"], _chat(max_tokens=1)).status_code for _ in range(5)]
        assert codes == [200, 200, 200, 429, 429]
        # Cache reads fail as misses: answers still flow.
        assert _post(opened, KEYS["x"], _chat(temperature=0, max_tokens=2)).status_code == 200
        # The outage is logged once per process, not per request.
        text = opened.output_containing("unreachable")
        assert text.count("rate-limit store unreachable") == 1
        server.start()
        wait_until(lambda: _post(closed, KEYS["x"], _chat(max_tokens=1)).status_code == 200, timeout=10)
        # Back on the shared store: the minute key starts afresh there (the server restarted
        # empty). The open gateway asks Redis again once its retry interval is over; until
        # then its own limiter, spent above, keeps refusing, so a 200 can only come from Redis.
        wait_until(lambda: _post(opened, KEYS["minute"], _chat(max_tokens=1)).status_code == 200, timeout=10)
        assert "rate-limit store" in opened.output_containing("reachable again", timeout=10)
    finally:
        closed.stop()
        opened.stop()
