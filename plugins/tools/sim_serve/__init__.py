"""``shuniu sim serve``: one simulated engine behind an OpenAI-compatible server that looks like
``vllm serve`` from outside (``serve``); ``plugin`` registers the ``sim`` command group."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shuniu.core.lazy import lazy_exports

if TYPE_CHECKING:
    from shuniu.plugins.tools.sim_serve.serve import (
        build_server,
        default_model_name,
        deployment_for,
        serve_command,
        sim_group,
    )

__all__ = ["build_server", "default_model_name", "deployment_for", "serve_command", "sim_group"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "build_server": "shuniu.plugins.tools.sim_serve.serve",
        "default_model_name": "shuniu.plugins.tools.sim_serve.serve",
        "deployment_for": "shuniu.plugins.tools.sim_serve.serve",
        "serve_command": "shuniu.plugins.tools.sim_serve.serve",
        "sim_group": "shuniu.plugins.tools.sim_serve.serve",
    },
)
