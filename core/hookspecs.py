"""The hooks a shuniu plugin may implement.

Registration hooks run once, at start-up, and receive a ``register`` callback (the pattern
of simonw/llm's ``register_models``). Lifecycle hooks run once per gateway. The one
per-request hook, :func:`request_finished`, is resolved at start-up into a plain list of
callables: the hot path never goes through ``pm.hook``.

Every hookspec here is documented in ``docs/plugins.md`` (a test checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import click

    from shuniu.core.types import RequestRecord

__all__ = ["PROJECT", "hookimpl", "hookspec"]

PROJECT = "shuniu"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def register_backends(register: Callable[..., None]) -> None:
    """Register engine backends (the ``kind:`` of an endpoint).

    Called once at start-up. Call ``register(kind, factory, options=OptionsModel,
    description=...)`` for each backend: ``factory(spec: EndpointSpec)`` returns an object
    implementing :class:`shuniu.core.interfaces.Backend`; ``OptionsModel`` (a subclass of
    :class:`shuniu.core.config.Options`) validates the endpoint's ``options:``.
    Return value ignored. A kind registered twice is a start-up error naming both plugins.
    """


@hookspec
def register_balancers(register: Callable[..., None]) -> None:
    """Register load balancers (the ``balancer.policy`` of a model).

    Called once at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.interfaces.Balancer`, one per pool.
    Return value ignored.
    """


@hookspec
def register_filters(register: Callable[..., None]) -> None:
    """Register endpoint filters for composed balancers (a model's ``balancer.filters``).

    Called once at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.interfaces.Filter`, one per pool.
    Return value ignored.
    """


@hookspec
def register_scorers(register: Callable[..., None]) -> None:
    """Register endpoint scorers for composed balancers (a model's ``balancer.scorers``).

    Called once at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.interfaces.Scorer`, one per pool.
    Return value ignored.
    """


@hookspec
def register_schedulers(register: Callable[..., None]) -> None:
    """Register request schedulers (the ``scheduler.policy`` of a model).

    Called once at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.interfaces.Scheduler`, one per pool.
    Return value ignored.
    """


@hookspec
def register_caches(register: Callable[..., None]) -> None:
    """Register response caches.

    Called once at start-up. ``register(name, factory, options=OptionsModel)``;
    ``factory(options)`` returns a :class:`shuniu.core.interfaces.Cache`.
    Return value ignored.
    """


@hookspec
def register_rate_limiters(register: Callable[..., None]) -> None:
    """Register rate-limit stores and algorithms.

    Called once at start-up. ``register(name, factory, options=OptionsModel)``.
    Return value ignored.
    """


@hookspec
def register_authenticators(register: Callable[..., None]) -> None:
    """Register authenticators (API keys, JWT, ...), which turn request headers into a
    :class:`shuniu.core.types.Principal`.

    Called once at start-up. ``register(name, factory, options=OptionsModel)``.
    Return value ignored.
    """


@hookspec
def register_hardware(register: Callable[..., None]) -> None:
    """Register hardware probes (NVIDIA, Ascend, CPU) that report devices and memory.

    Called once at start-up. ``register(name, factory)``; ``factory()`` returns an object
    with ``probe() -> shuniu.hardware.ProbeReport`` (synchronous, run in a worker thread;
    a missing library or driver is an unavailable report, not an exception).
    Return value ignored.
    """


@hookspec
def register_commands(cli: click.Group) -> None:
    """Add subcommands to the ``shuniu`` command line.

    Called once when the CLI is built, with the root :class:`click.Group`; add commands with
    ``@cli.command()``. Return value ignored.
    """


@hookspec
def gateway_startup(gateway: Any) -> Awaitable[None] | None:
    """The gateway has built its pools and started its backends; traffic starts next.

    Called once per gateway process with the :class:`shuniu.core.gateway.Gateway`. Return
    ``None`` or an awaitable, which is awaited before the first request is served.
    """


@hookspec
def gateway_shutdown(gateway: Any) -> Awaitable[None] | None:
    """The gateway has drained and is about to stop its backends.

    Called once per gateway process. Return ``None`` or an awaitable, which is awaited.
    """


@hookspec
def request_finished(record: RequestRecord) -> None:
    """A request has ended (success, error or client disconnect).

    Called once per request, after the last byte was sent, with a
    :class:`shuniu.core.types.RequestRecord`. Implementations are collected at start-up
    and called directly, not through ``pm.hook``; they must be quick and must not block
    (hand slow work to a task or a queue). Exceptions are logged and ignored.
    Return value ignored.
    """
