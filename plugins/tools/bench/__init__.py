"""``shuniu bench``: load-test any OpenAI-compatible endpoint.

The package exports only the command, so that loading the plugin at every ``shuniu`` start
imports nothing but :mod:`click`: ``traffic`` (what is sent and when), ``prompts``, ``client``
(the HTTP/SSE client), ``runner``, ``report`` and ``plots`` are imported when the command runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shuniu.core.lazy import lazy_exports

if TYPE_CHECKING:
    from shuniu.plugins.tools.bench.command import bench_command

__all__ = ["bench_command"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "bench_command": "shuniu.plugins.tools.bench.command",
    },
)
