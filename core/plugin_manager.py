"""The plugin manager: loads the ``shuniu.plugins`` entry points and resolves what the
plugins registered into plain dictionaries, once, at start-up.

It is the only registry in shuniu: there are no module-level mutable registries.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Literal

import pluggy

from shuniu.core import hookspecs
from shuniu.core.contracts import Registration
from shuniu.core.errors import ConfigError, Problem

__all__ = [
    "ENTRY_POINT_GROUP",
    "FailedPlugin",
    "PluginInfo",
    "PluginManager",
    "load_plugins",
    "singular",
]

log = logging.getLogger("shuniu.plugins")

ENTRY_POINT_GROUP = "shuniu.plugins"
ALLOW_ENV = "SHUNIU_PLUGINS"
DENY_ENV = "SHUNIU_DISABLE_PLUGINS"

Category = Literal[
    "backends",
    "balancers",
    "filters",
    "scorers",
    "schedulers",
    "caches",
    "file_stores",
    "rate_limiters",
    "authenticators",
    "hardware",
    "classifiers",
    "discovery",
    "capacity_models",
]
CATEGORIES: tuple[Category, ...] = (
    "backends",
    "balancers",
    "filters",
    "scorers",
    "schedulers",
    "caches",
    "file_stores",
    "rate_limiters",
    "authenticators",
    "hardware",
    "classifiers",
    "discovery",
    "capacity_models",
)


def singular(category: Category) -> str:
    """One of the category's things: ``backends`` → ``backend``; ``hardware`` and
    ``discovery`` are their own singular."""
    return category if category in ("hardware", "discovery") else category[:-1]


@dataclass(frozen=True, slots=True)
class FailedPlugin:
    """A plugin that could not be loaded, with the reason."""

    name: str
    distribution: str
    version: str
    error: str


@dataclass(frozen=True, slots=True)
class PluginInfo:
    """One loaded plugin, as ``shuniu plugins`` lists it."""

    name: str
    distribution: str
    version: str
    hooks: tuple[str, ...]


def _normalize(name: str) -> str:
    """PEP 503 normalization, so ``shuniu_least_busy`` matches ``shuniu-least-busy``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _csv_env(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return {_normalize(part.strip()) for part in raw.split(",") if part.strip()}


@dataclass
class PluginManager:
    """A typed facade over :class:`pluggy.PluginManager`."""

    pm: pluggy.PluginManager = field(default_factory=lambda: pluggy.PluginManager(hookspecs.PROJECT))
    failed: list[FailedPlugin] = field(default_factory=list)
    _dists: dict[str, tuple[str, str]] = field(default_factory=dict)
    _registry: dict[Category, dict[str, Registration]] | None = None

    def __post_init__(self) -> None:
        self.pm.add_hookspecs(hookspecs)

    # -- loading -----------------------------------------------------------------------

    def load_entry_points(self) -> None:
        """Load every ``shuniu.plugins`` entry point allowed by the environment.

        ``SHUNIU_PLUGINS`` (comma-separated entry-point or distribution names) is an
        allow-list; ``SHUNIU_DISABLE_PLUGINS`` a deny-list. A plugin that fails to import or
        to register is recorded in :attr:`failed` and reported; it does not stop the others.
        """
        allow = _csv_env(ALLOW_ENV)
        deny = _csv_env(DENY_ENV) or set()
        for ep in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=_ep_key):
            dist = ep.dist.name if ep.dist is not None else "?"
            version = ep.dist.version if ep.dist is not None else "?"
            names = {_normalize(ep.name), _normalize(dist)}
            if allow is not None and not (names & allow):
                continue
            if names & deny:
                continue
            if self.pm.get_plugin(ep.name) is not None:
                taken_by = self._dists.get(ep.name, ("?", "?"))[0]
                if _normalize(taken_by) != _normalize(dist):
                    self._fail(
                        ep.name,
                        dist,
                        version,
                        f"plugin name {ep.name!r} is already taken by distribution {taken_by!r}",
                    )
                continue  # else: the same distribution visible twice on sys.path
            try:
                module = ep.load()
            except Exception as exc:  # a broken third-party plugin must not stop the rest
                self._fail(ep.name, dist, version, f"{type(exc).__name__}: {exc}")
                continue
            self.register(module, ep.name, distribution=dist, version=version)

    def register(
        self,
        plugin: ModuleType | object,
        name: str,
        *,
        distribution: str = "(in code)",
        version: str = "",
    ) -> bool:
        """Register one plugin object or module; on a bad hook signature record a failure."""
        try:
            self.pm.register(plugin, name=name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            self._fail(name, distribution, version, str(exc))
            return False
        self._dists[name] = (distribution, version)
        self._registry = None
        return True

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self._registry = None

    def check(self) -> None:
        """Catch hook implementations whose names match no hookspec (usually typos), and
        wrappers around hooks that shuniu calls directly.

        Such a plugin is unregistered and recorded as failed, with the offending hook named.
        """
        for name, plugin in list(self.pm.list_name_plugin()):
            if plugin is None:
                continue
            unknown = [
                impl.function.__name__
                for caller in self.pm.get_hookcallers(plugin) or []
                if caller.spec is None
                for impl in caller.get_hookimpls()
                if impl.plugin is plugin and not impl.optionalhook
            ]
            wrappers = [
                caller.name
                for caller in self.pm.get_hookcallers(plugin) or []
                if caller.spec is not None and caller.name in _DIRECT_HOOKS
                for impl in caller.get_hookimpls()
                if impl.plugin is plugin and (impl.hookwrapper or impl.wrapper)
            ]
            reason = None
            if unknown:
                reason = (
                    f"unknown hook(s) {', '.join(sorted(unknown))}; "
                    f"known hooks: {', '.join(sorted(_hook_names()))}"
                )
            elif wrappers:
                reason = (
                    f"hook wrappers are not supported for {', '.join(sorted(wrappers))} (shuniu "
                    "resolves these hooks once at start-up and calls them directly)"
                )
            if reason is not None:
                dist, version = self._dists.get(name, ("?", "?"))
                self.pm.unregister(plugin)
                self._fail(name, dist, version, reason)
        self._registry = None

    def _fail(self, name: str, dist: str, version: str, error: str) -> None:
        self.failed.append(FailedPlugin(name, dist, version, error))
        print(f"shuniu: plugin {name!r} ({dist} {version}) was not loaded: {error}", file=sys.stderr)

    # -- what the plugins registered ---------------------------------------------------

    def _collect(self) -> dict[Category, dict[str, Registration]]:
        if self._registry is not None:
            return self._registry
        registry: dict[Category, dict[str, Registration]] = {c: {} for c in CATEGORIES}
        problems: list[Problem] = []
        for category in CATEGORIES:
            hook = getattr(self.pm.hook, f"register_{category}")
            # pluggy lists implementations in registration order (and calls them in reverse).
            for impl in hook.get_hookimpls():
                plugin_name = self.pm.get_name(impl.plugin) or "?"
                register = _make_register(category, plugin_name, registry[category], problems)
                try:
                    impl.function(*[{"register": register}[arg] for arg in impl.argnames])
                except Exception as exc:
                    problems.append(
                        Problem(
                            f"plugin {plugin_name}",
                            f"register_{category} failed: {type(exc).__name__}: {exc}",
                        )
                    )
        if problems:
            raise ConfigError(problems, source="plugins")
        self._registry = registry
        return registry

    def registered(self, category: Category) -> dict[str, Registration]:
        """Name → registration for one category (``backends``, ``balancers``, ...)."""
        return self._collect()[category]

    def add_commands(self, cli: Any) -> None:
        self.pm.hook.register_commands(cli=cli)

    def hook_functions(self, hook_name: str) -> list[Callable[..., Any]]:
        """The implementations of one hook as plain callables, in call order, for the hot
        path (called directly, bypassing pluggy's per-call machinery)."""
        caller = getattr(self.pm.hook, hook_name)
        spec_args = tuple(caller.spec.argnames) if caller.spec is not None else ()
        out: list[Callable[..., Any]] = []
        for impl in reversed(caller.get_hookimpls()):
            if tuple(impl.argnames) == spec_args:
                out.append(impl.function)
            else:
                # pluggy lets an implementation take a subset of the arguments; pass just those.
                out.append(_subset_caller(impl.function, tuple(impl.argnames)))
        return out

    def plugins(self) -> list[PluginInfo]:
        infos = []
        for name, plugin in self.pm.list_name_plugin():
            if plugin is None:
                continue
            dist, version = self._dists.get(name, ("(in code)", ""))
            hooks = tuple(sorted(c.name for c in self.pm.get_hookcallers(plugin) or []))
            infos.append(PluginInfo(name, dist, version, hooks))
        return sorted(infos, key=lambda i: (i.distribution != "shuniu", i.distribution, i.name))


# Hooks shuniu resolves at start-up and calls itself (not through ``pm.hook``).
_DIRECT_HOOKS = frozenset(
    {f"register_{c}" for c in CATEGORIES} | {"gateway_startup", "gateway_shutdown", "request_finished"}
)


def _subset_caller(fn: Callable[..., Any], argnames: tuple[str, ...]) -> Callable[..., Any]:
    def call(**kwargs: Any) -> Any:
        return fn(*[kwargs[a] for a in argnames])

    return call


def _hook_names() -> Iterable[str]:
    return (n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), "shuniu_spec"))


def _ep_key(ep: importlib.metadata.EntryPoint) -> tuple[bool, str, str]:
    """shuniu's own plugins first (a third party cannot displace them), then by name."""
    dist = ep.dist.name if ep.dist is not None else ""
    return (_normalize(dist) != "shuniu", dist, ep.name)


def _make_register(
    category: str,
    plugin_name: str,
    into: dict[str, Registration],
    problems: list[Problem],
) -> Callable[..., None]:
    def register(
        name: str,
        factory: Callable[..., Any],
        *,
        options: type | None = None,
        description: str = "",
    ) -> None:
        if not isinstance(name, str) or not name:
            problems.append(Problem(f"plugin {plugin_name}", f"{category}: name must be a string"))
            return
        if name in into:
            problems.append(
                Problem(
                    f"plugin {plugin_name}",
                    f"{singular(category)} {name!r} is already registered by plugin {into[name].plugin!r}",
                )
            )
            return
        into[name] = Registration(name, factory, options, description, plugin_name)

    return register


def load_plugins(*, entry_points: bool = True, extra: Iterable[tuple[str, object]] = ()) -> PluginManager:
    """Build a plugin manager with the installed plugins (and ``extra`` ones, for tests)."""
    manager = PluginManager()
    if entry_points:
        manager.load_entry_points()
    for name, plugin in extra:
        manager.register(plugin, name)
    manager.check()
    return manager
