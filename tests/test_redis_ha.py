"""Every shared store against Redis as fleets run it: a Sentinel-watched primary and a
Redis Cluster, both real (``tests/redis_ha.py`` starts them from Debian's
``redis-server``), including the primary killed mid-load while two gateway processes
share rate limits, the response cache and routing state through it."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shuniu.core.config import FleetConfig
from shuniu.core.contracts import Lease, Rate
from shuniu.core.fleet.redis import RedisTransport
from shuniu.core.redis_client import hash_tagged, parse_redis_url
from shuniu.plugins.auth.api_keys import hash_key, new_key
from shuniu.plugins.cache.redis_store import RedisCache, RedisCacheOptions
from shuniu.plugins.ratelimit.redis_store import RedisRateLimitOptions, RedisRateLimitStore
from tests.conftest import GatewayProcess, start_gateway, wait_until
from tests.redis_ha import RedisCluster, RedisSentinels, redis_cluster, redis_sentinels  # noqa: F401

# -- URLs ----------------------------------------------------------------------------------


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_credentials() -> None:
    t = parse_redis_url(
        "redis+sentinel://app:s3cret@10.0.0.1:26380,[::1],sentinel-b/mymaster/2?sentinel_password=x"
    )
    assert t.shape == "sentinel"
    assert t.nodes == (("10.0.0.1", 26380), ("::1", 26379), ("sentinel-b", 26379))
    assert (t.service, t.db, t.username, t.password, t.tls) == ("mymaster", 2, "app", "s3cret", False)
    assert t.option("sentinel_password") == "x"
    assert parse_redis_url("rediss+sentinel://h/svc").tls


def test_a_cluster_url_names_its_seed_nodes() -> None:
    t = parse_redis_url("redis+cluster://:pw@a:7000,b:7001")
    assert (t.shape, t.nodes, t.password, t.username) == ("cluster", (("a", 7000), ("b", 7001)), "pw", None)
    assert parse_redis_url("redis://h:1/3").shape == "server"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://h:26379", "names the primary's service"),
        ("redis+sentinel://h:26379/svc/x", "database 'x' is not a number"),
        ("redis+sentinel://h:26379/svc/0/more", "not 3 parts"),
        ("redis+cluster://a:7000/1", "database 0 only"),
        ("redis+cluster://a:notaport", "'notaport' of 'a' is not a port number"),
        ("redis+cluster://a:7000,,b:7001", "an empty host"),
        ("redis+cluster://a:7000?db=1", "not db"),
        ("memcached://h:11211", "expected one of redis://"),
        ("h:6379", "no scheme"),
    ],
)
def test_a_bad_url_says_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_redis_url(url)
    assert says in str(info.value)


def test_an_error_never_shows_the_password() -> None:
    with pytest.raises(ValueError) as info:
        parse_redis_url("redis+cluster://:hunter2@a:7000/5")
    assert "hunter2" not in str(info.value)


def test_each_store_refuses_a_bad_url_naming_the_field(tmp_path: Path) -> None:
    from shuniu.core.config.loader import load_deployment
    from shuniu.core.errors import ConfigError
    from shuniu.core.plugin_manager import load_plugins

    text = """
rate_limits: {store: redis, options: {url: "redis+sentinel://h:1"}}
cache: {store: redis, options: {url: "redis+cluster://a:1/2"}}
fleet: {redis_url: "redis+clusterr://a:1"}
models:
  chat:
    endpoints: [{kind: sim}]
"""
    with pytest.raises(ConfigError) as info:
        load_deployment("deploy.yaml", load_plugins(), text=text, env={})
    problems = {p.path: p.message for p in info.value.problems}
    assert "names the primary's service" in problems["rate_limits.options.url"]
    assert "database 0 only" in problems["cache.options.url"]
    assert "expected one of" in problems["fleet.redis_url"]


def test_a_cluster_prefix_gets_a_hash_tag_once() -> None:
    assert hash_tagged("shuniu:rl:") == "{shuniu:rl}:"
    assert hash_tagged("{limits}:") == "{limits}:"
    assert hash_tagged("app:{rl}:") == "app:{rl}:"
    assert hash_tagged("") == "{shuniu}"
    assert hash_tagged("{}x:") == "{{}x}:"  # an empty tag does not count


# -- the stores against each shape -------------------------------------------------------


@pytest.fixture(params=["sentinel", "cluster"])
def ha(request: pytest.FixtureRequest) -> Iterator[RedisSentinels | RedisCluster]:
    setup = request.getfixturevalue("redis_sentinels" if request.param == "sentinel" else "redis_cluster")
    setup.flush()
    yield setup


def _data_node(ha: RedisSentinels | RedisCluster, key: str) -> Any:
    return ha.primary() if isinstance(ha, RedisSentinels) else ha.client_for(key)


async def test_rate_limits_are_one_count_across_gateways(ha: RedisSentinels | RedisCluster) -> None:
    options = RedisRateLimitOptions(url=ha.url, timeout_s=1.0)
    stores = [RedisRateLimitStore(options), RedisRateLimitStore(options)]
    try:
        # Two rates and a lease in one script: in a Cluster their keys must share a slot.
        rates = [Rate("key:k:rpm", 3, 60.0, 1), Rate("tenant:t:rpm", 100, 60.0, 1)]
        leases = [Lease("tenant:t:conc", 10, 30.0)]
        answers = []
        for i in range(4):
            decision = await stores[i % 2].acquire(rates, leases, f"req-{i}")
            answers.append((decision.allowed, decision.degraded))
        assert answers == [(True, False), (True, False), (True, False), (False, False)]
        prefix = hash_tagged("shuniu:rl:") if isinstance(ha, RedisCluster) else "shuniu:rl:"
        node = _data_node(ha, prefix + "key:k:rpm")
        assert node.exists(prefix + "key:k:rpm") and node.zcard(prefix + "tenant:t:conc") == 3
        await stores[1].settle([], leases, "req-0")
        assert node.zcard(prefix + "tenant:t:conc") == 2
    finally:
        for store in stores:
            await store.close()


async def test_the_cache_and_its_fill_lock_are_shared(ha: RedisSentinels | RedisCluster) -> None:
    a, b = (RedisCache(RedisCacheOptions(url=ha.url, timeout_s=1.0)) for _ in range(2))
    try:
        keys = [f"answer-{i}" for i in range(20)]  # spread over the Cluster's slots
        for key in keys:
            await a.put(key, key.encode(), 30.0)
        assert [await b.get(key) for key in keys] == [key.encode() for key in keys]
        assert await a.lock("fill", 30.0) and not await b.lock("fill", 30.0)
        await b.unlock("fill")  # not b's lock: kept
        assert not await b.lock("fill", 30.0)
        await a.unlock("fill")
        assert await b.lock("fill", 30.0)
        assert not a.degraded and not b.degraded
    finally:
        await a.close()
        await b.close()


async def test_fleet_batches_reach_every_gateway(ha: RedisSentinels | RedisCluster) -> None:
    cfg = FleetConfig(redis_url=ha.url, key_prefix="t:fleet:", timeout_s=1.0)
    one, two = RedisTransport(cfg), RedisTransport(cfg)
    try:
        cursor_one, seen = await one.exchange(b"from one", None)
        assert seen == [b"from one"]
        _, seen = await two.exchange(b"from two", None)
        assert seen == [b"from one", b"from two"]
        _, seen = await one.exchange(b"", cursor_one)
        assert seen == [b"from two"]
        assert _data_node(ha, "t:fleet:batches").xlen("t:fleet:batches") == 2
    finally:
        await one.close()
        await two.close()


# -- a primary lost mid-load ---------------------------------------------------------------

KEYS = {name: new_key() for name in ("load", "few")}


def _deployment(url: str) -> str:
    return f"""
tiers:
  std: {{}}
auth:
  authenticators:
    - kind: api_keys
      options:
        keys:
          - {{id: load, hash: "{hash_key(KEYS["load"])}", tenant: load, tier: std, limits: {{rpm: 100000}}}}
          - {{id: few, hash: "{hash_key(KEYS["few"])}", tenant: few, tier: std, limits: {{rpm: 3}}}}
rate_limits:
  store: redis
  options: {{url: "{url}", on_error: open, timeout_s: 2, retry_interval_s: 0.2}}
cache:
  store: redis
  options: {{url: "{url}", timeout_s: 2, retry_after_s: 0.2}}
fleet: {{redis_url: "{url}", sync_interval_s: 0.05, timeout_s: 0.3}}
models:
  chat:
    balancer: {{policy: prefix_affinity}}
    health: {{interval_s: 0.05}}
    endpoints:
      - kind: sim
        replicas: 2
        options: {{ttft_ms: 5, tokens_per_s: 0, output_tokens_min: 2, output_tokens_max: 6}}
"""


def _post(gw: GatewayProcess, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"{gw.base_url}/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}, timeout=30
    )


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {"model": "chat", "messages": [{"role": "user", "content": content}], **extra}


def _healthy(gw: GatewayProcess) -> bool:
    ready = httpx.get(f"{gw.url}/ready", timeout=5).json()
    stores = ready.get("stores", {})
    return (
        not ready["fleet"]["degraded"]
        and set(stores) == {"rate_limits", "cache"}
        and not any(s["degraded"] for s in stores.values())
    )


class _Load:
    """Clients sending chat requests to both gateways in turn until stopped; every answer's
    status is counted (a connection failure counts as ``error``)."""

    def __init__(self, gateways: list[GatewayProcess], clients: int = 4) -> None:
        self.gateways = gateways
        self.codes: Counter[str] = Counter()
        self.after_failover = 0
        self.failover_done = False
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> _Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _run(self, i: int) -> None:
        n = 0
        while not self._stop.is_set():
            gw = self.gateways[(i + n) % len(self.gateways)]
            n += 1
            try:
                code = str(
                    _post(gw, KEYS["load"], _chat(f"client {i} asks {n % 7}", max_tokens=4)).status_code
                )
            except httpx.HTTPError as exc:
                code = f"error {type(exc).__name__}"
            with self._lock:
                self.codes[code] += 1
                if self.failover_done and code == "200":
                    self.after_failover += 1


@pytest.mark.parametrize("shape", ["sentinel", "cluster"])
def test_a_primary_killed_mid_load_loses_no_request_and_sharing_resumes_on_the_new_one(
    shape: str, tmp_path: Path
) -> None:
    setup: RedisSentinels | RedisCluster = RedisSentinels() if shape == "sentinel" else RedisCluster()
    gateways: list[GatewayProcess] = []
    try:
        for i in range(2):
            (tmp_path / f"gw{i}").mkdir()
            gateways.append(start_gateway(_deployment(setup.url), tmp_path / f"gw{i}"))
        for gw in gateways:
            assert _post(gw, KEYS["load"], _chat("warm up", max_tokens=2)).status_code == 200
            wait_until(lambda gw=gw: _healthy(gw), timeout=15)
        limits_key = hash_tagged("shuniu:rl:") + "x" if isinstance(setup, RedisCluster) else ""
        with _Load(gateways) as load:
            wait_until(lambda: load.codes["200"] >= 40, timeout=30)
            killed_at = time.monotonic()
            if isinstance(setup, RedisCluster):
                old = setup.kill_primary(limits_key)  # the primary holding every limit
                new = setup.wait_failover(limits_key, old)
            else:
                old = setup.kill_primary()
                new = setup.wait_failover(old)
            assert new != old
            load.failover_done = True
            promoted_s = time.monotonic() - killed_at
            for gw in gateways:
                wait_until(lambda gw=gw: _healthy(gw), timeout=30)
            shared_s = time.monotonic() - killed_at
            wait_until(lambda: load.after_failover >= 40, timeout=30)
        print(f"{shape}: promoted after {promoted_s:.1f} s, shared after {shared_s:.1f} s; {load.codes}")
        # Nothing lost: every request was answered, through the outage and after it.
        assert set(load.codes) == {"200"}, load.codes
        # The limits are one count again, on the new primary: 3 a minute across both
        # gateways (each gateway's fallback would allow 3 of its own).
        codes = [
            _post(gateways[i % 2], KEYS["few"], _chat("few", max_tokens=1)).status_code for i in range(4)
        ]
        assert codes == [200, 200, 200, 429]
        # The cache is shared again: an answer filled by one gateway is the other's hit.
        body = _chat("cached after the failover", temperature=0, max_tokens=3)
        assert _post(gateways[0], KEYS["load"], body).headers["x-shuniu-cache"] == "miss"
        assert _post(gateways[1], KEYS["load"], body).headers["x-shuniu-cache"] == "hit"
        # The fleet's batches go to the new primary (both gateways publish there).
        stream = "shuniu:fleet:batches"
        node = setup.primary() if isinstance(setup, RedisSentinels) else setup.client_for(stream)
        before = node.xlen(stream)
        wait_until(lambda: node.xlen(stream) > before + 2, timeout=10)
        # The outage was said once, not once per request, and each recovery once: the lines
        # alternate. The sentinels may flap while they agree on the new primary (a brief
        # "no master found" after the first recovery), which is a second, real, outage.
        for gw in gateways:
            text = gw.output_containing("reachable again")
            said = [
                "down" if "store unreachable" in line else "up"
                for line in text.splitlines()
                if "rate-limit store" in line
            ]
            assert said[0] == "down" and said[-1] == "up", said
            assert all(a != b for a, b in itertools.pairwise(said)), said
            assert len(said) <= 4, said  # ~100 requests went through the outage
        metrics = httpx.get(f"{gateways[0].url}/metrics", timeout=5).text
        assert 'shuniu_store_degraded{store="rate_limits"} 0.0' in metrics
        assert 'shuniu_store_degraded{store="cache"} 0.0' in metrics
    finally:
        for gw in gateways:
            gw.stop()
        setup.close()


def test_the_store_metric_says_when_limits_run_without_redis(
    redis_server_factory: Any, tmp_path: Path
) -> None:
    server = redis_server_factory()
    gw = start_gateway(_deployment(server.url), tmp_path)
    try:
        assert _post(gw, KEYS["load"], _chat("hello", max_tokens=1)).status_code == 200
        server.stop()
        assert _post(gw, KEYS["load"], _chat("hello again", max_tokens=1)).status_code == 200
        metrics = httpx.get(f"{gw.url}/metrics", timeout=5).text
        assert 'shuniu_store_degraded{store="rate_limits"} 1.0' in metrics
        assert httpx.get(f"{gw.url}/ready", timeout=5).json()["stores"]["rate_limits"] == {"degraded": True}
    finally:
        gw.stop()
