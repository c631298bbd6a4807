"""The gateway's Prometheus ``/metrics`` and its JSON access log, through a real gateway
process driven by the official OpenAI SDK."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shuniu.plugins.auth.api_keys import hash_key, new_key
from tests.conftest import start_gateway, wait_until

KEY = new_key()

DEPLOYMENT = f"""
gateway:
  access_log: {{path: access.jsonl}}
tiers:
  gold: {{}}
auth:
  authenticators:
    - kind: api_keys
      options:
        keys: [{{id: k1, hash: "{hash_key(KEY)}", tenant: acme, tier: gold}}]
cache: {{store: memory}}
models:
  chat:
    aliases: [chat-alias]
    health: {{interval_s: 0.05}}
    load: {{interval_s: 0.05}}
    endpoints:
      - kind: sim
        replicas: 2
        options: {{ttft_ms: 30, tokens_per_s: 400, output_tokens_min: 5, output_tokens_max: 9}}
"""


def _samples(gw) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[no-untyped-def]
    text = httpx.get(f"{gw.url}/metrics", timeout=30).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples, name: str, **labels: str) -> float:  # type: ignore[no-untyped-def]
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


@pytest.fixture(scope="module")
def gw(tmp_path_factory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp("metrics")
    gw = start_gateway(DEPLOYMENT, tmp)
    gw.tmp = tmp
    yield gw
    gw.stop()


def test_requests_tokens_and_latencies_are_counted(gw) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    before = _samples(gw)
    usage = []
    for i in range(3):
        chunks = list(
            client.chat.completions.create(
                model="chat-alias",
                messages=[{"role": "user", "content": f"count me {i}"}],
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        usage.append(chunks[-1].usage)
    reply = client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "plain"}])
    usage.append(reply.usage)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    after = _samples(gw)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert delta("shuniu_requests_total", model="chat", status="200", outcome="ok", tier="gold") == 4
    # An unknown model is counted without a model label (client strings never become labels).
    assert delta("shuniu_requests_total", model="", status="404", code="model_not_found") == 1
    assert delta("shuniu_prompt_tokens_total", model="chat") == sum(u.prompt_tokens for u in usage)
    assert delta("shuniu_completion_tokens_total", model="chat") == sum(u.completion_tokens for u in usage)
    assert delta("shuniu_time_to_first_token_seconds_count", model="chat") == 3
    assert delta("shuniu_request_duration_seconds_count", model="chat", stream="true") == 3
    assert delta("shuniu_request_duration_seconds_count", model="chat", stream="false") == 1
    assert delta("shuniu_inter_token_latency_seconds_count", model="chat") == 3
    assert delta("shuniu_queue_wait_seconds_count", model="chat") == 4
    # The engine's TTFT is 30 ms: no first token can come sooner.
    ttft_fast = delta("shuniu_time_to_first_token_seconds_bucket", model="chat", le="0.025")
    assert ttft_fast == 0
    assert delta("shuniu_endpoint_completed_total", model="chat") == 4


def test_live_state_cache_and_hardware(gw) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    ask = {"model": "chat", "messages": [{"role": "user", "content": "same"}], "temperature": 0}
    client.chat.completions.create(**ask)
    client.chat.completions.create(**ask)
    s = _samples(gw)
    assert _value(s, "shuniu_cache_hits_total") >= 1 and _value(s, "shuniu_cache_misses_total") >= 1
    assert _value(s, "shuniu_cached_tokens_total", model="chat") > 0
    assert _value(s, "shuniu_endpoint_healthy", model="chat") == 2
    assert (
        "shuniu_build_info",
        (("version", __import__("shuniu.core.version").core.version.__version__),),
    ) in s
    assert _value(s, "shuniu_device_memory_total_bytes", kind="cpu") > 0
    # Engine load (the sim reports its KV use) arrives through the load poll.
    wait_until(lambda: _value(_samples(gw), "shuniu_engine_prefix_cache_queries_total", model="chat") > 0)


def test_in_flight_gauge_follows_a_running_stream(gw) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    stream = client.chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "long"}],
        max_tokens=2000,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))
    assert _value(_samples(gw), "shuniu_in_flight_requests", model="chat") == 1
    stream.close()
    wait_until(lambda: _value(_samples(gw), "shuniu_in_flight_requests", model="chat") == 0)


def test_access_log_has_one_json_line_per_request_without_prompts_or_keys(gw) -> None:  # type: ignore[no-untyped-def]
    client = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0)
    marker = "secret-prompt-text-42"
    client.chat.completions.create(model="chat", messages=[{"role": "user", "content": marker}], max_tokens=3)
    path = Path(gw.tmp) / "access.jsonl"

    def lines() -> list[dict]:  # type: ignore[type-arg]
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    entries = wait_until(lambda: [e for e in lines() if e["completion_tokens"] == 3 and e["status"] == 200])
    e = entries[-1]
    assert e["tenant"] == "acme" and e["key_id"] == "k1" and e["tier"] == "gold"
    assert e["pool"] == "chat" and e["endpoint"].startswith("chat-") and e["outcome"] == "ok"
    assert e["ttft_ms"] > 0 and e["duration_ms"] >= e["ttft_ms"] and "queue_ms" in e
    text = path.read_text()
    assert marker not in text and KEY not in text
    httpx.post(
        f"{gw.base_url}/chat/completions", json={"model": "chat"}, headers={"authorization": f"Bearer {KEY}"}
    )
    wait_until(lambda: any(x["status"] == 400 and x["error_code"] for x in lines()))


def test_prompts_only_when_asked(tmp_path: Path) -> None:
    config = """
gateway:
  access_log: {path: a.jsonl, include_prompt: true}
  metrics: false
models:
  m:
    endpoints: [{kind: sim, options: {ttft_ms: 0, tokens_per_s: 0}}]
"""
    gw = start_gateway(config, tmp_path)
    try:
        openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "tell the log"}], max_tokens=2
        )
        log = tmp_path / "a.jsonl"
        entry = wait_until(
            lambda: log.exists() and log.read_text().strip() and json.loads(log.read_text().splitlines()[0])
        )
        assert "tell the log" in entry["prompt"]
        assert httpx.get(f"{gw.url}/metrics").status_code == 404  # metrics: false
    finally:
        gw.stop()
