"""Discovery in one gateway, in process: the deployment file's checks, the reconcile of a
source's reports into endpoints (join after the health probe, drain then removal, a target
that comes back while draining), a failing source keeping what it found, a reload keeping
the discovered endpoints, and the ``dns`` source's options and SRV lookups."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from shuniu.core.config.loader import load_deployment
from shuniu.core.contracts import Target
from shuniu.core.errors import ConfigError
from shuniu.core.gateway import Gateway
from shuniu.core.plugin_manager import PluginManager, load_plugins
from shuniu.core.pools.discovery import endpoint_name, target_url
from shuniu.plugins.discovery.dns import DnsDiscovery, DnsOptions, parse_nameserver
from tests.dns_server import DnsServer


@pytest.fixture(scope="module")
def plugins() -> PluginManager:
    return load_plugins()


def _problems(plugins: PluginManager, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_deployment("d.yaml", plugins, text=textwrap.dedent(text), env={})
    return [f"{p.path}: {p.message}" for p in info.value.problems]


def test_bad_discovery_entries_name_the_field(plugins: PluginManager) -> None:
    problems = _problems(
        plugins,
        """
        models:
          a:
            endpoints:
              - kind: vllm
                discovery: {kind: consul}
          b:
            endpoints:
              - kind: vllm
                discovery: {kind: dns, options: {name: engines.test}}
          c:
            endpoints:
              - kind: vllm
                replicas: 2
                discovery: {kind: dns, options: {name: engines.test, port: 8000}}
        """,
    )
    assert any(
        p.startswith("models.a.endpoints[0].discovery.kind: unknown discovery source 'consul'")
        and "dns, kubernetes" in p
        for p in problems
    ), problems
    assert any(
        p.startswith("models.b.endpoints[0].discovery.options") and "port is required" in p for p in problems
    )
    assert any(p.startswith("models.c.endpoints[0]") and "leave replicas out" in p for p in problems)


def test_names_and_addresses_of_discovered_endpoints(plugins: PluginManager) -> None:
    assert endpoint_name("vllm", Target("fd00::1-8000", "fd00::1", 8000)) == "vllm-fd00-1-8000"
    resolved = load_deployment(
        "d.yaml",
        plugins,
        text=textwrap.dedent(
            """
            models:
              m:
                endpoints:
                  - kind: vllm
                    discovery: {kind: dns, options: {name: e.test, port: 1}}
                  - kind: openai
                    options: {base_url: "https://gateway.example/api/v1", model: x}
                    discovery: {kind: dns, options: {name: e.test, port: 1}}
            """
        ),
        env={},
    )
    vllm, oai = resolved.endpoint_options[("m", 0)], resolved.endpoint_options[("m", 1)]
    t = Target("k", "10.0.0.7", 8123)
    assert target_url(vllm, None, t).base_url == "http://10.0.0.7:8123"
    # The entry's scheme and path stay; host and port are the target's.
    assert target_url(oai, "https://gateway.example/api/v1", t).base_url == "https://10.0.0.7:8123/api/v1"
    assert target_url(vllm, None, Target("k", "fd00::7", 80)).base_url == "http://[fd00::7]:80"
    assert resolved.deployment.models["m"].endpoints  # entries kept; no static endpoint built


class Scripted:
    """A discovery source the test feeds: each ``put`` is one report; ``fail`` raises."""

    def __init__(self) -> None:
        self.reports: asyncio.Queue[Sequence[Target] | Exception] = asyncio.Queue()
        self.watches = 0

    def put(self, *targets: Target) -> None:
        self.reports.put_nowait(list(targets))

    def fail(self) -> None:
        self.reports.put_nowait(RuntimeError("registry unreachable"))

    async def watch(self) -> AsyncIterator[Sequence[Target]]:
        self.watches += 1
        while True:
            item = await self.reports.get()
            if isinstance(item, Exception):
                raise item
            yield item


DEPLOYMENT = """
models:
  chat:
    health: {interval_s: 0.05}
    endpoints:
      - {kind: sim, name: static, options: {ttft_ms: 0}}
      - kind: openai
        name: found
        labels: {pool: a}
        options: {model: tiny}
        discovery: {kind: dns, backoff_s: 0.05, drain_timeout_s: 5, options: {name: e.test, port: 1}}
"""


async def _until(predicate) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(10):
        while not predicate():  # noqa: ASYNC110 - the gateway's own tasks change the state
            await asyncio.sleep(0.01)


async def test_reports_become_endpoints_that_join_drain_and_leave(
    plugins: PluginManager, tmp_path: Path
) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(DEPLOYMENT)
    gw = Gateway(load_deployment(str(path), plugins), plugins)
    source = Scripted()
    entry = gw.discoveries.entries[0]
    entry.source = source
    await gw.start()
    pool = gw.pools["chat"]

    def names() -> set[str]:
        return {e.name for e in pool.endpoints}

    try:
        # Nothing answers on these ports: the endpoints are added but never pass a probe.
        gone = Target("10.255.0.1-1", "127.0.0.1", 9, labels={"version": "v2", "zone": "z"})
        source.put(gone, Target("late", "127.0.0.1", 9, ready=False))
        await _until(lambda: "found-10.255.0.1-1" in names())
        ep = next(e for e in pool.endpoints if e.name == "found-10.255.0.1-1")
        assert not ep.healthy and ep.version == "v2" and ep.labels == {"pool": "a", "zone": "z"}
        assert "found-late" not in names()  # not ready: never added
        assert entry.counts() == {"serving": 0, "starting": 1, "draining": 0, "not_ready": 1}

        # A failing source keeps what it found and is watched again.
        source.fail()
        await _until(lambda: source.watches == 2)
        assert "found-10.255.0.1-1" in names() and entry.error is not None

        # Gone with a request "in flight": it drains and stays until that one finishes.
        ep.in_flight = 1
        source.put()
        await _until(lambda: ep.draining)
        assert entry.error is None
        # Back while draining: in balancing again, never removed.
        source.put(gone)
        await _until(lambda: not ep.draining)
        source.put()
        await _until(lambda: ep.draining)
        await asyncio.sleep(0.1)
        assert "found-10.255.0.1-1" in names()
        ep.in_flight = 0
        await _until(lambda: "found-10.255.0.1-1" not in names())
        assert names() == {"static"}

        # A reload keeps the discovered endpoints (the same objects, in the new pool).
        source.put(Target("b", "127.0.0.1", 9))
        await _until(lambda: "found-b" in names())
        kept = next(e for e in pool.endpoints if e.name == "found-b")
        path.write_text(DEPLOYMENT.replace("ttft_ms: 0", "ttft_ms: 1"))
        await gw.reload()
        assert any(e is kept for e in gw.pools["chat"].endpoints)
        # ... and refuses a change to a discovery entry, which needs a restart.
        path.write_text(DEPLOYMENT.replace("drain_timeout_s: 5", "drain_timeout_s: 6"))
        with pytest.raises(ConfigError, match="discovery"):
            await gw.reload()
    finally:
        await gw.stop()


def test_dns_options_need_a_port_unless_srv() -> None:
    assert parse_nameserver("[::1]:5353") == ("::1", 5353)
    assert parse_nameserver("10.96.0.10") == ("10.96.0.10", 53)
    assert DnsOptions(name="_http._tcp.e.test", record="SRV").port is None
    with pytest.raises(ValueError, match="port is required"):
        DnsOptions(name="e.test")


async def test_srv_records_give_hosts_and_ports(tmp_path: Path, dns_server: DnsServer) -> None:
    dns_server.stop()
    server = DnsServer(
        dns_server.dir,
        ttl=7,
        srv=["_http._tcp.engines.test,e0.test,8001,0,10", "_http._tcp.engines.test,e1.test,8002,0,10"],
    )
    server.start()
    try:
        server.set_hosts({"e0.test": ["127.0.0.10"], "e1.test": ["127.0.0.11", "127.0.0.12"]})
        await asyncio.sleep(0)  # set_hosts signalled; the server reads the file before its next answer
        source = DnsDiscovery(
            DnsOptions(name="_http._tcp.engines.test", record="SRV", nameservers=[server.address])
        )

        async def lookup() -> list[Target]:
            found, _ = await source.lookup()
            return found

        async with asyncio.timeout(10):
            while len(targets := await lookup()) < 3:  # noqa: ASYNC110 - dnsmasq reads its file on SIGHUP
                await asyncio.sleep(0.05)
        _, ttl = await source.lookup()
        assert [(t.host, t.port, t.labels["hostname"]) for t in targets] == [
            ("127.0.0.10", 8001, "e0.test"),
            ("127.0.0.11", 8002, "e1.test"),
            ("127.0.0.12", 8002, "e1.test"),
        ]
        assert ttl == 7
    finally:
        server.stop()
