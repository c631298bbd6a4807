"""The in-memory deployment each trial of a plan simulates: ``N`` ``sim`` endpoints with a
shape's engine options, no gateway-side concurrency limit, the ``fifo`` scheduler and the
shape's balancer; and the check that reports a bad one against the option that caused it."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shuniu.core.config.loader import load_deployment
from shuniu.core.errors import ConfigError, Problem
from shuniu.core.plugin_manager import PluginManager
from shuniu.plugins.tools.plan.results import PlanError

__all__ = ["DEPLOYMENT_SOURCE", "check_deployment", "sim_deployment_text"]

DEPLOYMENT_SOURCE = "<shuniu plan deployment>"
"""The source name trial deployments are loaded under."""


def sim_deployment_text(
    options: Mapping[str, Any], replicas: int, balancer: str, max_model_len: int | None
) -> str:
    """The YAML of a one-model deployment (``plan``) of ``replicas`` ``sim`` endpoints with
    these backend ``options``, no gateway-side concurrency limit and the ``fifo`` scheduler."""
    lines = ["models:", "  plan:"]
    if max_model_len is not None:
        lines.append(f"    max_model_len: {max_model_len}")
    lines += [
        f"    balancer: {{policy: {json.dumps(balancer)}}}",
        "    scheduler: {policy: fifo}",
        "    endpoints:",
        "      - kind: sim",
        f"        replicas: {replicas}",
        "        max_concurrency: 0",
        f"        options: {json.dumps(dict(options))}",
    ]
    return "\n".join(lines) + "\n"


def check_deployment(text: str, plugins: PluginManager) -> None:
    """Build a deployment once before simulating, so that a bad ``--balancer`` (or an engine
    setting) is reported against the option that caused it."""
    try:
        load_deployment(DEPLOYMENT_SOURCE, plugins, text=text)
    except ConfigError as exc:
        options = {
            "models.plan.balancer.policy": "--balancer",
            "models.plan.max_model_len": "--max-model-len",
        }
        problems = [
            Problem(options.get(p.path, p.path.replace("models.plan.endpoints[0].options.", "--")), p.message)
            for p in exc.problems
        ]
        raise PlanError(problems, "options") from None
