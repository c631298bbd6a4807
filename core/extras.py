"""Optional dependencies: import them where a feature needs them, with an error that names
the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["MissingExtraError", "require"]


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message says which extra brings it."""

    def __init__(self, module: str, extra: str, feature: str) -> None:
        self.module = module
        self.extra = extra
        self.feature = feature
        super().__init__(
            f"{feature} needs the Python package that provides `{module}`, which is not installed. "
            f"Install it with: pip install 'shuniu[{extra}]'"
        )


def require(module: str, extra: str, feature: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtraError` naming ``shuniu[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and not module.startswith(exc.name) and exc.name != module:
            raise  # the module is there but one of *its* imports is broken: show that
        raise MissingExtraError(module, extra, feature) from None
