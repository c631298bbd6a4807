"""The ``autoscaling:`` block of a model: the SLO its pool is scaled to meet, how far ahead
to look, and how one replica's capacity is found (a capacity model, :mod:`shuniu.core.contracts.capacity`).

What the gateway does with it is in :mod:`shuniu.core.pools.autoscale`; how to scale on it
with an HPA or KEDA is in ``docs/kubernetes.md``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from shuniu.core.config.base import Strict

__all__ = ["AutoscalingConfig", "CapacityConfig"]


class CapacityConfig(Strict):
    """How the requests per second one replica serves within the SLO are found."""

    kind: str = "simulated"
    """A capacity model: ``simulated`` (the planner's simulator: one replica of the engine
    described by ``options`` — the ``sim`` backend's options, by default those of the
    pool's ``sim`` endpoint — run at rising rates with the observed token mix until the SLO
    breaks), ``static`` (a rate you measured), or one a plugin registers with
    ``register_capacity_models``."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of the capacity model."""


class AutoscalingConfig(Strict):
    """Scaling signals for the model's pool: the replicas it needs to meet ``*_p99_s`` at
    the arrival rate expected ``lead_time_s`` from now (``shuniu_pool_desired_replicas``),
    with the observed rate, forecast, token mix and per-replica capacity beside it."""

    ttft_p99_s: float | None = Field(None, gt=0)
    """The pool's target for the 99th percentile of time to first token."""
    itl_p99_s: float | None = Field(None, gt=0)
    """The pool's target for the 99th percentile of inter-token latency."""
    e2e_p99_s: float | None = Field(None, gt=0)
    """The pool's target for the 99th percentile of end-to-end latency."""
    lead_time_s: float = Field(120.0, ge=0)
    """How long a new engine replica takes from being asked for to serving (node, image,
    weights, warm-up). The desired count covers the rate forecast this far ahead, so
    replicas asked for now are ready when the load arrives. Scaling down follows the rate
    now, never the forecast: a replica leaves at once, so there is nothing to anticipate."""
    window_s: float = Field(120.0, ge=10, le=3600)
    """Seconds of arrivals the rate and its trend are fitted over (a least-squares line
    through per-second counts). Longer: steadier, slower to see a change."""
    interval_s: float = Field(15.0, gt=0, le=3600)
    """How often the signals are recomputed."""
    headroom: float = Field(0.1, ge=0, le=4)
    """Extra capacity asked for on top of the forecast (0.1: 10%), for forecast error and
    the bursts a per-second fit smooths away."""
    min_replicas: int = Field(1, ge=0)
    """The desired count never goes below this."""
    max_replicas: int = Field(64, ge=1)
    """...nor above this."""
    capacity: CapacityConfig = Field(default_factory=CapacityConfig)
    """How one replica's capacity at the observed token mix is found."""

    @model_validator(mode="after")
    def _consistent(self) -> AutoscalingConfig:
        if self.ttft_p99_s is None and self.itl_p99_s is None and self.e2e_p99_s is None:
            raise ValueError("give at least one SLO target: ttft_p99_s, itl_p99_s or e2e_p99_s")
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})"
            )
        return self
