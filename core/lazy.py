"""Lazy package exports (PEP 562): a package names its public API in ``__init__`` without
importing every module when the package is first touched.

Plugin entry points import a package's ``plugin`` module at every start of ``shuniu``, which
imports the package's ``__init__`` first. A tool package whose ``__init__`` imported its
whole implementation (the simulator engine, the planner, a web server) would make every
command and every gateway start pay for all of them; with :func:`lazy_exports` a name is
imported the first time it is used.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` (its ``__name__``): ``names`` maps each
    exported name to the module that defines it. A name is imported on first access and
    then kept in the package's namespace."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*names, *vars(sys.modules[package])})

    return __getattr__, __dir__
