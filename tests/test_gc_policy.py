"""The gateway's cyclic-GC policy: the young-generation threshold it serves with
(``gateway.gc_young_threshold``), put back when it stops, and the collector's pauses in
``/metrics``."""

from __future__ import annotations

import asyncio
import gc
import textwrap

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError
from shuniu.core.gateway import Gateway
from shuniu.core.plugin_manager import load_plugins
from tests.conftest import start_gateway

SIM = """
models:
  m:
    health: {interval_s: 1000}
    load: {interval_s: 1000}
    endpoints:
      - {kind: sim, options: {ttft_ms: 1, tokens_per_s: 100000}}
"""


def _gateway(gateway_block: str) -> Gateway:
    plugins = load_plugins()
    text = textwrap.dedent(gateway_block) + textwrap.dedent(SIM)
    return Gateway(load_deployment("d.yaml", plugins, text=text, env={}), plugins)


def test_the_threshold_holds_while_serving_and_is_put_back() -> None:
    before = gc.get_threshold()
    seen: dict[str, object] = {}

    async def main() -> None:
        gw = _gateway("gateway: {gc_young_threshold: 12345}\n")
        await gw.start()
        seen["serving"] = gc.get_threshold()
        assert gw.metrics is not None
        watched = gw.metrics.gc.collections[0]
        gc.collect(0)
        seen["counted"] = gw.metrics.gc.collections[0] - watched
        await gw.stop()
        stopped = gw.metrics.gc.collections[0]
        gc.collect(0)
        seen["after stop"] = gw.metrics.gc.collections[0] - stopped

    asyncio.run(main())
    assert seen["serving"] == (12345, *before[1:])
    assert gc.get_threshold() == before
    assert seen["counted"] == 1
    assert seen["after stop"] == 0


def test_none_leaves_the_interpreters_threshold() -> None:
    before = gc.get_threshold()
    seen: dict[str, object] = {}

    async def main() -> None:
        gw = _gateway("gateway: {gc_young_threshold: null}\n")
        await gw.start()
        seen["serving"] = gc.get_threshold()
        await gw.stop()

    asyncio.run(main())
    assert seen["serving"] == before == gc.get_threshold()


def test_a_threshold_too_small_is_refused_with_its_field() -> None:
    with pytest.raises(ConfigError) as info:
        _gateway("gateway: {gc_young_threshold: 5}\n")
    (problem,) = info.value.problems
    assert problem.path == "gateway.gc_young_threshold"
    assert "100" in problem.message


def test_pauses_are_in_metrics(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A threshold at its floor: each request's objects alone cross it, so young collections
    # run while requests are served, and the counters must move.
    gw = start_gateway("gateway: {gc_young_threshold: 100}\n" + SIM, tmp_path)
    try:

        def gc_samples() -> dict[tuple[str, str], float]:
            text = httpx.get(f"{gw.url}/metrics", timeout=30).text
            return {
                (s.name, s.labels["generation"]): s.value
                for family in text_string_to_metric_families(text)
                if family.name.startswith("shuniu_gc_")
                for s in family.samples
            }

        before = gc_samples()
        assert {g for _, g in before} == {"0", "1", "2"}
        client = openai.OpenAI(base_url=gw.base_url, api_key="none", max_retries=0)
        for i in range(20):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"hi {i}"}])
        after = gc_samples()
        assert after[("shuniu_gc_collections_total", "0")] > before[("shuniu_gc_collections_total", "0")]
        assert after[("shuniu_gc_pause_seconds_total", "0")] > before[("shuniu_gc_pause_seconds_total", "0")]
    finally:
        gw.stop()
