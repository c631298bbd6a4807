"""Injected faults on simulated endpoints, as the gateway and the simulator see them."""

from __future__ import annotations

import json
import textwrap

import httpx
import openai
import pytest

from shuniu.core.config.loader import load_deployment
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.traffic import load_workload
from shuniu.plugins.tools.simulate import simulate
from tests.conftest import wait_until


def _one_endpoint(faults: str, health: str = "{interval_s: 0.05, timeout_s: 0.3, unhealthy_after: 1}") -> str:
    return f"""
    models:
      m:
        health: {health}
        endpoints:
          - kind: sim
            options: {{ttft_ms: 0, tokens_per_s: 50, faults: {faults}}}
    """


def _workload(rate: float, input_tokens: int, output_tokens: int, duration: float):  # type: ignore[no-untyped-def]
    stream = f"{{arrival: {{rate: {rate}}}, input_tokens: {input_tokens}, output_tokens: {output_tokens}}}"
    return load_workload("w", text=f"name: w\nduration_s: {duration}\nstreams:\n  - {stream}\n")


def _chat(gw, **kw: object) -> httpx.Response:  # type: ignore[no-untyped-def]
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, **kw}
    return httpx.post(f"{gw.base_url}/chat/completions", json=body, timeout=10)


def test_error_rate_gives_502s(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_one_endpoint("{error_rate: 1.0}"))
    resp = _chat(gw)
    assert resp.status_code == 502
    assert "simulated engine error" in resp.json()["error"]["message"]
    client = openai.OpenAI(base_url=gw.base_url, api_key="k", max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    assert info.value.status_code == 502


def test_crash_mid_stream_then_restart(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_one_endpoint("{crash_after_requests: 1, restart_after_s: 1.0}"))
    # The first request starts; the second arrival crashes the engine under it.
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(timeout=10) as client:
        with client.stream("POST", f"{gw.base_url}/chat/completions", json=body) as first:
            lines = first.iter_lines()
            assert next(lines).startswith("data: ")
            second = _chat(gw)
            assert second.status_code == 502 and "simulated crash" in second.json()["error"]["message"]
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["error"]["code"] == "upstream_error"
        # Health checks take it out of balancing, and it comes back after the restart.
        wait_until(lambda: client.get(f"{gw.url}/ready").status_code == 503)
        wait_until(lambda: client.get(f"{gw.url}/ready").status_code == 200, timeout=10)
    assert _chat(gw).status_code == 200


def test_hang_is_caught_by_health_timeouts(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(_one_endpoint("{hang_after_requests: 0}"))
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            f"{gw.base_url}/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
            timeout=0.5,
        )
    ready = wait_until(lambda: (r := httpx.get(f"{gw.url}/ready")).status_code == 503 and r)
    assert "TimeoutError" in ready.json()["models"]["m"]["endpoints"][0]["detail"]


def test_faults_in_simulation() -> None:
    text = textwrap.dedent(
        """
        models:
          m:
            endpoints:
              - kind: sim
                name: flaky
                options: {ttft_ms: 0, tokens_per_s: 50, faults: {error_rate: 0.2, seed: 1}}
              - {kind: sim, name: steady, options: {ttft_ms: 0, tokens_per_s: 50}}
        """
    )
    workload = _workload(rate=10, input_tokens=32, output_tokens=8, duration=60)
    s = simulate(load_deployment(None, load_plugins(), text=text), load_plugins(), workload).summary()
    assert s["requests_completed"] + s["failed"] == s["requests_arrived"]
    # Half the traffic goes to the flaky endpoint, a fifth of which fails: about 10%.
    assert 0.05 < s["failed"] / s["requests_arrived"] < 0.15


def test_hung_endpoint_does_not_stall_the_simulation() -> None:
    text = "models:\n  m:\n    endpoints:\n      - {kind: sim, options: {faults: {hang_after_requests: 5}}}\n"
    workload = _workload(rate=2, input_tokens=8, output_tokens=4, duration=10)
    result = simulate(load_deployment(None, load_plugins(), text=text), load_plugins(), workload, drain_s=30)
    s = result.summary()
    assert s["requests_completed"] == 5
    assert s["unfinished"] == s["requests_arrived"] - 5
