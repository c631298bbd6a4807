"""The load view: scores from gateway counts and engine snapshots, staleness, and the
adaptive concurrency limit, unit by unit and through a gateway's own load loop."""

from __future__ import annotations

import asyncio
import textwrap

from shuniu.core import hookimpl
from shuniu.core.config import LoadConfig
from shuniu.core.config.loader import load_deployment
from shuniu.core.contracts import BackendBase
from shuniu.core.gateway import Gateway
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.pools.load import LoadWeights, adapt_limit, freshness, load_score
from shuniu.core.pools.pool import EndpointState
from shuniu.core.types import EndpointLoad
from shuniu.plugins.tools.simulate import run_virtual


def _ep(**kw: object) -> EndpointState:
    e = EndpointState("e", BackendBase(), max_concurrency=int(kw.pop("max_concurrency", 0)))  # type: ignore[arg-type]
    for k, v in kw.items():
        setattr(e, k, v)
    return e


def test_score_counts_requests_and_tokens() -> None:
    w = LoadWeights(tokens_per_request=1000)
    assert load_score(_ep(), w) == 0
    assert load_score(_ep(in_flight=2, in_flight_tokens=3000), w) == 5
    # A snapshot without a weight is ignored.
    assert load_score(_ep(in_flight=1, load=EndpointLoad(running=9, waiting=9), load_weight=0.0), w) == 1


def test_score_adds_what_only_the_engine_sees() -> None:
    w = LoadWeights(tokens_per_request=1e9, waiting=1.0, kv=8.0, kv_knee=0.8)
    # Other gateways' requests (running + waiting beyond ours) and the engine's queue count.
    e = _ep(in_flight=2, load=EndpointLoad(running=5, waiting=3), load_weight=1.0)
    assert load_score(e, w) == 2 + (8 - 2) + 3
    # Half-stale: half of it.
    e.load_weight = 0.5
    assert load_score(e, w) == 2 + 0.5 * 6 + 0.5 * 3
    # A nearly full KV cache is load; below the knee it is not.
    assert load_score(_ep(load=EndpointLoad(kv_usage=0.9), load_weight=1.0), w) == 8 * 0.5
    assert load_score(_ep(load=EndpointLoad(kv_usage=0.5), load_weight=1.0), w) == 0


def test_freshness_fades_after_stale_after() -> None:
    assert freshness(0.3, 2.0) == 1.0
    assert freshness(2.0, 2.0) == 1.0
    assert freshness(3.0, 2.0) == 0.5
    assert freshness(4.0, 2.0) == 0.0
    assert freshness(60.0, 2.0) == 0.0


def test_backlog_tightens_the_limit_and_it_widens_again() -> None:
    cfg = LoadConfig(max_engine_waiting=2, max_kv_usage=0.95)
    e = _ep(in_flight=40)
    assert adapt_limit(e, EndpointLoad(running=30, waiting=10), cfg) is False
    assert e.limit == 0  # one snapshot with a backlog: it may be a burst the next iteration takes
    assert adapt_limit(e, EndpointLoad(running=30, waiting=12), cfg) is False
    assert e.limit == 40 - 8  # still there: the excess (the smaller) moves back to the gateway
    e.in_flight = 20
    assert adapt_limit(e, EndpointLoad(running=20, waiting=2), cfg) is False  # at the threshold
    assert e.limit == 32  # and not binding: unchanged
    # A little backlog (under the threshold) while the limit binds: hold.
    e.in_flight = 32
    assert adapt_limit(e, EndpointLoad(running=31, waiting=1), cfg) is False
    assert e.limit == 32
    # An empty engine queue and the limit binds: grow, up to the ceiling, then unlimited.
    grew = 0
    while e.limit:
        e.in_flight = e.limit
        assert adapt_limit(e, EndpointLoad(running=e.limit, waiting=0), cfg) is True
        grew += 1
        assert grew < 100
    assert e.limit == 0
    # No backlog and the limit does not bind: nothing changes.
    e2 = _ep(in_flight=3, max_concurrency=10)
    e2.limit = 8
    assert adapt_limit(e2, EndpointLoad(running=3), cfg) is False and e2.limit == 8


def test_a_backlog_that_clears_between_snapshots_never_tightens() -> None:
    # An engine with long iterations shows requests waiting for the next one at any moment:
    # bursts on every other snapshot are not a backlog.
    cfg = LoadConfig(max_engine_waiting=2)
    e = _ep(in_flight=100)
    for _ in range(20):
        adapt_limit(e, EndpointLoad(running=97, waiting=5), cfg)
        adapt_limit(e, EndpointLoad(running=100, waiting=1), cfg)
    assert e.limit == 0
    adapt_limit(e, EndpointLoad(running=97, waiting=5), cfg)
    adapt_limit(e, EndpointLoad(running=97, waiting=4), cfg)
    assert e.limit == 100 - 2


def test_full_kv_cache_tightens_and_ceiling_is_max_concurrency() -> None:
    cfg = LoadConfig(max_kv_usage=0.9)
    e = _ep(in_flight=16, max_concurrency=20)
    adapt_limit(e, EndpointLoad(running=16, kv_usage=0.97), cfg)
    assert e.limit == 14
    for _ in range(50):
        e.in_flight = e.limit
        adapt_limit(e, EndpointLoad(running=e.limit, kv_usage=0.5), cfg)
    assert e.limit == 20  # never above the configured maximum
    e.in_flight = 1
    adapt_limit(e, EndpointLoad(waiting=50), cfg)
    adapt_limit(e, EndpointLoad(waiting=50), cfg)
    assert e.limit == cfg.min_concurrency
    off = LoadConfig(adaptive_concurrency=False)
    e3 = _ep(in_flight=5)
    adapt_limit(e3, EndpointLoad(waiting=50), off)
    assert e3.limit == 0


class _Flaky(BackendBase):
    """A backend whose load reports work until ``broken`` is set, then fail."""

    kind = "flaky"

    def __init__(self, spec: object) -> None:
        self.broken = False
        self.reports = 0

    async def load(self) -> EndpointLoad | None:
        if self.broken:
            raise ConnectionError("metrics endpoint down")
        self.reports += 1
        return EndpointLoad(running=3, waiting=1, kv_usage=0.5)


class _Blind(BackendBase):
    kind = "blind"

    def __init__(self, spec: object) -> None:
        self.calls = 0

    async def load(self) -> EndpointLoad | None:
        self.calls += 1
        return None


class _Plugin:
    @hookimpl
    def register_backends(self, register):  # type: ignore[no-untyped-def]
        register("flaky", _Flaky)
        register("blind", _Blind)


def test_gateway_polls_ages_and_drops_snapshots() -> None:
    plugins = load_plugins(extra=[("test-backends", _Plugin())])
    text = textwrap.dedent(
        """
        models:
          m:
            load: {interval_s: 0.5, stale_after_s: 2}
            health: {interval_s: 1000}
            endpoints:
              - {kind: flaky}
              - {kind: blind}
        """
    )
    resolved = load_deployment("d.yaml", plugins, text=text, env={})
    seen: dict[str, object] = {}

    async def main() -> None:
        gw = Gateway(resolved, plugins)
        await gw.start()
        flaky, blind = gw.pools["m"].endpoints
        await asyncio.sleep(1.1)
        seen["fresh"] = (flaky.load, flaky.load_weight)
        seen["blind"] = (blind.load, blind.load_weight, blind.backend.calls)  # type: ignore[attr-defined]
        flaky.backend.broken = True  # type: ignore[attr-defined]
        await asyncio.sleep(3.0)  # the last good snapshot is ~3 s old: half weight
        seen["aging"] = flaky.load_weight
        await asyncio.sleep(2.0)
        seen["gone"] = (flaky.load, flaky.load_weight)
        _, body = gw.readiness()
        seen["ready"] = body["models"]["m"]["endpoints"][0]
        await gw.stop()

    run_virtual(main())
    load, weight = seen["fresh"]  # type: ignore[misc]
    assert load == EndpointLoad(running=3, waiting=1, kv_usage=0.5) and weight == 1.0
    # A backend without a load view is asked once, then left alone.
    assert seen["blind"] == (None, 0.0, 1)
    assert 0.2 < seen["aging"] < 0.8  # type: ignore[operator]
    assert seen["gone"] == (None, 0.0)
    ready = seen["ready"]
    assert ready["load"] is None and ready["load_weight"] == 0.0  # type: ignore[index]


class _Slow(BackendBase):
    """A busy engine: its metrics page takes ``delay`` seconds to answer."""

    kind = "slow"

    def __init__(self, spec: object) -> None:
        self.delay = 3.0

    async def load(self) -> EndpointLoad | None:
        await asyncio.sleep(self.delay)
        return EndpointLoad(running=4)


class _SlowPlugin:
    @hookimpl
    def register_backends(self, register):  # type: ignore[no-untyped-def]
        register("slow", _Slow)


def _slow_snapshot(load_block: str) -> tuple[EndpointLoad | None, float]:
    plugins = load_plugins(extra=[("test-backends", _SlowPlugin())])
    text = (
        f"models:\n  m:\n    load: {load_block}\n"
        "    health: {interval_s: 1000}\n    endpoints: [{kind: slow}]\n"
    )
    resolved = load_deployment("d.yaml", plugins, text=text, env={})
    seen: list[tuple[EndpointLoad | None, float]] = []

    async def main() -> None:
        gw = Gateway(resolved, plugins)
        await gw.start()
        (slow,) = gw.pools["m"].endpoints
        await asyncio.sleep(10.0)
        seen.append((slow.load, slow.load_weight))
        await gw.stop()

    run_virtual(main())
    return seen[0]


def test_a_slow_metrics_page_needs_a_longer_load_timeout() -> None:
    # By default a snapshot may take max(interval_s, 1) s: a page answering in 3 s never counts.
    assert _slow_snapshot("{interval_s: 0.25}") == (None, 0.0)
    # With timeout_s above the page's time, every snapshot arrives.
    assert _slow_snapshot("{interval_s: 0.25, timeout_s: 5}") == (EndpointLoad(running=4), 1.0)
