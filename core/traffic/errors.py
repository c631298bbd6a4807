"""The errors of the traffic model: :class:`WorkloadError` for a workload that cannot be used,
and :class:`FieldError`, which a validator raises to name the field below it that is wrong."""

from __future__ import annotations

from typing import Any

from shuniu.core.errors import ConfigError

__all__ = ["FieldError", "WorkloadError"]


class WorkloadError(ConfigError):
    """A workload file that cannot be used, with every problem found."""

    what = "workload"


class FieldError(ValueError):
    """A validation error that belongs to a field below the model that raised it (``loc`` is
    the path from that model); :func:`~shuniu.core.traffic.load_workload` reports it there."""

    def __init__(self, loc: tuple[Any, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
