"""The admin API through a real gateway process: admin keys, traffic weights, drain, adding
and removing endpoints, and a rolling update from v1 to v2 under load without a failure."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import openai

from shuniu.plugins.auth.api_keys import hash_key, new_key
from tests.conftest import GatewayProcess, wait_until

ADMIN = new_key()

DEPLOYMENT = f"""
gateway:
  admin_keys: ["{hash_key(ADMIN)}"]
models:
  chat:
    health: {{interval_s: 0.05}}
    traffic: {{v1: 100}}
    endpoints:
      - {{kind: sim, name: a, replicas: 2, version: v1, options: {{ttft_ms: 5, tokens_per_s: 400}}}}
"""


def _admin(gw: GatewayProcess, method: str, path: str, key: str | None = ADMIN, **kw: Any) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    return httpx.request(method, f"{gw.url}{path}", headers=headers, timeout=30, **kw)


def _endpoints(gw: GatewayProcess) -> dict[str, dict[str, Any]]:
    state = _admin(gw, "GET", "/admin/state").json()
    return {e["name"]: e for e in state["models"]["chat"]["endpoints"]}


def test_admin_api_needs_an_admin_key(gateway_factory, gateway) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(DEPLOYMENT)
    assert _admin(gw, "GET", "/admin/state", key=None).status_code == 401
    wrong = _admin(gw, "GET", "/admin/state", key=new_key())
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "not_admin"
    assert ADMIN not in wrong.text
    ok = _admin(gw, "GET", "/admin/state")
    assert ok.status_code == 200 and ok.json()["models"]["chat"]["traffic"] == {"v1": 100.0}
    # A gateway without admin keys has the API off.
    off = _admin(gateway, "GET", "/admin/state")
    assert off.status_code == 403 and off.json()["error"]["code"] == "admin_disabled"


def test_bad_admin_requests_are_clear_errors(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(DEPLOYMENT)
    r = _admin(gw, "PUT", "/admin/models/chat/traffic", json={"weights": {"v9": 1}})
    assert r.status_code == 400 and "v9" in r.json()["error"]["message"]
    r = _admin(gw, "PUT", "/admin/models/chat/traffic", json={"nope": 1})
    assert r.status_code == 400
    r = _admin(gw, "PUT", "/admin/models/ghost/traffic", json={"weights": {}})
    assert r.status_code == 404
    r = _admin(gw, "DELETE", "/admin/endpoints/a-0")
    assert r.status_code == 409 and r.json()["error"]["code"] == "not_drained"
    r = _admin(gw, "POST", "/admin/models/chat/endpoints", json={"kind": "simm", "name": "x"})
    assert r.status_code == 400 and "simm" in r.json()["error"]["message"]
    r = _admin(gw, "POST", "/admin/models/chat/endpoints", json={"kind": "sim", "name": "a-0"})
    assert r.status_code == 400 and "exists" in r.json()["error"]["message"]
    r = _admin(
        gw,
        "POST",
        "/admin/models/chat/endpoints",
        json={"kind": "sim", "name": "y", "launch": {"command": ["x"]}},
    )
    assert r.status_code == 400 and "launch" in r.json()["error"]["message"]
    r = _admin(
        gw,
        "POST",
        "/admin/models/chat/endpoints",
        json={"kind": "sim", "name": "z", "options": {"ttft_ms": -1}},
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("options.ttft_ms")
    r = _admin(gw, "POST", "/admin/endpoints/nope/drain")
    assert r.status_code == 404


def test_rolling_update_from_v1_to_v2_under_load_fails_no_request(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(DEPLOYMENT)
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)
    stop = threading.Event()
    results: list[str] = []

    def load(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                if n % 2:
                    chunks = list(
                        client.chat.completions.create(
                            model="chat",
                            messages=[{"role": "user", "content": f"{i}-{n}"}],
                            max_tokens=12,
                            stream=True,
                        )
                    )
                    results.append("ok" if chunks else "empty")
                else:
                    client.chat.completions.create(
                        model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=6
                    )
                    results.append("ok")
            except Exception as exc:  # every failure is counted, none hidden
                results.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=load, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        wait_until(lambda: len(results) >= 20, timeout=30)
        for name in ("b-0", "b-1"):
            r = _admin(
                gw,
                "POST",
                "/admin/models/chat/endpoints",
                json={
                    "kind": "sim",
                    "name": name,
                    "version": "v2",
                    "options": {"ttft_ms": 5, "tokens_per_s": 400},
                },
            )
            assert r.status_code == 201, r.text
        wait_until(lambda: all(_endpoints(gw)[n]["healthy"] for n in ("b-0", "b-1")), timeout=10)
        for weights in ({"v1": 50, "v2": 50}, {"v2": 100}):
            assert (
                _admin(gw, "PUT", "/admin/models/chat/traffic", json={"weights": weights}).status_code == 200
            )
            seen = len(results)
            wait_until(lambda seen=seen: len(results) >= seen + 20, timeout=30)
        assert sum(_endpoints(gw)[n]["completed"] for n in ("b-0", "b-1")) > 0
        for name in ("a-0", "a-1"):
            r = _admin(gw, "POST", f"/admin/endpoints/{name}/drain")
            assert r.status_code == 200 and r.json()["draining"]
        wait_until(lambda: all(_endpoints(gw)[n]["in_flight"] == 0 for n in ("a-0", "a-1")), timeout=30)
        for name in ("a-0", "a-1"):
            assert _admin(gw, "DELETE", f"/admin/endpoints/{name}").status_code == 200
        assert set(_endpoints(gw)) == {"b-0", "b-1"}
        seen = len(results)
        wait_until(lambda: len(results) >= seen + 20, timeout=30)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    failures = [r for r in results if r != "ok"]
    print(
        f"\nRESILIENCE rolling update v1->v2: {len(results)} requests in {time.monotonic() - t0:.1f} s, "
        f"{len(failures)} failed"
    )
    assert failures == []
    # v1 endpoints are gone; every answer now comes from v2.
    before = sum(e["completed"] for e in _endpoints(gw).values())
    client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "after"}], max_tokens=2
    )
    assert sum(e["completed"] for e in _endpoints(gw).values()) == before + 1
