"""``shuniu plan``: the cheapest pool of a model on some hardware that meets a workload's SLO,
found by simulating candidate deployments in virtual time.

``planner`` holds the entry point (:func:`plan`) and its defaults, ``search`` the search
(:class:`~shuniu.plugins.tools.plan.search.Planner`, described there); ``shapes`` the
engine configurations it chooses between (tensor-parallel sizes from ``candidates``,
precisions, chunk, ``max_num_seqs``, prefix caching, balancer); ``estimates`` the roofline
guess it starts a count from; ``steady`` how long a workload warms up; each trial simulates
the deployment ``deployment`` writes, side by side in the processes of ``workers`` with
``--jobs``. ``results`` holds what a plan produces, ``report`` prints it, ``frontier`` draws
its cost frontier, ``command`` is the command line and ``plugin`` registers it.
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
