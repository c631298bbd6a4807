"""The deployment file schema: gateway settings and models, each a pool of endpoints.

Models are pydantic classes (start-up only, never on the hot path) so that validation
reports every problem at once with its field path, and ``shuniu schema`` can print a JSON
Schema whose descriptions come from the field docstrings below.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "BalancerConfig",
    "Deployment",
    "EndpointConfig",
    "GatewayConfig",
    "HealthConfig",
    "ModelConfig",
    "Options",
    "SchedulerConfig",
]


class Options(BaseModel):
    """Base class for plugin option models: unknown keys are errors, docstrings describe."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class GatewayConfig(_Strict):
    """Where and how the gateway listens."""

    host: str = "127.0.0.1"
    """Address to listen on. Use 0.0.0.0 (or ::) to accept connections from other hosts."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port; 0 picks a free one."""
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    """Largest request body accepted; bigger ones get 413."""
    graceful_shutdown_s: float = Field(30.0, ge=0)
    """On SIGTERM: stop accepting, let in-flight requests finish for up to this long."""
    server: str = Field("uvicorn", pattern="^(uvicorn)$")
    """HTTP server. Only ``uvicorn`` (uvloop + httptools) for now."""


class BalancerConfig(_Strict):
    """Which balancer picks an endpoint for each request."""

    policy: str = "round_robin"
    """A registered balancer name (``shuniu plugins`` lists them)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that balancer, validated by it."""


class SchedulerConfig(_Strict):
    """Which scheduler owns the pool's queue."""

    policy: str = "fifo"
    """A registered scheduler name (``shuniu plugins`` lists them)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of that scheduler, validated by it."""


class HealthConfig(_Strict):
    """Background health checking of a model's endpoints."""

    interval_s: float = Field(5.0, gt=0)
    """Seconds between probes of each endpoint."""
    timeout_s: float = Field(2.0, gt=0)
    """A probe slower than this counts as a failure."""
    unhealthy_after: int = Field(2, ge=1)
    """Consecutive failed probes before an endpoint leaves balancing."""
    healthy_after: int = Field(1, ge=1)
    """Consecutive passed probes before it returns."""


class EndpointConfig(_Strict):
    """One engine (or ``replicas`` identical engines) serving the model."""

    kind: str
    """Backend kind: ``sim``, ``openai``, or any registered by a plugin."""
    name: str | None = None
    """Endpoint name; unnamed endpoints are numbered across the model (``<model>-0``,
    ``<model>-1``, ...). A named entry with several replicas gets ``-0``, ``-1``, ... appended."""
    replicas: int = Field(1, ge=1, le=1024)
    """How many identical endpoints to create from this entry."""
    weight: float = Field(1.0, gt=0)
    """Relative share of traffic, for balancers that weigh endpoints."""
    version: str = "v1"
    """Version label, for canary splits and rolling updates."""
    max_concurrency: int = Field(0, ge=0)
    """Requests dispatched to this endpoint at once; 0 = no gateway-side limit. Above it
    requests wait in the gateway's queue, where the scheduler orders them."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Options of the backend kind, validated by it."""


class ModelConfig(_Strict):
    """A logical model: the name clients send, and the pool of endpoints serving it."""

    aliases: list[str] = Field(default_factory=list)
    """Other names clients may use for this model."""
    max_model_len: int | None = Field(None, ge=1)
    """Context window in tokens; requests whose prompt plus ``max_tokens`` exceed it get 400.
    When unset, the backend's own value is used if it reports one."""
    endpoints: list[EndpointConfig] = Field(min_length=1)
    """The engines serving this model."""
    balancer: BalancerConfig = Field(default_factory=BalancerConfig)
    """How each request picks one of the endpoints."""
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    """How requests wait for, and are given, endpoint slots."""
    health: HealthConfig = Field(default_factory=HealthConfig)
    """Background health checks of the endpoints."""
    owned_by: str = "shuniu"
    """Shown in ``/v1/models``."""


class Deployment(_Strict):
    """A whole shuniu deployment."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    """Listening address and request limits."""
    models: dict[str, ModelConfig] = Field(min_length=1)
    """Model name → model. The name is what clients put in ``model``."""

    @field_validator("models")
    @classmethod
    def _names(cls, models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        for name in models:
            if not name or name.strip() != name:
                raise ValueError(f"model name {name!r} must be non-empty without spaces at the ends")
        return models

    @model_validator(mode="after")
    def _unique_names(self) -> Deployment:
        seen: dict[str, str] = {}
        for name, model in self.models.items():
            for alias in [name, *model.aliases]:
                if alias in seen and seen[alias] != name:
                    raise ValueError(
                        f"model name or alias {alias!r} is used by both {seen[alias]!r} and {name!r}"
                    )
                seen[alias] = name
        return self
