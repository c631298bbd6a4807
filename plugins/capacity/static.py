"""``static``: one replica's capacity as you measured it (``shuniu bench`` against one
engine at the SLO, say): a request rate, or a token throughput divided by the observed
tokens per request."""

from __future__ import annotations

from pydantic import Field, model_validator

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import CapacityTarget, RegisterCapacityModel, TokenMix

__all__ = ["StaticCapacity", "StaticCapacityOptions"]


class StaticCapacityOptions(Options):
    requests_per_s: float | None = Field(None, gt=0)
    """Requests per second one replica serves within the SLO (whatever the mix)."""
    tokens_per_s: float | None = Field(None, gt=0)
    """Or: tokens per second one replica processes within the SLO, prompt tokens not found
    in the prefix cache plus answer tokens; divided by the observed mix's."""

    @model_validator(mode="after")
    def _one(self) -> StaticCapacityOptions:
        if (self.requests_per_s is None) == (self.tokens_per_s is None):
            raise ValueError("give either requests_per_s or tokens_per_s")
        return self


class StaticCapacity:
    """A fixed capacity."""

    def __init__(self, options: StaticCapacityOptions, target: CapacityTarget) -> None:
        self.options = options

    def replica_capacity(self, mix: TokenMix) -> float:
        o = self.options
        if o.requests_per_s is not None:
            return o.requests_per_s
        assert o.tokens_per_s is not None
        per_request = mix.prompt_tokens * (1 - mix.cached_share) + mix.output_tokens
        return o.tokens_per_s / max(per_request, 1.0)


@hookimpl
def register_capacity_models(register: RegisterCapacityModel) -> None:
    register(
        "static",
        StaticCapacity,
        options=StaticCapacityOptions,
        description="one replica's rate as measured (requests or tokens per second)",
    )
