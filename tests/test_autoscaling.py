"""Autoscaling signals: the per-second demand counts and the fitted rate, the capacity grid,
the scaler's arithmetic against a capacity model, the deployment's errors, a live gateway's
gauges and /ready (its capacity computed in a worker process), and the simulated ramp that
shows the desired count rising before the SLO breaks and falling after."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shuniu.core.config.loader import load_deployment
from shuniu.core.contracts import CapacityTarget, TokenMix
from shuniu.core.errors import ConfigError
from shuniu.core.plugin_manager import PluginManager, load_plugins
from shuniu.core.pools.autoscale import PoolScaler, grid_mix, near
from shuniu.core.pools.build import PoolBuilder
from shuniu.core.pools.demand import MIN_TREND_S, Demand, fit_rate
from shuniu.plugins.capacity.simulated import SimulatedCapacity, SimulatedCapacityOptions
from tests.conftest import wait_until


@pytest.fixture(scope="module")
def plugins() -> PluginManager:
    return load_plugins()


# -- demand and the fitted rate ---------------------------------------------------------------


def test_a_steady_rate_is_its_own_forecast_and_a_ramp_is_extrapolated() -> None:
    assert fit_rate([5] * 60, 120) == pytest.approx((5.0, 5.0))
    # One more arrival each second: 0, 1, ..., 59, second j's count placed at its centre
    # j + 0.5, so the line is count = t - 0.5: 59.5 per second at the window's end (t = 60),
    # 89.5 thirty seconds later.
    now, ahead = fit_rate(list(range(60)), 30)
    assert now == pytest.approx(59.5)
    assert ahead == pytest.approx(89.5)
    # A falling rate is never forecast below zero.
    assert fit_rate(list(range(60, 0, -1)), 600)[1] == 0.0
    # Too few seconds for a trend: their mean, both ways.
    assert fit_rate([1, 3] * ((MIN_TREND_S - 1) // 2), 100) == pytest.approx((2.0, 2.0))
    assert fit_rate([], 10) == (0.0, 0.0)


def test_demand_counts_complete_seconds_and_forgets_what_left_the_window() -> None:
    d = Demand(window_s=10)
    d.arrived(100.5, 7)  # the first call's second is partial: not counted
    for sec in range(101, 106):
        for _ in range(sec - 100):  # 1, 2, 3, 4, 5 arrivals
            d.arrived(sec + 0.25, 10)
        d.finished(sec + 0.5, 4)
    counts, prompt, finished, output = d.window(106.0)
    assert counts == [1, 2, 3, 4, 5]
    assert prompt == 150 and finished == 5 and output == 20
    # The current second is not complete yet.
    d.arrived(106.9, 10)
    assert d.window(106.95)[0] == [1, 2, 3, 4, 5]
    # At 115.5 the window is the ten complete seconds 105..114.
    assert d.window(115.5)[0] == [5, 1] + [0] * 8
    # After a silence longer than the window nothing is left.
    assert sum(d.window(200.0)[0]) == 0 and len(d.window(200.0)[0]) == 10


def test_the_mix_is_rounded_towards_less_capacity_and_sticks_near_its_point() -> None:
    point = grid_mix(TokenMix(1000, 250, 0.37))
    assert point.prompt_tokens >= 1000 and point.output_tokens >= 250
    assert point.prompt_tokens < 1000 * 2**0.25 + 1 and point.output_tokens < 250 * 2**0.25 + 1
    assert point.cached_share == pytest.approx(0.3)
    assert grid_mix(TokenMix(1024, 256, 0.0)) == TokenMix(1024, 256, 0.0)
    # Just past the cell's edge is still near it; twice as long is not.
    assert near(TokenMix(point.prompt_tokens * 1.05, 250, 0.35), point)
    assert not near(TokenMix(2000, 250, 0.35), point)
    assert not near(TokenMix(1000, 250, 0.6), point)


# -- the scaler's arithmetic --------------------------------------------------------------------

SCALED = """
models:
  chat:
    autoscaling:
      ttft_p99_s: 1.0
      lead_time_s: 30
      window_s: 30
      headroom: 0.25
      min_replicas: 1
      max_replicas: 8
      capacity: {kind: static, options: {tokens_per_s: 2000}}
    endpoints:
      - kind: sim
        replicas: 2
        options: {ttft_ms: 0, tokens_per_s: 0}
"""


def _scaler(plugins: PluginManager, text: str = SCALED) -> PoolScaler:
    resolved = load_deployment("<test>", plugins, text=text)
    builder = PoolBuilder(plugins)
    pool = builder.build(resolved).pools["chat"]
    cfg = resolved.deployment.models["chat"].autoscaling
    assert cfg is not None
    return PoolScaler(pool, cfg, builder.capacity_model(resolved, "chat"))


def _answer_now(mix: TokenMix, model: Any) -> float:
    return float(model.replica_capacity(mix))


def test_desired_covers_the_forecast_with_headroom_and_follows_the_rate_down(plugins: PluginManager) -> None:
    scaler = _scaler(plugins)
    asked: list[TokenMix] = []

    def submit(mix: TokenMix) -> float:
        asked.append(mix)
        return _answer_now(mix, scaler.model)

    # Nothing has arrived: the floor is enough.
    sig = scaler.evaluate(0.5, submit)
    assert (sig.state, sig.desired, sig.replicas) == ("ready", 1, 2)
    assert scaler.pool.scaling is sig  # what /metrics and /ready read
    # 30 s of a rate rising by 0.5/s each second (1, 1.5, ... arrivals averaged per pair).
    t = 1
    for sec in range(30):
        for _ in range(1 + sec // 2):
            scaler.demand.arrived(t + sec + 0.1, 300)
            scaler.demand.finished(t + sec + 0.2, 100)
    now = t + 30.0
    sig = scaler.evaluate(now, submit)
    counts = scaler.demand.window(now)[0]
    rate, forecast = fit_rate(counts, 30)
    assert (sig.rate, sig.forecast) == pytest.approx((rate, forecast))
    assert forecast > rate > 0
    assert sig.mix == TokenMix(300, 100, 0.0)
    # The capacity was asked once, at the mix's grid point; 2000 tokens/s over the grid
    # point's tokens per request.
    assert asked == [grid_mix(sig.mix)]
    capacity = 2000 / (asked[0].prompt_tokens + asked[0].output_tokens)
    assert sig.capacity == pytest.approx(capacity)
    assert sig.demand == pytest.approx(forecast * 1.25 / capacity)
    assert sig.desired == min(8, math.ceil(sig.demand))
    assert sig.desired > 1
    # The same mix again: answered from the cache, nothing asked.
    scaler.evaluate(now + 1, submit)
    assert len(asked) == 1
    # The load stops: the count falls with the rate now, down to the floor.
    sig = scaler.evaluate(now + 100, submit)
    assert (sig.rate, sig.demand, sig.desired) == (0.0, 0.0, 1)


def test_a_capacity_still_computing_holds_the_count_and_a_failing_one_says_so(plugins: PluginManager) -> None:
    from concurrent.futures import Future

    scaler = _scaler(plugins)
    for sec in range(1, 21):
        for _ in range(20):
            scaler.demand.arrived(sec + 0.1, 100)
            scaler.demand.finished(sec + 0.2, 50)
    pending: Future[float] = Future()
    sig = scaler.evaluate(21.0, lambda mix: pending)
    assert (sig.state, sig.desired, sig.capacity) == ("starting", 2, None)
    pending.set_result(4.0)
    sig = scaler.evaluate(22.0, lambda mix: pytest.fail("asked again"))  # type: ignore[arg-type,return-value]
    assert (sig.state, sig.capacity) == ("ready", 4.0)
    assert sig.desired == min(8, math.ceil(sig.demand or 0))
    # Another mix whose capacity model raises: the state says so and the count holds.
    for sec in range(22, 60):
        for _ in range(20):
            scaler.demand.arrived(sec + 0.1, 5000)
            scaler.demand.finished(sec + 0.2, 50)

    def broken(mix: TokenMix) -> float:
        raise RuntimeError("no profile")

    sig = scaler.evaluate(60.0, broken)
    assert sig.state == "failed" and sig.desired == sig.replicas
    # A capacity of 0 (one replica cannot meet the SLO at all) holds the count too.
    scaler.failed.clear()
    sig = scaler.evaluate(61.0, lambda mix: 0.0)
    assert sig.state == "unreachable" and sig.desired == sig.replicas


# -- the deployment's errors --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("block", "path", "message"),
    [
        ("{lead_time_s: 10}", "models.chat.autoscaling", "at least one SLO target"),
        (
            "{ttft_p99_s: 1, min_replicas: 5, max_replicas: 2}",
            "models.chat.autoscaling",
            "min_replicas (5) is above max_replicas (2)",
        ),
        (
            "{ttft_p99_s: 1, capacity: {kind: psychic}}",
            "models.chat.autoscaling.capacity.kind",
            "unknown capacity model 'psychic'; registered: simulated, static",
        ),
        (
            "{ttft_p99_s: 1, capacity: {kind: static, options: {}}}",
            "models.chat.autoscaling.capacity.options",
            "either requests_per_s or tokens_per_s",
        ),
        (
            "{ttft_p99_s: 1, lead_time_s: -5}",
            "models.chat.autoscaling.lead_time_s",
            "greater than or equal to 0",
        ),
    ],
)
def test_a_bad_autoscaling_block_names_the_field(
    plugins: PluginManager, block: str, path: str, message: str
) -> None:
    text = f"""
models:
  chat:
    autoscaling: {block}
    endpoints: [{{kind: sim}}]
"""
    with pytest.raises(ConfigError) as info:
        load_deployment("<test>", plugins, text=text)
    assert any(p.path == path and message in p.message for p in info.value.problems), info.value.problems


def test_the_simulated_model_needs_an_engine_to_simulate(plugins: PluginManager) -> None:
    target = CapacityTarget("chat", 1.0, None, None, engines=())
    with pytest.raises(ConfigError) as info:
        SimulatedCapacity(SimulatedCapacityOptions(), target)
    assert info.value.problems[0].path == "models.chat.autoscaling.capacity.options.engine"
    with pytest.raises(ConfigError) as info:
        SimulatedCapacity(SimulatedCapacityOptions(engine={"hardware": "h100-sxm"}), target)
    assert "give both `hardware` and `model`" in info.value.problems[0].message


def test_the_simulated_capacity_falls_with_longer_requests_and_rises_with_cached_prefixes() -> None:
    """The planner's simulator, asked for one replica's rate: longer prompts cost prefill,
    a shared cached prefix saves it."""
    target = CapacityTarget("chat", 1.0, None, None)
    model = SimulatedCapacity(
        SimulatedCapacityOptions(
            engine={"hardware": "h100-sxm", "model": "llama-3.1-8b"}, duration_s=30, steps=3
        ),
        target,
    )
    short = model.replica_capacity(TokenMix(500, 100))
    long = model.replica_capacity(TokenMix(4000, 100))
    cached = model.replica_capacity(TokenMix(4000, 100, 0.8))
    assert short > long > 0
    assert cached > long


# -- a live gateway -----------------------------------------------------------------------------


def _metric(text: str, name: str) -> float | None:
    m = re.search(rf'^{name}\{{model="chat"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_a_live_gateway_exports_the_signals_with_a_capacity_computed_in_a_worker_process(
    gateway_factory,  # type: ignore[no-untyped-def]
) -> None:
    gw = gateway_factory(
        textwrap.dedent(
            """
            models:
              chat:
                autoscaling:
                  ttft_p99_s: 2.0
                  lead_time_s: 20
                  window_s: 30
                  interval_s: 0.2
                  capacity: {kind: simulated, options: {duration_s: 20, steps: 2}}
                endpoints:
                  - kind: sim
                    replicas: 2
                    options: {hardware: h100-sxm, model: llama-3.1-8b, ttft_ms: 0}
            """
        )
    )
    client = openai.OpenAI(base_url=gw.base_url, api_key="x", max_retries=0)

    def ready() -> dict[str, Any] | None:
        for i in range(4):
            client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": f"hello {i}"}], max_tokens=8
            )
        signals = httpx.get(f"{gw.url}/ready", timeout=10).json()["models"]["chat"]["autoscaling"]
        return signals if signals["state"] == "ready" and signals["rate"] > 0 else None

    signals = wait_until(ready, timeout=120, interval=0.2)
    assert signals["replica_capacity"] > 0
    assert signals["replicas"] == 2
    assert 1 <= signals["desired"] <= 64
    assert signals["mix"]["output_tokens"] > 0 and signals["mix"]["prompt_tokens"] > 0
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    desired = _metric(text, "shuniu_pool_desired_replicas")
    demand = _metric(text, "shuniu_pool_replica_demand")
    capacity = _metric(text, "shuniu_pool_replica_capacity")
    assert desired is not None and demand is not None and capacity is not None and capacity > 0
    assert desired == max(1, min(64, math.ceil(demand - 1e-9)))
    assert _metric(text, "shuniu_pool_autoscaling_ready") == 1
    assert _metric(text, "shuniu_pool_replicas") == 2


# -- the simulated ramp -------------------------------------------------------------------------

RAMP = """
name: ramp
duration_s: 330
slo: {ttft_p99_s: 1.0}
streams:
  - arrival:
      process: poisson
      schedule:
        - {at_s: 0, rate: 2}
        - {at_s: 30, rate: 2}
        - {at_s: 180, rate: 24, ramp: true}
        - {at_s: 240, rate: 24}
        - {at_s: 300, rate: 2, ramp: true}
    input_tokens: {dist: lognormal, mean: 800, sigma: 0.5, min: 16, max: 4000}
    output_tokens: {dist: lognormal, mean: 120, sigma: 0.5, min: 8, max: 600}
"""


def _ramp_deployment(lead_time_s: float) -> str:
    return f"""
models:
  chat:
    scheduler: {{policy: fifo}}
    balancer: {{policy: least_load}}
    autoscaling:
      ttft_p99_s: 1.0
      lead_time_s: {lead_time_s}
      window_s: 40
      interval_s: 5
      max_replicas: 16
      capacity: {{kind: simulated, options: {{duration_s: 30, steps: 4}}}}
    endpoints:
      - kind: sim
        replicas: 2
        max_concurrency: 0
        options: {{hardware: l40s, model: llama-3.1-8b}}
"""


def test_a_ramp_raises_the_desired_count_before_the_slo_breaks_and_lowers_it_after(
    plugins: PluginManager, tmp_path: Path
) -> None:
    from shuniu.core.traffic import load_workload
    from shuniu.plugins.tools.simulate import simulate

    (tmp_path / "ramp.yaml").write_text(RAMP)
    workload = load_workload(tmp_path / "ramp.yaml")
    summaries = {}
    for lead in (40.0, 0.0):
        resolved = load_deployment("<ramp>", plugins, text=_ramp_deployment(lead))
        result = simulate(resolved, plugins, workload, seed=3)
        summaries[lead] = result.scaling_summary()["chat"]
    ahead, now_only = summaries[40.0], summaries[0.0]
    # The two fixed replicas break the SLO somewhere up the ramp...
    assert ahead["slo_broken_at_s"] is not None
    # ...and the signal asked for more before that, by a margin.
    assert ahead["rose_at_s"] is not None and ahead["lead_s"] > 0
    assert ahead["peak_desired"] > 2
    # After the ramp down it comes back to the two (or fewer) replicas.
    assert ahead["fell_at_s"] is not None and ahead["fell_at_s"] > ahead["peak_at_s"]
    # The look-ahead is what puts it early: the rate now alone rises later.
    assert now_only["rose_at_s"] is not None and ahead["rose_at_s"] < now_only["rose_at_s"]


def test_a_reload_keeps_the_counts_and_the_computed_capacities(
    plugins: PluginManager, tmp_path: Path
) -> None:
    import asyncio

    from shuniu.core.gateway import Gateway

    path = tmp_path / "deployment.yaml"
    path.write_text(SCALED)

    async def run() -> None:
        # Capacities inline (as under shuniu simulate), so an evaluation answers at once.
        gw = Gateway(load_deployment(path, plugins), plugins, virtual_time=True)
        await gw.start()
        t0 = math.floor(asyncio.get_running_loop().time()) + 1
        try:
            old_pool = gw.pools["chat"]
            demand = old_pool.demand
            assert demand is not None
            for sec in range(t0, t0 + 30):
                demand.arrived(sec + 0.1, 100)
                demand.finished(sec + 0.2, 10)
            gw.autoscalers.evaluate(t0 + 30.0, force=True)
            scaler = gw.autoscalers.scalers["chat"]
            assert scaler.capacities
            # A reload that changes the balancer: new pool objects, the same counts.
            path.write_text(
                SCALED.replace("    autoscaling:", "    balancer: {policy: least_load}\n    autoscaling:")
            )
            await gw.reload()
            assert gw.pools["chat"] is not old_pool and gw.pools["chat"].demand is demand
            gw.autoscalers.evaluate(t0 + 31.0, force=True)
            assert gw.autoscalers.scalers["chat"] is scaler and scaler.pool is gw.pools["chat"]
            assert gw.pools["chat"].scaling is scaler.signals and scaler.signals.rate > 0
            # A reload that changes the SLO: a new scaler, its capacities computed afresh.
            path.write_text(SCALED.replace("ttft_p99_s: 1.0", "ttft_p99_s: 3.0"))
            await gw.reload()
            gw.autoscalers.evaluate(t0 + 32.0, force=True)
            assert gw.autoscalers.scalers["chat"] is not scaler
        finally:
            gw.state.draining = True
            await gw.stop()

    asyncio.run(run())


async def test_gateways_sharing_state_each_ask_for_the_fleets_replicas(plugins: PluginManager) -> None:
    """With ``fleet:`` the gateways say what they see; each one's desired count covers the
    fleet's demand, while its replica_demand gauge stays its own share."""
    from shuniu.core.fleet import MemoryHub
    from shuniu.core.gateway import Gateway

    hub = MemoryHub()
    text = SCALED.replace("tokens_per_s: 2000", "requests_per_s: 4")
    a, b = (
        Gateway(load_deployment("<a>", plugins, text=text), plugins, fleet=hub.transport(), virtual_time=True)
        for _ in range(2)
    )
    assert a.fleet is not None and b.fleet is not None
    t0 = 1000
    for gw, per_second in ((a, 6), (b, 3)):
        demand = gw.pools["chat"].demand
        assert demand is not None
        for sec in range(t0, t0 + 30):
            for _ in range(per_second):
                demand.arrived(sec + 0.1, 100)
                demand.finished(sec + 0.2, 10)
    now = t0 + 30.0
    for gw in (a, b):
        gw.autoscalers.evaluate(now, force=True)
    alone = a.pools["chat"].scaling
    assert alone is not None and alone.peers == 0
    assert alone.desired == math.ceil(6 * 1.25 / 4)  # 2: its own traffic only
    for gw in (a, b, a):
        await gw.fleet.sync_once()  # type: ignore[union-attr]
    a.autoscalers.evaluate(now, force=True)
    sig = a.pools["chat"].scaling
    assert sig is not None and sig.peers == 1
    assert sig.fleet_ahead == pytest.approx(9.0)
    assert sig.demand == pytest.approx(6 * 1.25 / 4)  # the gauge to sum stays its share
    assert sig.desired == math.ceil(9 * 1.25 / 4)  # 3: the fleet's
    # A peer that stops publishing is forgotten, and with it its demand.
    a.fleet.stale_after_s = 0.0
    await a.fleet.sync_once()
    a.autoscalers.evaluate(now, force=True)
    assert a.pools["chat"].scaling.peers == 0  # type: ignore[union-attr]
