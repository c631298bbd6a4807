"""API keys, tiers, request limits, rate limits and the response cache through a real
gateway process (in-process stores), with the official OpenAI SDK as the client."""

from __future__ import annotations

import concurrent.futures
import json
import threading

import httpx
import openai
import pytest

from shuniu.plugins.auth.api_keys import hash_key, new_key
from tests.conftest import wait_until

KEYS = {name: new_key() for name in ("free", "pro", "pro2", "other", "limited", "busy")}
ADMIN_KEY = new_key()

DEPLOYMENT = f"""
gateway:
  max_messages: 4
  max_header_bytes: 4096
  admin_keys: ["{hash_key(ADMIN_KEY)}"]
tiers:
  free:
    priority: 5
    models: [chat]
    max_tokens_default: 3
    max_tokens_limit: 50
    max_prompt_tokens: 200
  pro:
    priority: 0
    key_limits: {{tpm: 400}}
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - {{id: free-1, hash: "{hash_key(KEYS["free"])}", tenant: acme, tier: free}}
          - {{id: pro-1, hash: "{hash_key(KEYS["pro"])}", tenant: acme, tier: pro}}
          - {{id: pro-2, hash: "{hash_key(KEYS["pro2"])}", tenant: acme, tier: pro}}
          - {{id: other-1, hash: "{hash_key(KEYS["other"])}", tenant: globex, tier: pro}}
          - {{id: lim-1, hash: "{hash_key(KEYS["limited"])}", tenant: initech, tier: pro, limits: {{rpm: 3}}}}
          - {{id: busy-1, hash: "{hash_key(KEYS["busy"])}", tenant: umbrella, tier: pro,
              limits: {{concurrency: 1}}}}
cache:
  store: memory
  ttl_s: 600
models:
  chat:
    health: {{interval_s: 0.05}}
    endpoints:
      - kind: sim
        replicas: 2
        options: {{ttft_ms: 0, tokens_per_s: 0, output_tokens_min: 8, output_tokens_max: 40}}
  slow:
    health: {{interval_s: 0.05}}
    endpoints:
      - {{kind: sim, replicas: 2, options: {{ttft_ms: 400, tokens_per_s: 200}}}}
"""


@pytest.fixture(scope="module")
def gw(tmp_path_factory):  # type: ignore[no-untyped-def]
    from tests.conftest import start_gateway

    gw = start_gateway(DEPLOYMENT, tmp_path_factory.mktemp("tenancy"), args=("--log-level", "debug"))
    yield gw
    gw.stop()


def _client(gw, key: str) -> openai.OpenAI:  # type: ignore[no-untyped-def]
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0, timeout=30)


def _post(gw, key: str | None, body: dict, **headers: str) -> httpx.Response:  # type: ignore[no-untyped-def,type-arg]
    h = dict(headers)
    if key is not None:
        h["authorization"] = f"Bearer {key}"
    return httpx.post(f"{gw.base_url}/chat/completions", json=body, headers=h, timeout=30)


def _chat(model: str = "chat", content: str = "hi", **extra: object) -> dict:  # type: ignore[type-arg]
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def _completed(gw, model: str) -> int:  # type: ignore[no-untyped-def]
    ready = httpx.get(f"{gw.url}/ready", timeout=5).json()
    return sum(e["completed"] for e in ready["models"][model]["endpoints"])


# -- authentication -------------------------------------------------------------------------


def test_requests_without_a_valid_key_are_refused_and_keys_never_logged(gw) -> None:  # type: ignore[no-untyped-def]
    r = _post(gw, None, _chat())
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "missing_api_key"
    assert r.headers["www-authenticate"].startswith("Bearer")
    wrong = new_key()
    r = _post(gw, wrong, _chat())
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert wrong not in r.text
    with pytest.raises(openai.AuthenticationError):
        _client(gw, wrong).chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}])
    reply = _client(gw, KEYS["pro"]).chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=5
    )
    assert reply.choices[0].message.content is not None
    # Served and refused, at debug level: no key in the gateway's output.
    output = "".join(gw.output)
    for key in [*KEYS.values(), wrong]:
        assert key not in output


def test_tier_models_max_tokens_and_prompt_limits(gw) -> None:  # type: ignore[no-untyped-def]
    free = KEYS["free"]
    r = _post(gw, free, _chat(model="slow"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    # The tier's default max_tokens reaches the engine.
    for _ in range(5):
        r = _post(gw, free, _chat(ignore_eos=True))
        assert r.status_code == 200
        assert r.json()["usage"]["completion_tokens"] == 3
    r = _post(gw, free, _chat(max_tokens=51))
    assert r.status_code == 400 and r.json()["error"]["code"] == "max_tokens_exceeded"
    assert r.json()["error"]["param"] == "max_tokens"
    r = _post(gw, free, _chat(content="word " * 400))
    assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_long"
    # pro has no such limits.
    assert _post(gw, KEYS["pro"], _chat(model="slow", max_tokens=2)).status_code == 200


def test_request_size_limits(gw) -> None:  # type: ignore[no-untyped-def]
    key = KEYS["pro"]
    body = {"model": "chat", "messages": [{"role": "user", "content": "x"}] * 5}
    r = _post(gw, key, body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_messages"
    r = _post(gw, key, _chat(), **{"x-padding": "p" * 5000})
    assert r.status_code == 431 and r.json()["error"]["code"] == "headers_too_large"


# -- rate limits ----------------------------------------------------------------------------


def test_rpm_limit_refuses_with_retry_after_and_openai_headers(gw) -> None:  # type: ignore[no-untyped-def]
    key = KEYS["limited"]
    seen = []
    for _ in range(3):
        r = _post(gw, key, _chat(max_tokens=2))
        assert r.status_code == 200
        seen.append(int(r.headers["x-ratelimit-remaining-requests"]))
        assert r.headers["x-ratelimit-limit-requests"] == "3"
    assert seen == [2, 1, 0]
    r = _post(gw, key, _chat(max_tokens=2))
    assert r.status_code == 429
    err = r.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
    assert "requests per minute" in err["message"]
    assert 1 <= int(r.headers["retry-after"]) <= 20  # one request refills in 60/3 s
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(openai.RateLimitError):
        _client(gw, key).chat.completions.create(model="chat", messages=[{"role": "user", "content": "x"}])


def test_tpm_reserves_prompt_plus_max_tokens_and_settles_with_usage(gw) -> None:  # type: ignore[no-untyped-def]
    key = KEYS["pro2"]  # tier pro: 400 tokens per minute per key
    r = _post(gw, key, _chat(max_tokens=500))
    assert r.status_code == 429 and "Request too large" in r.json()["error"]["message"]
    assert r.json()["error"]["type"] == "tokens"
    # Reserving 300 leaves ~100; after settling with the real (much smaller) usage, the
    # unused reservation is back.
    r = _post(gw, key, _chat(max_tokens=290, ignore_eos=False))
    assert r.status_code == 200
    used = r.json()["usage"]["total_tokens"]
    remaining_after_settle = _post(gw, key, _chat(max_tokens=1))
    assert remaining_after_settle.status_code == 200
    left = int(remaining_after_settle.headers["x-ratelimit-remaining-tokens"])
    # This request reserved prompt+1 tokens; before it, about 400 - used were left.
    second_cost = remaining_after_settle.json()["usage"]["prompt_tokens"] + 1
    assert 400 - used - second_cost - 2 <= left <= 400 - used - second_cost + 2


def test_concurrency_limit(gw) -> None:  # type: ignore[no-untyped-def]
    client = _client(gw, KEYS["busy"])
    hold = client.chat.completions.create(
        model="slow",
        messages=[{"role": "user", "content": "hold"}],
        max_tokens=300,  # within the tier's 400 tokens per minute; 1.5 s at 200 tokens/s
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(hold))
    r = _post(gw, KEYS["busy"], _chat(max_tokens=2))
    assert r.status_code == 429 and "concurrent" in r.json()["error"]["message"]
    hold.close()
    wait_until(lambda: _post(gw, KEYS["busy"], _chat(max_tokens=2)).status_code == 200, timeout=10)


# -- the response cache ---------------------------------------------------------------------


def test_deterministic_answers_are_cached_per_tenant_and_replayed_as_sse(gw) -> None:  # type: ignore[no-untyped-def]
    body = _chat(content="cache me please", temperature=0, max_tokens=12)
    first = _post(gw, KEYS["pro"], body)
    assert first.status_code == 200 and first.headers["x-shuniu-cache"] == "miss"
    second = _post(gw, KEYS["pro2"], body)  # same tenant, another key
    assert second.headers["x-shuniu-cache"] == "hit"
    a, b = first.json(), second.json()
    assert b["choices"][0]["message"]["content"] == a["choices"][0]["message"]["content"]
    assert b["usage"] == a["usage"] and b["id"] != a["id"]
    # Another tenant, same prompt: never the first tenant's answer.
    other = _post(gw, KEYS["other"], body)
    assert other.headers["x-shuniu-cache"] == "miss"
    # A streamed request with the same content gets the answer as SSE, framed as a live stream.
    stream = _client(gw, KEYS["pro"]).chat.completions.with_raw_response.create(
        **body, stream=True, stream_options={"include_usage": True}
    )
    assert stream.headers["x-shuniu-cache"] == "hit"
    chunks = list(stream.parse())
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == a["choices"][0]["message"]["content"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == a["choices"][0]["finish_reason"]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == a["usage"]["total_tokens"]
    # Other sampling parameters, a system prompt or a knowledge-base version: other entries.
    for changed in (
        {**body, "max_tokens": 13},
        {**body, "messages": [{"role": "system", "content": "be brief"}, *body["messages"]]},
    ):
        assert _post(gw, KEYS["pro"], changed).headers["x-shuniu-cache"] == "miss"
    kb = _post(gw, KEYS["pro"], body, **{"x-shuniu-kb-version": "2"})
    assert kb.headers["x-shuniu-cache"] == "miss"


def test_non_deterministic_requests_and_bypass_header(gw) -> None:  # type: ignore[no-untyped-def]
    body = _chat(content="random please", max_tokens=4)
    assert _post(gw, KEYS["pro"], body).headers["x-shuniu-cache"] == "skip"
    det = {**body, "seed": 7}
    assert _post(gw, KEYS["pro"], det).headers["x-shuniu-cache"] == "miss"
    assert _post(gw, KEYS["pro"], det, **{"cache-control": "no-cache"}).headers["x-shuniu-cache"] == "bypass"
    assert _post(gw, KEYS["pro"], det).headers["x-shuniu-cache"] == "hit"


def test_concurrent_identical_misses_go_upstream_once(gw) -> None:  # type: ignore[no-untyped-def]
    before = _completed(gw, "slow")
    body = _chat(model="slow", content="single flight", temperature=0, max_tokens=8)
    barrier = threading.Barrier(8)

    def ask() -> httpx.Response:
        barrier.wait()
        return _post(gw, KEYS["pro"], body)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: ask(), range(8)))
    assert all(r.status_code == 200 for r in replies)
    texts = {json.dumps(r.json()["choices"][0]["message"]) for r in replies}
    assert len(texts) == 1
    states = sorted(r.headers["x-shuniu-cache"] for r in replies)
    assert states.count("miss") == 1 and states.count("hit") == 7
    assert _completed(gw, "slow") - before == 1


def test_admin_hardware_needs_an_admin_key(gw) -> None:  # type: ignore[no-untyped-def]
    """The hardware readings (device names, UUIDs, bus ids) are for admins, not tenants."""
    assert httpx.get(f"{gw.url}/admin/hardware", timeout=10).status_code == 401
    r = httpx.get(f"{gw.url}/admin/hardware", headers={"authorization": f"Bearer {KEYS['pro']}"}, timeout=30)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "not_admin")
    r = httpx.get(f"{gw.url}/admin/hardware", headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    assert r.status_code == 200
    probes = {p["probe"]: p for p in r.json()["probes"]}
    assert probes["cpu"]["available"] and probes["cpu"]["devices"][0]["memory_total_bytes"] > 0
    assert not probes["nvidia"]["available"] and probes["nvidia"]["reason"]


def test_admin_hardware_is_off_on_a_gateway_without_admin_keys(gateway) -> None:  # type: ignore[no-untyped-def]
    r = httpx.get(f"{gateway.url}/admin/hardware", timeout=30)
    assert (r.status_code, r.json()["error"]["code"]) == (403, "admin_disabled")


JWT_DEPLOYMENT = f"""
tiers:
  gold: {{key_limits: {{rpm: 2}}}}
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - {{id: k, hash: "{hash_key(KEYS["pro"])}", tenant: acme}}
    - kind: jwt
      options:
        algorithms: [HS256]
        issuer: https://id.example.test
        audience: shuniu
        secret: ${{JWT_SECRET}}
        tier_claim: plan
models:
  chat:
    endpoints:
      - {{kind: sim, options: {{ttft_ms: 0, tokens_per_s: 0}}}}
"""


def test_jwt_through_the_gateway_after_api_keys(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    import time

    import jwt

    secret = "s" * 40
    gw = gateway_factory(JWT_DEPLOYMENT, env={"JWT_SECRET": secret})
    now = int(time.time())
    claims = {
        "iss": "https://id.example.test",
        "aud": "shuniu",
        "sub": "svc-7",
        "tenant": "acme",
        "plan": "gold",
    }
    good = jwt.encode({**claims, "exp": now + 300}, secret, algorithm="HS256")
    r = _post(gw, good, _chat(max_tokens=2))
    assert r.status_code == 200
    assert r.headers["x-ratelimit-limit-requests"] == "2"  # the gold tier came from the claim
    assert _post(gw, KEYS["pro"], _chat(max_tokens=2)).status_code == 200  # the API key still works
    refused = {
        "expired": jwt.encode({**claims, "exp": now - 600}, secret, algorithm="HS256"),
        "audience": jwt.encode({**claims, "aud": "other", "exp": now + 300}, secret, algorithm="HS256"),
        "signature": jwt.encode({**claims, "exp": now + 300}, "t" * 40, algorithm="HS256"),
        "alg none": jwt.encode({**claims, "exp": now + 300}, None, algorithm="none"),  # type: ignore[arg-type]
    }
    for what, token in refused.items():
        r = _post(gw, token, _chat(max_tokens=2))
        assert r.status_code == 401, what
        assert token not in r.text and secret not in r.text
    unknown_tier = jwt.encode({**claims, "plan": "platinum", "exp": now + 300}, secret, algorithm="HS256")
    r = _post(gw, unknown_tier, _chat(max_tokens=2))
    assert r.status_code == 403 and r.json()["error"]["code"] == "unknown_tier"
    output = "".join(gw.output)
    assert secret not in output and good not in output
