"""Trials side by side: a pool of worker processes that each simulate one deployment at a time
(``shuniu plan --jobs``). A worker loads the plugins once, at its start, and answers with the
run's summary; the planner turns it into a :class:`~shuniu.plugins.tools.plan.results.Trial`."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from functools import cache
from typing import TYPE_CHECKING, Any

from shuniu.core.config.loader import load_deployment
from shuniu.core.plugin_manager import PluginManager, load_plugins
from shuniu.core.traffic import Workload

if TYPE_CHECKING:
    from shuniu.plugins.tools.simulate import StopRule

__all__ = ["simulate_summary", "trial_pool"]


@cache
def _plugins() -> PluginManager:
    """This worker process's plugin manager (loaded once per process: a worker is a fresh
    interpreter, so nothing is shared with the planner's own)."""
    return load_plugins()


def _warm() -> None:
    _plugins()


def simulate_summary(
    source: str,
    text: str,
    workload: Workload,
    horizon: float,
    seed: int,
    stop_after: StopRule | None = None,
) -> tuple[dict[str, Any], float]:
    """Simulate the deployment ``text`` against ``workload`` (in a worker): its summary and
    the wall-clock seconds it took (``stop_after`` as for ``simulate``)."""
    from shuniu.plugins.tools.simulate import simulate

    plugins = _plugins()
    resolved = load_deployment(source, plugins, text=text)
    result = simulate(resolved, plugins, workload, duration=horizon, seed=seed, stop_after=stop_after)
    return result.summary(), result.wall_s


def trial_pool(jobs: int) -> ProcessPoolExecutor:
    """``jobs`` worker processes, started fresh (``spawn``: no state forked from the planner)."""
    return ProcessPoolExecutor(
        max_workers=jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_warm
    )
