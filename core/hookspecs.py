"""The hooks a shuniu plugin may implement.

Registration hooks run once, at start-up, and receive a typed ``register`` callback (the
pattern of simonw/llm's ``register_models``); each names the contract of
:mod:`shuniu.core.contracts` its factories return. Lifecycle hooks run once per gateway. The one
per-request hook, :func:`request_finished`, is resolved at start-up into a plain list of
callables: the hot path never goes through ``pm.hook``.

Every hookspec here is documented in ``docs/plugins.md`` (a test checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from shuniu.core.contracts import (
        CommandGroup,
        RegisterAuthenticator,
        RegisterBackend,
        RegisterBalancer,
        RegisterCacheStore,
        RegisterCapacityModel,
        RegisterClassifier,
        RegisterDiscovery,
        RegisterFileStore,
        RegisterFilter,
        RegisterHardwareProbe,
        RegisterRateLimitStore,
        RegisterScheduler,
        RegisterScorer,
    )
    from shuniu.core.types import RequestRecord

__all__ = ["PROJECT", "hookimpl", "hookspec"]

PROJECT = "shuniu"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_backends(register: RegisterBackend) -> None:
    """Register engine backends (the ``kind:`` of an endpoint).

    When: once per process, at start-up, before any deployment is checked.
    Call ``register(kind, factory, options=OptionsModel, description=...)`` per backend:
    ``factory(spec: EndpointSpec)`` returns a :class:`shuniu.core.contracts.Backend`, one
    per endpoint; ``OptionsModel`` (a subclass of :class:`shuniu.core.config.Options`)
    validates the endpoint's ``options:``. Return value ignored; not ``firstresult``. A kind
    registered twice is a start-up error naming both plugins.
    """


@hookspec
def register_balancers(register: RegisterBalancer) -> None:
    """Register load balancers (the ``balancer.policy`` of a model).

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.contracts.Balancer`, one per pool.
    Return value ignored; not ``firstresult``.
    """


@hookspec
def register_filters(register: RegisterFilter) -> None:
    """Register endpoint filters for composed balancers (a model's ``balancer.filters``).

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.contracts.Filter`, one per pool.
    Return value ignored; not ``firstresult``.
    """


@hookspec
def register_scorers(register: RegisterScorer) -> None:
    """Register endpoint scorers for composed balancers (a model's ``balancer.scorers``).

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.contracts.Scorer`, one per pool.
    Return value ignored; not ``firstresult``.
    """


@hookspec
def register_schedulers(register: RegisterScheduler) -> None:
    """Register request schedulers (the ``scheduler.policy`` of a model).

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.contracts.Scheduler`, one per pool.
    Return value ignored; not ``firstresult``.
    """


@hookspec
def register_caches(register: RegisterCacheStore) -> None:
    """Register response-cache stores (the ``cache.store`` of a deployment).

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.contracts.CacheStore`, one per
    gateway. Return value ignored; not ``firstresult``.
    """


@hookspec
def register_file_stores(register: RegisterFileStore) -> None:
    """Register file stores (the ``files.store`` of a deployment): where the Files API keeps
    uploads and the gateway keeps the files it writes (a batch's output and errors).

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.contracts.FileStore`, one per
    gateway. Return value ignored; not ``firstresult``.
    """


@hookspec
def register_rate_limiters(register: RegisterRateLimitStore) -> None:
    """Register rate-limit stores (the ``rate_limits.store`` of a deployment).

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.contracts.RateLimitStore`, one per
    gateway. Return value ignored; not ``firstresult``.
    """


@hookspec
def register_authenticators(register: RegisterAuthenticator) -> None:
    """Register authenticators (the ``kind:`` of an ``auth.authenticators`` entry), which
    turn a request's credential into a :class:`shuniu.core.types.Principal`.

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.contracts.Authenticator`. Options
    that subclass :class:`shuniu.core.contracts.AuthenticatorOptions` tell the deployment
    check which tiers and models their credentials name. Return value ignored; not
    ``firstresult``.
    """


@hookspec
def register_hardware(register: RegisterHardwareProbe) -> None:
    """Register hardware probes (NVIDIA, Ascend, CPU) that report devices and memory.

    When: once per process, at start-up. ``register(name, factory)``; ``factory(options)``
    returns a :class:`shuniu.core.contracts.HardwareProbe` whose ``probe()`` returns a
    :class:`shuniu.core.contracts.ProbeReport` (synchronous, run in a worker thread; a
    missing library or driver is an unavailable report, not an exception). Return value
    ignored; not ``firstresult``.
    """


@hookspec
def register_classifiers(register: RegisterClassifier) -> None:
    """Register request classifiers (the ``classifier.kind`` of a model).

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.contracts.Classifier`, one per model,
    whose ``classify(req)`` labels each request before the model's routing rules (which
    match on ``labels``). Return value ignored; not ``firstresult``.
    """


@hookspec
def register_discovery(register: RegisterDiscovery) -> None:
    """Register discovery sources (the ``discovery.kind`` of an endpoint entry), which find
    a pool's engines at run time instead of the file listing them.

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.contracts.Discovery`, one per entry,
    whose ``watch()`` yields the whole current set of
    :class:`shuniu.core.contracts.Target` each time it may have changed; the gateway adds,
    drains and removes endpoints to match, off the request path. Return value ignored; not
    ``firstresult``.
    """


@hookspec
def register_capacity_models(register: RegisterCapacityModel) -> None:
    """Register capacity models (the ``autoscaling.capacity.kind`` of a model), which say
    how many requests per second one replica serves within the pool's SLO.

    When: once per process, at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options, target)`` returns a :class:`shuniu.core.contracts.CapacityModel` for
    one pool (``target``: a :class:`shuniu.core.contracts.CapacityTarget`, the pool's SLO and
    endpoint entries), whose ``replica_capacity(mix)`` the autoscaling signals call off the
    request path, once per new token mix. Return value ignored; not ``firstresult``.
    """


@hookspec
def register_commands(cli: CommandGroup) -> None:
    """Add subcommands to the ``shuniu`` command line.

    When: once, when the CLI is built, with the root :data:`shuniu.core.contracts.CommandGroup`
    (a :class:`click.Group`); add commands with ``cli.add_command`` or ``@cli.command()``.
    Import what a command needs inside the hook or the command, not at module level:
    every start of ``shuniu`` loads every plugin. Return value ignored; not ``firstresult``.
    """


@hookspec
def gateway_startup(gateway: Any) -> Awaitable[None] | None:
    """The gateway has built its pools and started its backends; traffic starts next.

    When: once per gateway process, with the :class:`shuniu.core.gateway.Gateway` (read
    ``gateway.state``, a :class:`shuniu.core.state.StateView`). Return ``None`` or an
    awaitable, which is awaited before the first request is served; not ``firstresult``.
    """


@hookspec
def gateway_shutdown(gateway: Any) -> Awaitable[None] | None:
    """The gateway has drained and is about to stop its backends.

    When: once per gateway process, with the gateway. Return ``None`` or an awaitable,
    which is awaited; an exception is logged and the shutdown goes on. Not ``firstresult``.
    """


@hookspec
def request_finished(record: RequestRecord) -> None:
    """A request has ended (success, error or client disconnect).

    Called once per request, after the last byte was sent, with a
    :class:`shuniu.core.types.RequestRecord`. Implementations are collected at start-up
    and called directly, not through ``pm.hook``; they must be quick and must not block
    (hand slow work to a task or a queue). Exceptions are logged and ignored.
    Return value ignored; not ``firstresult``.
    """
