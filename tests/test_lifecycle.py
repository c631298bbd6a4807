"""Client disconnects cancel engine work; SIGTERM drains in-flight streams."""

from __future__ import annotations

import json
import signal
import socket

import httpx

from tests.conftest import wait_until

SLOW = """
gateway: {graceful_shutdown_s: 20}
models:
  slow:
    health: {interval_s: 0.05}
    endpoints:
      - kind: sim
        max_concurrency: 1
        options: {ttft_ms: 0, tokens_per_s: 50}
"""


def _endpoint(client: httpx.Client, url: str) -> dict:  # type: ignore[type-arg]
    return client.get(f"{url}/ready").json()["models"]["slow"]["endpoints"][0]  # type: ignore[no-any-return]


def test_disconnect_mid_stream_stops_the_engine(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(SLOW)
    body = {
        "model": "slow",
        "messages": [{"role": "user", "content": "long answer please"}],
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{gw.base_url}/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            events: list[str] = []
            for line in lines:
                if line.startswith("data: "):
                    events.append(line)
                if len(events) == 4:
                    break
            busy = wait_until(lambda: (e := _endpoint(client, gw.url))["load"]["running"] == 1 and e)
            assert busy["in_flight"] == 1
        # The client closed the connection after 4 events; at 50 tokens/s the engine would
        # need 20 s to finish. It must stop at once and free the endpoint's slot.
        done = wait_until(lambda: (e := _endpoint(client, gw.url))["load"]["aborted"] == 1 and e)
        assert done["load"]["running"] == 0
        assert done["in_flight"] == 0
        generated = done["load"]["generated_tokens"]
        assert generated < 100
        # The slot is free again: the next request is served right away.
        resp = client.post(
            f"{gw.base_url}/chat/completions",
            json={"model": "slow", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2},
        )
        assert resp.status_code == 200
        later = wait_until(lambda: (e := _endpoint(client, gw.url))["completed"] >= 1 and e)
        assert later["load"]["generated_tokens"] <= generated + 2


def test_disconnect_while_queued_frees_nothing_twice(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(SLOW)
    hold = {
        "model": "slow",
        "messages": [{"role": "user", "content": "a"}],
        "max_tokens": 100,  # 2 s at 50 tokens/s: the queued client gives up well before
        "ignore_eos": True,
    }
    with httpx.Client(timeout=30) as client, httpx.Client(timeout=30) as other:
        with client.stream("POST", f"{gw.base_url}/chat/completions", json={**hold, "stream": True}) as first:
            lines = first.iter_lines()
            next(lines)  # the first request holds the only slot
            # A second request queues behind it; its client gives up before it is served.
            try:
                other.post(f"{gw.base_url}/chat/completions", json=hold, timeout=0.3)
            except httpx.TimeoutException:
                pass
            else:
                raise AssertionError("the queued request should not have been served yet")
            remaining = [line for line in lines if line.startswith("data: ")]
            assert remaining[-1] == "data: [DONE]"
        ep = wait_until(
            lambda: (
                (e := _endpoint(client, gw.url))["in_flight"] == 0
                and e["load"]["generated_tokens"] >= 100
                and e
            )
        )
        # The abandoned request never reached the engine, and no slot leaked.
        assert ep["load"]["generated_tokens"] == 100
        assert (ep["completed"], ep["errors"], ep["load"]["running"]) == (1, 0, 0)
        resp = client.post(f"{gw.base_url}/chat/completions", json={**hold, "max_tokens": 3})
        assert resp.status_code == 200
        assert resp.json()["usage"]["completion_tokens"] == 3


def test_sigterm_drains_in_flight_streams(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    gw = gateway_factory(SLOW)
    body = {
        "model": "slow",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 40,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{gw.base_url}/chat/completions", json=body) as resp:
            lines = resp.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["choices"][0]["delta"]["role"] == "assistant"
            gw.proc.send_signal(signal.SIGTERM)

            # New connections are refused while the stream is still being served.
            def refused() -> bool:
                try:
                    socket.create_connection((gw.host, gw.port), timeout=1).close()
                except ConnectionRefusedError:
                    return True
                return False

            wait_until(refused)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        usage = json.loads(rest[-2][6:])["usage"]
        assert usage["completion_tokens"] == 40
    assert gw.proc.wait(20) == 0


def test_serve_banner_and_open_gateway_warning(gateway_factory) -> None:  # type: ignore[no-untyped-def]
    local = gateway_factory(None)  # the built-in quickstart
    banner = local.output_containing("curl")
    assert "serving built-in quickstart on http://127.0.0.1:" in banner
    assert "curl http://127.0.0.1:" in banner and '"model": "quickstart"' in banner
    assert "WARNING" not in banner
    wide = gateway_factory(None, args=("--host", "0.0.0.0"))
    wait_until(lambda: any("NO authentication" in line for line in wide.output))
    assert httpx.get(f"http://127.0.0.1:{wide.port}/health").status_code == 200
