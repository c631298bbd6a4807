"""Endpoints found at run time, end to end: a gateway process whose pool comes from a
Kubernetes Service's EndpointSlices (tests/fake_kube_api.py) or from DNS records served by
a real dnsmasq (tests/dns_server.py), in front of two ``shuniu sim serve`` engines (vLLM's
API) on 127.0.0.1 and 127.0.0.2. A pod that is not ready never joins; one that becomes ready
joins after its health probe; one that goes away is drained with requests running and none
of them fails; a DNS server that stops answering changes nothing."""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import GatewayProcess, start_process, wait_until
from tests.dns_server import DnsServer
from tests.fake_kube_api import FakeKubeApi, SliceEndpoint

HOSTS = ("127.0.0.1", "127.0.0.2")


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[int, list[GatewayProcess]]]:
    """Two simulated vLLM engines on the same port of two loopback addresses."""
    cmd = [
        sys.executable,
        "-m",
        "shuniu.core",
        "sim",
        "serve",
        "--served-model-name",
        "tiny",
        "--ttft-ms",
        "1",
    ]
    first = start_process([*cmd, "--host", HOSTS[0], "--port", "0"], timeout=60)
    second = start_process([*cmd, "--host", HOSTS[1], "--port", str(first.port)], timeout=60)
    yield first.port, [first, second]
    for p in (first, second):
        p.stop()


def _served(engine: GatewayProcess) -> float:
    text = httpx.get(f"{engine.url}/metrics", timeout=10).text
    return sum(float(m) for m in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def _endpoints(gw: GatewayProcess) -> dict[str, dict[str, Any]]:
    ready = httpx.get(f"{gw.url}/ready", timeout=10).json()
    return {e["name"]: e for e in ready["models"]["chat"]["endpoints"]}


def _serving(gw: GatewayProcess) -> set[str]:
    return {n for n, e in _endpoints(gw).items() if e["healthy"] and not e["draining"]}


def _chat(gw: GatewayProcess, n: int) -> int:
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)
    for i in range(n):
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2
        )
    return n


class Load:
    """Requests one after another in a thread until stopped: every answer must be a 200."""

    def __init__(self, gw: GatewayProcess) -> None:
        self.gw = gw
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = openai.OpenAI(base_url=self.gw.base_url, api_key="x", max_retries=0, timeout=30)
        while not self._stop.is_set():
            try:
                list(
                    client.chat.completions.create(
                        model="chat", messages=[{"role": "user", "content": "x"}], max_tokens=4, stream=True
                    )
                )
                self.ok += 1
            except openai.APIError as exc:
                self.failed.append(str(exc)[:80])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def _metric(gw: GatewayProcess, name: str, **labels: str) -> float:
    for line in httpx.get(f"{gw.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name, labels)


def test_endpointslices_bring_ready_pods_in_and_drain_the_ones_that_go(  # type: ignore[no-untyped-def]
    gateway_factory, engines, tmp_path: Path
) -> None:
    port, (a, b) = engines
    api = FakeKubeApi(namespace="llm", token="t0ken").start()
    try:
        api.add_pod("vllm-0", {"app.kubernetes.io/version": "v1", "shuniu.io/hardware": "h200"})
        api.add_pod("vllm-1", {"app.kubernetes.io/version": "v1", "shuniu.io/hardware": "h200"})
        pods = [
            SliceEndpoint("vllm-0", HOSTS[0], zone="zone-a"),
            SliceEndpoint("vllm-1", HOSTS[1], ready=False),
        ]
        api.apply_slice("vllm-x1", "vllm", port, pods)
        token = tmp_path / "token"
        token.write_text("t0ken")
        gw = gateway_factory(
            f"""
models:
  chat:
    health: {{interval_s: 0.1}}
    load: {{interval_s: 0.1}}
    endpoints:
      - kind: vllm
        name: engines
        discovery:
          kind: kubernetes
          drain_timeout_s: 30
          options: {{service: vllm, namespace: llm, port: http, api_url: "{api.url}", token_file: "{token}"}}
"""
        )
        wait_until(lambda: _serving(gw) == {"engines-vllm-0"})
        first = _endpoints(gw)["engines-vllm-0"]
        assert first["labels"] == {"zone": "zone-a", "hardware": "h200"} and first["version"] == "v1"
        assert "engines-vllm-1" not in _endpoints(gw)  # not ready: never joins
        served_a, served_b = _served(a), _served(b)
        _chat(gw, 6)
        assert _served(a) - served_a == 6 and _served(b) == served_b
        assert _metric(gw, "shuniu_discovery_endpoints", state="not_ready") == 1

        # The second pod becomes ready: it joins once its health probe passes.
        api.apply_slice("vllm-x1", "vllm", port, [pods[0], SliceEndpoint("vllm-1", HOSTS[1])])
        wait_until(lambda: _serving(gw) == {"engines-vllm-0", "engines-vllm-1"})
        _chat(gw, 10)
        assert _served(b) > served_b

        # The first pod goes away with requests running: it drains, then leaves; none fails.
        load = Load(gw)
        wait_until(lambda: load.ok >= 5)
        api.apply_slice("vllm-x1", "vllm", port, [SliceEndpoint("vllm-1", HOSTS[1])])
        wait_until(lambda: set(_endpoints(gw)) == {"engines-vllm-1"})
        after = load.ok
        wait_until(lambda: load.ok >= after + 5)
        load.stop()
        assert load.failed == []
        assert _metric(gw, "shuniu_discovery_endpoints", state="serving") == 1
        assert _metric(gw, "shuniu_discovery_up") == 1
        assert api.requests.unauthorized == 0
    finally:
        api.stop()


def test_dns_records_add_and_remove_engines_and_a_silent_server_changes_nothing(  # type: ignore[no-untyped-def]
    gateway_factory, engines, dns_server: DnsServer
) -> None:
    port, (_, b) = engines
    dns_server.set_hosts({"engines.test": [HOSTS[0]]})
    gw = gateway_factory(
        f"""
models:
  chat:
    health: {{interval_s: 0.1}}
    endpoints:
      - kind: vllm
        discovery:
          kind: dns
          backoff_s: 0.1
          options: {{name: engines.test, port: {port}, interval_s: 0.2, min_interval_s: 0.1,
                     nameservers: ["{dns_server.address}"], timeout_s: 0.5}}
"""
    )
    first, second = f"chat-{HOSTS[0]}-{port}", f"chat-{HOSTS[1]}-{port}"
    wait_until(lambda: _serving(gw) == {first})
    dns_server.set_hosts({"engines.test": list(HOSTS)})
    wait_until(lambda: _serving(gw) == {first, second})
    served_b = _served(b)
    _chat(gw, 10)
    assert _served(b) > served_b

    dns_server.set_hosts({"engines.test": [HOSTS[1]]})
    wait_until(lambda: set(_endpoints(gw)) == {second})

    # The DNS server goes silent: a failure, not an empty answer; the engine stays.
    dns_server.stop()
    wait_until(lambda: _metric(gw, "shuniu_discovery_up") == 0)
    assert _metric(gw, "shuniu_discovery_failures_total") >= 1
    assert _serving(gw) == {second}
    _chat(gw, 3)

    # A name that no longer exists is an answer: its engines drain away.
    dns_server.hosts.write_text("")
    dns_server.restart()
    wait_until(lambda: _metric(gw, "shuniu_discovery_up") == 1)
    wait_until(lambda: _endpoints(gw) == {})
