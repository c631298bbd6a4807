"""shuniu core: types, interfaces, hookspecs, plugin manager, config, gateway and CLI.

``core`` never imports a concrete plugin; everything concrete arrives through the
``shuniu.plugins`` entry-point group.
"""

from __future__ import annotations

from shuniu.core.hookspecs import hookimpl, hookspec
from shuniu.core.version import __version__

__all__ = ["__version__", "hookimpl", "hookspec"]
