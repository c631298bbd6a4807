"""Faults injected into simulated engines behind a real gateway process: a crash, a hang, a
50% error rate, a dead pool with a fallback, a stalled stream. Each scenario prints its
numbers (sent, succeeded, failed, retried, time to eject)."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import GatewayProcess, wait_until
from tests.test_openai_backend import ScriptedUpstream


def _ready(gw: GatewayProcess) -> dict[str, Any]:
    return httpx.get(f"{gw.url}/ready", timeout=10).json()  # type: ignore[no-any-return]


def _endpoint(gw: GatewayProcess, model: str, name: str) -> dict[str, Any]:
    for e in _ready(gw)["models"][model]["endpoints"]:
        if e["name"] == name:
            return e  # type: ignore[no-any-return]
    raise KeyError(name)


def _retries(gw: GatewayProcess) -> float:
    total = 0.0
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("shuniu_retries_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _gave_up(gw: GatewayProcess) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("shuniu_retries_gave_up_total"):
            why = line.split('why="', 1)[1].split('"', 1)[0]
            out[why] = out.get(why, 0) + int(float(line.rsplit(" ", 1)[1]))
    return out


def _load(
    gw: GatewayProcess, n: int, workers: int = 8, *, stream: bool = False, **body: Any
) -> dict[str, int]:
    """``n`` requests, ``workers`` at a time: outcome counts."""
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0, timeout=30)

    def one(i: int) -> str:
        try:
            if stream:
                chunks = list(
                    client.chat.completions.create(
                        model="chat", messages=[{"role": "user", "content": f"r{i}"}], stream=True, **body
                    )
                )
                return "ok" if chunks else "empty"
            client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": f"r{i}"}], **body
            )
            return "ok"
        except openai.APIStatusError as exc:
            return f"http {exc.status_code}"
        except openai.APIError as exc:  # an SSE error event after the first byte
            return f"stream error: {str(exc)[:40]}"

    counts: dict[str, int] = {}
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        for outcome in ex.map(one, range(n)):
            counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def _report(name: str, sent: int, counts: dict[str, int], retried: float, eject_s: float | None) -> None:
    row = {
        "scenario": name,
        "sent": sent,
        "succeeded": counts.get("ok", 0),
        "failed": {k: v for k, v in counts.items() if k != "ok"},
        "retried": int(retried),
        "time_to_eject_s": None if eject_s is None else round(eject_s, 2),
    }
    print("\nRESILIENCE " + json.dumps(row))


def test_a_crashed_endpoint_costs_no_request_that_had_not_started(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        """
models:
  chat:
    health: {interval_s: 0.2, unhealthy_after: 100}
    retries: {min_retries: 8}  # all 8 concurrent requests may fail on "doomed" together
    outlier: {consecutive_failures: 3, base_ejection_s: 30}
    endpoints:
      - {kind: sim, name: good, replicas: 2, options: {ttft_ms: 5, tokens_per_s: 2000}}
      - kind: sim
        name: doomed
        options: {ttft_ms: 5, tokens_per_s: 2000, faults: {crash_after_requests: 5}}
"""
    )
    t0 = time.monotonic()
    counts = _load(gw, 120, max_tokens=8)
    doomed = _endpoint(gw, "chat", "doomed")
    retried = _retries(gw)
    eject_s = time.monotonic() - t0 if doomed["ejected"] else None
    _report("crash 1 of 3 (non-streamed)", 120, counts, retried, eject_s)
    # Non-streamed: nothing had reached the client, so every request must succeed.
    assert counts == {"ok": 120}
    assert doomed["ejected"] and doomed["ejections"] == 1
    assert retried >= 1
    # At most the configured 3 failures before ejection (plus those already in flight).
    assert doomed["errors"] <= 3 + 8


def test_a_hung_endpoint_times_out_is_ejected_and_requests_succeed_elsewhere(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        """
models:
  chat:
    health: {interval_s: 0.2, timeout_s: 0.2, unhealthy_after: 1000}
    timeouts: {ttft_s: 0.3}
    # Up to all 6 concurrent requests can be hanging on "stuck" when their TTFT limit
    # fires together; the budget must let every one retry (its default floor is 3 retries
    # in flight, which would send the 4th its 504: shuniu_retries_gave_up{why="budget"}).
    retries: {min_retries: 6}
    outlier: {consecutive_failures: 2, base_ejection_s: 30}
    endpoints:
      - {kind: sim, name: good, replicas: 2, options: {ttft_ms: 5, tokens_per_s: 2000}}
      - kind: sim
        name: stuck
        options: {ttft_ms: 5, tokens_per_s: 2000, faults: {hang_after_requests: 2}}
"""
    )
    t0 = time.monotonic()
    counts = _load(gw, 60, workers=6, stream=True, max_tokens=8)
    stuck = _endpoint(gw, "chat", "stuck")
    _report("hang 1 of 3 (streamed, ttft 0.3 s)", 60, counts, _retries(gw), time.monotonic() - t0)
    assert counts == {"ok": 60}
    assert stuck["ejected"]
    assert _retries(gw) >= 2


def test_half_failing_endpoint_traffic_shifts_and_errors_stay_within_budget(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        """
models:
  chat:
    health: {interval_s: 0.2}
    outlier:
      {consecutive_failures: null, failure_rate: 0.4, min_requests: 10, window_s: 5, base_ejection_s: 30}
    endpoints:
      - {kind: sim, name: good, replicas: 2, options: {ttft_ms: 2, tokens_per_s: 5000}}
      - kind: sim
        name: flaky
        options: {ttft_ms: 2, tokens_per_s: 5000, faults: {error_rate: 0.5, seed: 3}}
"""
    )
    counts = _load(gw, 200, workers=8, max_tokens=4)
    flaky = _endpoint(gw, "chat", "flaky")
    _report("50% errors on 1 of 3", 200, counts, _retries(gw), None)
    assert counts.get("ok", 0) == 200  # every failure was retried elsewhere
    assert flaky["ejected"]
    good = sum(
        e["completed"] for e in _ready(gw)["models"]["chat"]["endpoints"] if e["name"].startswith("good")
    )
    assert good > flaky["completed"] * 3  # traffic moved away


def test_a_dead_pool_falls_back_to_another_model(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        """
models:
  chat:
    retries: {max_retries: 1, fallback: small}
    outlier: {consecutive_failures: null, failure_rate: null}
    endpoints:
      - {kind: sim, name: dead, options: {ttft_ms: 0, faults: {error_rate: 1.0}}}
  small:
    endpoints:
      - {kind: sim, name: small, options: {ttft_ms: 0, tokens_per_s: 0}}
"""
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert reply.model == "chat"  # the client's name, answered by the fallback pool
    assert _endpoint(gw, "small", "small")["completed"] == 1
    assert _endpoint(gw, "chat", "dead")["errors"] == 1


@pytest.mark.parametrize(
    ("retries", "why"),
    [("{max_retries: 0}", "max_retries"), ("{min_retries: 0, budget_ratio: 0}", "budget")],
    ids=["no retries", "spent budget"],
)
def test_an_error_that_is_not_retried_reaches_the_client_and_says_why(  # type: ignore[no-untyped-def]
    gateway_factory, retries: str, why: str
) -> None:
    gw = gateway_factory(
        f"""
models:
  chat:
    retries: {retries}
    endpoints:
      - {{kind: sim, name: dead, options: {{ttft_ms: 0, faults: {{error_rate: 1.0}}}}}}
      - {{kind: sim, name: fine, options: {{ttft_ms: 0}}}}
"""
    )
    counts = _load(gw, 20, workers=1, max_tokens=2)
    assert counts.get("http 502", 0) >= 1 and _retries(gw) == 0
    assert _gave_up(gw) == {why: counts["http 502"]}


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    up = ScriptedUpstream().start()
    yield up
    up.stop()


def test_a_stalled_stream_ends_with_an_idle_timeout_event(
    gateway_factory, upstream: ScriptedUpstream
) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        f"""
models:
  chat:
    timeouts: {{idle_s: 0.005}}
    endpoints:
      - kind: openai
        options: {{base_url: "http://127.0.0.1:{upstream.port}/v1", model: up-model}}
"""
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    # "slow" streams 500 chunks 20 ms apart: the first gap is past the 5 ms idle limit.
    stream = client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": "slow"}], stream=True
    )
    with pytest.raises(openai.APIError, match="sent nothing"):
        list(stream)
    wait_until(lambda: upstream.aborted == 1)  # the engine call was cancelled
    assert upstream.finished == 0


def test_total_timeout_before_the_first_byte_is_504(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        """
models:
  chat:
    timeouts: {total_s: 0.2}
    retries: {max_retries: 0}
    endpoints:
      - {kind: sim, options: {ttft_ms: 2000}}
"""
    )
    r = httpx.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "x"}]},
        timeout=10,
    )
    assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"


def test_the_generation_probe_catches_an_engine_whose_health_route_still_answers(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(
        """
models:
  chat:
    health: {interval_s: 0.05, unhealthy_after: 2, generation_every: 1, generation_timeout_s: 0.2}
    endpoints:
      - {kind: sim, name: ok, options: {ttft_ms: 0}}
      - kind: sim
        name: mute
        options: {ttft_ms: 0, faults: {error_rate: 1.0}}
"""
    )
    wait_until(lambda: not _endpoint(gw, "chat", "mute")["healthy"], timeout=10)
    mute = _endpoint(gw, "chat", "mute")
    assert "generation probe failed" in mute["detail"]
    assert _endpoint(gw, "chat", "ok")["healthy"]
