"""Checking, at start-up, that what a plugin's factory built implements its contract.

A factory that returns an object missing a required method would otherwise fail on the
first request that needs it; :func:`conform` lets the pool builder refuse it at start-up
with the plugin and the members named.

A contract marks its optional members with :func:`optional` and gives each a default. An
object inherits the defaults by subclassing the contract (explicit subclassing of a
:class:`typing.Protocol` is how a class inherits its default methods); for an object that
does not, :func:`conform` attaches the defaults to the instance where it can (an object
with ``__slots__`` and no room for them must subclass).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["conform", "optional"]

F = TypeVar("F", bound=Callable[..., Any])
_MARK = "__shuniu_optional__"
_IGNORED = frozenset({"__init__", "__slots__", "__weakref__", "__dict__", "__doc__", "__module__"})


def optional(fn: F) -> F:
    """Mark a contract member as optional: the body is its default."""
    setattr(fn, _MARK, True)
    return fn


def _members(contract: type) -> dict[str, Any]:
    members: dict[str, Any] = {}
    for klass in reversed(contract.__mro__):
        if klass is object or klass.__module__ in ("typing", "typing_extensions"):
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in _IGNORED:
                continue
            if callable(value) or isinstance(value, property):
                members[name] = value
    return members


def _is_optional(value: Any) -> bool:
    fn = value.fget if isinstance(value, property) else value
    return bool(getattr(fn, _MARK, False))


def conform(obj: Any, contract: type) -> list[str]:
    """Make ``obj`` usable as ``contract`` and return what it still lacks (empty: it
    conforms). Missing optional members get the contract's default attached to the
    instance when the instance has room for it."""
    if contract in type(obj).__mro__:
        return []  # a subclass: it inherited every default
    missing: list[str] = []
    for name, value in _members(contract).items():
        if hasattr(obj, name):
            continue
        if not _is_optional(value):
            missing.append(name)
            continue
        if isinstance(value, property):
            assert value.fget is not None
            default = value.fget(obj)
        else:
            default = types.MethodType(value, obj)
        try:
            setattr(obj, name, default)
        except AttributeError:  # __slots__ without room for it
            missing.append(f"{name} (optional: subclass the contract to inherit its default)")
    return missing
