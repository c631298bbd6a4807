"""Per-tier overload degradation through a real gateway process: a flood makes the free
tier's answers shorter (or sheds it) while premium is untouched, and it recovers by itself."""

from __future__ import annotations

import concurrent.futures
import time

import httpx

from tests.conftest import GatewayProcess, wait_until

DEPLOYMENT = """
gateway: {identity_headers: true}
tiers:
  premium: {priority: 0}
  free:
    priority: 5
    degrade: {queue_wait_s: 0.15, max_tokens: 4, half_life_s: 2}
  bulk:
    priority: 9
    degrade: {queue_wait_s: 0.15, shed: true, half_life_s: 2}
models:
  chat:
    health: {interval_s: 0.05}
    load: {adaptive_concurrency: false}
    endpoints:
      - {kind: sim, max_concurrency: 2, options: {ttft_ms: 5, tokens_per_s: 200}}
"""


def _ask(gw: GatewayProcess, tier: str, max_tokens: int = 60) -> httpx.Response:
    return httpx.post(
        f"{gw.base_url}/chat/completions",
        json={
            "model": "chat",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
        },
        headers={"x-shuniu-tier": tier, "x-shuniu-tenant": tier},
        timeout=60,
    )


def _metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    total = 0.0
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_flood_degrades_lower_tiers_keeps_premium_and_recovers(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(DEPLOYMENT)
    # Quiet: nothing is degraded.
    r = _ask(gw, "free", 5)
    assert r.status_code == 200 and "x-shuniu-degraded" not in r.headers
    # A premium flood (each request ~0.3 s on one of 2 slots): the queue wait grows.
    with concurrent.futures.ThreadPoolExecutor(16) as ex:
        flood = [ex.submit(_ask, gw, "premium") for _ in range(64)]
        free = wait_until(
            lambda: (x := _ask(gw, "free")).headers.get("x-shuniu-degraded") == "max_tokens=4" and x,
            timeout=30,
        )
        bulk = _ask(gw, "bulk")
        premium = [f.result() for f in flood]
    assert free.json()["usage"]["completion_tokens"] == 4
    assert bulk.status_code == 503 and bulk.json()["error"]["code"] == "overloaded"
    assert bulk.headers["x-shuniu-degraded"] == "shed" and int(bulk.headers["retry-after"]) >= 1
    # Premium is never degraded: every answer is whole.
    assert all(p.status_code == 200 and "x-shuniu-degraded" not in p.headers for p in premium)
    assert all(p.json()["usage"]["completion_tokens"] == 60 for p in premium)
    assert _metric(gw, "shuniu_degraded_requests_total", tier="free", action="max_tokens") >= 1
    assert _metric(gw, "shuniu_degraded_requests_total", tier="bulk", action="shed") >= 1
    # The flood is over: the signals fade and the tiers recover by themselves.
    t0 = time.monotonic()
    wait_until(lambda: "x-shuniu-degraded" not in _ask(gw, "free", 5).headers, timeout=30)
    print(
        "\nRESILIENCE degradation: free capped and bulk shed under a premium flood; "
        f"recovered {time.monotonic() - t0:.1f} s after"
    )
    assert _ask(gw, "bulk", 5).status_code == 200
