"""Routing rules, version splits and pins, and composed balancers, built from deployments."""

from __future__ import annotations

import collections
import json
import textwrap

import pytest

from shuniu.core.api.openai import parse_request
from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError, GatewayError
from shuniu.core.gateway import Gateway
from shuniu.core.plugin_manager import PluginManager, load_plugins
from shuniu.core.pools.composite import Composite
from shuniu.core.types import InferenceRequest, Outcome, Principal

SIM = "{kind: sim, options: {tokens_per_s: 1000}}"


@pytest.fixture(scope="module")
def plugins() -> PluginManager:
    return load_plugins()


def _gateway(plugins: PluginManager, text: str) -> Gateway:
    return Gateway(load_deployment("d.yaml", plugins, text=textwrap.dedent(text), env={}), plugins)


def _req(api: str = "chat", words: int = 3, tier: str = "default", headers: tuple = ()) -> InferenceRequest:
    content = " ".join(["word"] * words)
    body = (
        {"model": "chat", "messages": [{"role": "user", "content": content}]}
        if api == "chat"
        else {"model": "chat", "prompt": content}
    )
    req = parse_request(json.dumps(body).encode(), api, "r", 0.0)  # type: ignore[arg-type]
    req.principal = Principal(tier=tier)
    req.headers = headers
    return req


ROUTED = f"""
models:
  chat:
    routes:
      - {{tiers: [free], to: small}}
      - {{min_prompt_tokens: 1000, to: long}}
      - {{api: [completions], max_prompt_tokens: 10, to: small}}
    endpoints: [{SIM}]
  small:
    endpoints: [{SIM}]
  long:
    endpoints: [{SIM}]
"""


def test_rules_pick_the_pool_first_match_wins(plugins: PluginManager) -> None:
    gw = _gateway(plugins, ROUTED)
    chat = gw.pools["chat"]

    def route(req: InferenceRequest) -> str:
        return gw.router.resolve(req, chat).name

    assert route(_req()) == "chat"
    assert route(_req(tier="free")) == "small"
    assert route(_req(words=2000)) == "long"
    assert route(_req(words=2000, tier="free")) == "small"  # the first matching rule wins
    assert route(_req(api="completions", words=3)) == "small"
    assert route(_req(api="completions", words=30)) == "chat"
    # one hop only: the target's own rules are not applied (small has none; chat's are skipped)
    assert gw.router.resolve(_req(tier="free"), gw.pools["small"]).name == "small"


def test_rule_targets_must_exist(plugins: PluginManager) -> None:
    bad = ROUTED.replace("to: long", "to: longer")
    with pytest.raises(ConfigError) as err:
        _gateway(plugins, bad)
    assert "no model named 'longer'" in str(err.value)
    with pytest.raises(ConfigError) as err:
        _gateway(plugins, ROUTED.replace("to: long}", "to: chat}"))
    assert "cannot route to itself" in str(err.value)


SPLIT = """
models:
  chat:
    traffic: {v1: 90, v2: 10}
    endpoints:
      - {kind: sim, replicas: 3, version: v1}
      - {kind: sim, version: v2}
"""


def test_traffic_split_draws_versions_by_weight(plugins: PluginManager) -> None:
    gw = _gateway(plugins, SPLIT)
    pool = gw.pools["chat"]
    counts: collections.Counter[str | None] = collections.Counter()
    n = 20_000
    for _ in range(n):
        req = _req()
        gw.router.resolve(req, pool)
        counts[req.version] += 1
    assert set(counts) == {"v1", "v2"}
    # binomial: sd = sqrt(n p (1-p)) = 42; 5 sd either way
    assert abs(counts["v2"] - 2000) < 5 * 43


def test_version_split_limits_dispatch_to_that_version(plugins: PluginManager) -> None:
    gw = _gateway(plugins, SPLIT)
    pool = gw.pools["chat"]
    for _ in range(50):
        req = _req()
        gw.router.resolve(req, pool)
        ticket = pool.try_dispatch(req, 0.0)
        assert ticket is not None and ticket.endpoint.version == req.version
        pool.free(ticket, Outcome.OK)


def test_pin_header_overrides_the_split(plugins: PluginManager) -> None:
    gw = _gateway(plugins, SPLIT)
    pool = gw.pools["chat"]
    for _ in range(20):
        req = _req(headers=((b"x-shuniu-version", b"v2"),))
        gw.router.resolve(req, pool)
        assert req.version == "v2"
    with pytest.raises(GatewayError) as err:
        gw.router.resolve(_req(headers=((b"x-shuniu-version", b"v3"),)), pool)
    assert err.value.status == 400 and err.value.code == "invalid_version"
    assert "v1, v2" in err.value.message


def test_traffic_must_name_existing_versions(plugins: PluginManager) -> None:
    with pytest.raises(ConfigError) as err:
        _gateway(plugins, SPLIT.replace("v2: 10", "v3: 10"))
    assert "traffic names version 'v3'" in str(err.value)
    with pytest.raises(ConfigError):
        _gateway(plugins, SPLIT.replace("v1: 90, v2: 10", "v1: 0"))


COMPOSED = """
models:
  chat:
    balancer:
      filters: [{name: locality, options: {value: a}}]
      scorers: [{name: prefix, weight: 0.6}, {name: load, weight: 0.4}]
    endpoints:
      - {kind: sim, replicas: 2, labels: {zone: a}}
      - {kind: sim, replicas: 2, labels: {zone: b}}
"""


def test_composed_balancer_is_built_from_filters_and_scorers(plugins: PluginManager) -> None:
    gw = _gateway(plugins, COMPOSED)
    pool = gw.pools["chat"]
    assert isinstance(pool.balancer, Composite)
    picked = collections.Counter()
    for i in range(8):
        req = _req(words=200 + i)
        t = pool.try_dispatch(req, 0.0)
        assert t is not None
        picked[t.endpoint.labels["zone"]] += 1
    assert picked == {"a": 8}  # the local zone while it has free slots


@pytest.mark.parametrize(
    ("balancer", "message"),
    [
        ("{scorers: [{name: nope}]}", "unknown scorer 'nope'"),
        ("{filters: [{name: nope}], scorers: [{name: load}]}", "unknown filter 'nope'"),
        ("{policy: least_load, scorers: [{name: load}]}", "not both"),
        ("{filters: [{name: locality, options: {value: a}}]}", "need at least one scorer"),
        ("{scorers: [{name: load, options: {kv: -1}}]}", "kv"),
        ("{scorers: [{name: load, weight: 0}]}", "weight"),
    ],
)
def test_composed_balancer_config_errors(plugins: PluginManager, balancer: str, message: str) -> None:
    text = f"""
    models:
      chat:
        balancer: {balancer}
        endpoints: [{{kind: sim}}]
    """
    with pytest.raises(ConfigError) as err:
        _gateway(plugins, text)
    assert message in str(err.value)
    assert "models.chat.balancer" in str(err.value)
