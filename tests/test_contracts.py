"""The plugin contracts (``shuniu.core.contracts``): what a factory returns is checked at
start-up, missing optional members get the contract's defaults, and a missing required one
is an error that names the plugin and the member."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from shuniu.core import hookimpl
from shuniu.core.config.loader import load_deployment
from shuniu.core.contracts import (
    Backend,
    Balancer,
    EndpointView,
    RegisterBackend,
    RegisterBalancer,
    RegisterScheduler,
    Scheduler,
    Scorer,
    conform,
)
from shuniu.core.errors import ConfigError
from shuniu.core.gateway import Gateway
from shuniu.core.plugin_manager import load_plugins
from shuniu.core.types import Chunk, InferenceRequest, Usage


class PlainBackend:
    """A backend that does not subclass the contract and has only ``stream``."""

    kind = "plain"
    max_model_len = None

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    async def stream(self, req: InferenceRequest) -> AsyncIterator[Chunk]:
        yield Chunk("hi", 1)
        yield Chunk("", 0, "stop", Usage(1, 1, 2))


class NoPick:
    """A "balancer" without ``pick``."""

    def __init__(self, options: Any = None) -> None:
        pass


class SlotsScheduler:
    """A scheduler with ``__slots__`` and without the optional members: no room for them."""

    __slots__ = ()

    def __init__(self, options: Any = None) -> None:
        pass

    async def admit(self, req: Any, pool: Any) -> Any: ...

    def release(self, ticket: Any, outcome: Any) -> None: ...

    def wake(self, pool: Any) -> None: ...


class Plugin:
    @hookimpl
    def register_backends(self, register: RegisterBackend) -> None:
        register("plain", PlainBackend)

    @hookimpl
    def register_balancers(self, register: RegisterBalancer) -> None:
        register("no_pick", NoPick)

    @hookimpl
    def register_schedulers(self, register: RegisterScheduler) -> None:
        register("slots", SlotsScheduler)


DEPLOYMENT = """
models:
  m:
    balancer: {{policy: {balancer}}}
    scheduler: {{policy: {scheduler}}}
    endpoints:
      - kind: plain
"""


def _gateway(balancer: str = "round_robin", scheduler: str = "fifo") -> Gateway:
    plugins = load_plugins(extra=[("contract_test", Plugin())])
    text = DEPLOYMENT.format(balancer=balancer, scheduler=scheduler)
    return Gateway(load_deployment(None, plugins, text=text), plugins)


async def test_a_backend_without_the_optional_members_gets_their_defaults() -> None:
    gateway = _gateway()
    backend = gateway.pools["m"].endpoints[0].backend
    assert isinstance(backend, PlainBackend)
    await backend.start()
    assert (await backend.health()).ok and await backend.load() is None and await backend.devices() is None
    req = InferenceRequest(id="r", api="completions", model="m", body={}, prompt="p", prompt_tokens=1)
    result = await backend.complete(req)  # the default gathers the stream
    assert (result.text, result.finish_reason, result.usage.total_tokens) == ("hi", "stop", 2)


def test_a_missing_required_member_names_the_plugin_and_the_member() -> None:
    with pytest.raises(ConfigError) as caught:
        _gateway(balancer="no_pick")
    text = str(caught.value)
    assert "plugin contract_test" in text and "balancer 'no_pick' is missing pick" in text


def test_an_optional_member_that_cannot_be_attached_asks_for_the_subclass() -> None:
    with pytest.raises(ConfigError, match=r"scheduler 'slots' is missing adopt_tiers \(optional: subclass"):
        _gateway(scheduler="slots")


def test_subclasses_inherit_the_defaults_and_conform_at_once() -> None:
    class Builtin(Balancer):
        def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
            return endpoints[0]

    class Memoryless(Scorer):
        def score(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
            return [1.0] * len(endpoints)

    assert conform(Builtin(), Balancer) == []
    scorer = Memoryless()
    assert conform(scorer, Scorer) == [] and scorer.picked(None, None) is None  # type: ignore[arg-type]


def test_every_builtin_plugin_object_subclasses_its_contract() -> None:
    """Built-ins inherit the defaults instead of relying on them being attached."""
    plugins = load_plugins()
    gateway = Gateway(load_deployment(None, plugins), plugins)
    pool = next(iter(gateway.pools.values()))
    assert Scheduler in type(pool.scheduler).__mro__
    assert Backend in type(pool.endpoints[0].backend).__mro__
    for name, reg in plugins.registered("balancers").items():
        made = reg.factory(reg.options() if reg.options is not None else None)
        assert Balancer in type(made).__mro__, name
