"""``simulated``: one replica's capacity found by the planner's simulator.

For each token mix the gateway observes (rounded to a grid), one replica of the engine is
simulated at rising Poisson rates with that mix until the pool's SLO breaks
(:func:`shuniu.plugins.tools.plan.replica_capacity`); the highest rate that meets it is the
answer. The engine is the ``sim`` backend's description of a replica — hardware and model
profiles, tensor-parallel size, ``max_num_seqs``, ``max_num_batched_tokens`` — given in
``engine``, or, by default, taken from the pool's first ``sim`` endpoint. A pool of real
engines gives ``engine`` explicitly: the profiles that match its hardware and model.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationError

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import CapacityTarget, RegisterCapacityModel, TokenMix
from shuniu.core.errors import ConfigError, Problem

__all__ = ["SimulatedCapacity", "SimulatedCapacityOptions"]


class SimulatedCapacityOptions(Options):
    engine: dict[str, Any] | None = None
    """One replica as the ``sim`` backend's options (``hardware``, ``model``,
    ``tensor_parallel_size``, ``max_num_seqs``, ``max_num_batched_tokens``, ...). Default:
    the options of the pool's first ``sim`` endpoint."""
    duration_s: float = Field(120.0, ge=10, le=3600)
    """Simulated seconds of each trial (more at low rates, so each holds 300 requests)."""
    seed: int = 0
    """Seed of the trials' arrivals and lengths (the answer is repeatable)."""
    steps: int = Field(6, ge=1, le=20)
    """Bisection steps after the bracket is found (6: within about 1%)."""
    length_sigma: float = Field(0.6, ge=0, le=2)
    """Spread of the trials' prompt and answer lengths around the observed means (log-normal sigma)."""
    prefix_groups: int = Field(4, ge=1, le=10_000)
    """Shared prefixes the observed cached share is spread over in the trials."""


class SimulatedCapacity:
    """A pool's capacity model by simulation. Picklable (a live gateway computes in a
    worker process): it holds only options; the plugin manager is loaded where it runs."""

    def __init__(self, options: SimulatedCapacityOptions, target: CapacityTarget) -> None:
        from shuniu.backends.sim import SimOptions

        engine = options.engine
        where = f"models.{target.model}.autoscaling.capacity.options.engine"
        if engine is None:
            sims = [e for e in target.engines if e.kind == "sim"]
            if not sims:
                raise ConfigError(
                    [
                        Problem(
                            where,
                            "the pool has no sim endpoint to take the engine from: describe one "
                            "replica with the sim backend's options (hardware and model profiles, "
                            "tensor_parallel_size, max_num_seqs)",
                        )
                    ]
                )
            engine = dict(sims[0].options)
            engine.pop("faults", None)  # capacity is of a healthy replica
        try:
            SimOptions.model_validate(engine)
        except ValidationError as exc:
            problems = [
                Problem(".".join([where, *map(str, e["loc"])]), e["msg"].removeprefix("Value error, "))
                for e in exc.errors()
            ]
            raise ConfigError(problems) from None
        self.engine = engine
        self.options = options
        self.slo = {
            "ttft_p99_s": target.ttft_p99_s,
            "itl_p99_s": target.itl_p99_s,
            "e2e_p99_s": target.e2e_p99_s,
        }
        self.max_model_len = target.max_model_len
        self._plugins: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_plugins"] = None
        return state

    def replica_capacity(self, mix: TokenMix) -> float:
        from shuniu.core.plugin_manager import load_plugins
        from shuniu.core.traffic import Slo
        from shuniu.plugins.tools.plan import replica_capacity

        if self._plugins is None:
            self._plugins = load_plugins()
        o = self.options
        return replica_capacity(
            self.engine,
            mix,
            Slo.model_validate(self.slo),
            self._plugins,
            duration_s=o.duration_s,
            seed=o.seed,
            steps=o.steps,
            sigma=o.length_sigma,
            prefix_groups=o.prefix_groups,
            max_model_len=self.max_model_len,
        )


@hookimpl
def register_capacity_models(register: RegisterCapacityModel) -> None:
    register(
        "simulated",
        SimulatedCapacity,
        options=SimulatedCapacityOptions,
        description="one replica's rate within the SLO, found by the planner's simulator",
    )
