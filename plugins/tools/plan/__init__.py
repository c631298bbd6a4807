"""``shuniu plan``: how many replicas (at which tensor-parallel size) of a model on some hardware
meet a workload's SLO, found by simulating candidate deployments in virtual time.

``planner`` holds the search (:func:`plan`, described there) and its defaults; it starts from
the roofline guess of ``estimates``, over the tensor-parallel sizes of ``candidates``, each
trial simulating the deployment ``deployment`` writes. ``results`` holds what a plan produces,
``report`` prints it, ``command`` is the command line and ``plugin`` registers it.
``capacity`` answers a narrower question for the autoscaling signals: the highest rate one
replica serves within an SLO at a token mix.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shuniu.core.lazy import lazy_exports

if TYPE_CHECKING:
    from shuniu.plugins.tools.plan.capacity import mix_workload, replica_capacity
    from shuniu.plugins.tools.plan.command import plan_command
    from shuniu.plugins.tools.plan.planner import (
        DEFAULT_GOODPUT,
        DEFAULT_MAX_REPLICAS,
        DEFAULT_SEARCH_DURATION,
        plan,
    )
    from shuniu.plugins.tools.plan.results import PlanError, PlanReporter, PlanResult, Trial

__all__ = [
    "DEFAULT_GOODPUT",
    "DEFAULT_MAX_REPLICAS",
    "DEFAULT_SEARCH_DURATION",
    "PlanError",
    "PlanReporter",
    "PlanResult",
    "Trial",
    "mix_workload",
    "plan",
    "plan_command",
    "replica_capacity",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "plan_command": "shuniu.plugins.tools.plan.command",
        "mix_workload": "shuniu.plugins.tools.plan.capacity",
        "replica_capacity": "shuniu.plugins.tools.plan.capacity",
        "DEFAULT_GOODPUT": "shuniu.plugins.tools.plan.planner",
        "DEFAULT_MAX_REPLICAS": "shuniu.plugins.tools.plan.planner",
        "DEFAULT_SEARCH_DURATION": "shuniu.plugins.tools.plan.planner",
        "plan": "shuniu.plugins.tools.plan.planner",
        "PlanError": "shuniu.plugins.tools.plan.results",
        "PlanReporter": "shuniu.plugins.tools.plan.results",
        "PlanResult": "shuniu.plugins.tools.plan.results",
        "Trial": "shuniu.plugins.tools.plan.results",
    },
)
