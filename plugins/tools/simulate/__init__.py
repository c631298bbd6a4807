"""``shuniu simulate``: a deployment's own scheduler and balancer in front of simulated engines,
in virtual time.

``run`` (:func:`simulate`) drives the run on the virtual-clock event loop of ``vclock``;
``results`` holds what it measured; ``stop`` says when a run's verdict is settled early;
``plot`` draws latencies over time; ``command`` is the command line (and the progress bar
``shuniu plan`` shares); ``plugin`` registers the command.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from shuniu.core.lazy import lazy_exports

if TYPE_CHECKING:
    from shuniu.plugins.tools.simulate.command import simulate_command, simulation_progress
    from shuniu.plugins.tools.simulate.plot import plot_timeline
    from shuniu.plugins.tools.simulate.results import SimulationResult, TierResult
    from shuniu.plugins.tools.simulate.run import simulate
    from shuniu.plugins.tools.simulate.stop import StopRule, stop_allowance
    from shuniu.plugins.tools.simulate.vclock import VirtualClockLoop, run_virtual

__all__ = [
    "SimulationResult",
    "StopRule",
    "TierResult",
    "VirtualClockLoop",
    "plot_timeline",
    "run_virtual",
    "simulate",
    "simulate_command",
    "simulation_progress",
    "stop_allowance",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "simulate_command": "shuniu.plugins.tools.simulate.command",
        "simulation_progress": "shuniu.plugins.tools.simulate.command",
        "plot_timeline": "shuniu.plugins.tools.simulate.plot",
        "SimulationResult": "shuniu.plugins.tools.simulate.results",
        "TierResult": "shuniu.plugins.tools.simulate.results",
        "simulate": "shuniu.plugins.tools.simulate.run",
        "StopRule": "shuniu.plugins.tools.simulate.stop",
        "stop_allowance": "shuniu.plugins.tools.simulate.stop",
        "VirtualClockLoop": "shuniu.plugins.tools.simulate.vclock",
        "run_virtual": "shuniu.plugins.tools.simulate.vclock",
    },
)
