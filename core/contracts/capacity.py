"""Capacity models: how many requests per second one replica of a pool's engine serves
within the pool's SLO, at the token mix the gateway observes.

A model with ``autoscaling:`` names one (``capacity.kind``: ``simulated``, ``static``, or one
a plugin registers with ``register_capacity_models``). The gateway
(:mod:`shuniu.core.pools.autoscale`) measures the pool's arrival rate and token mix, asks
the capacity model for one replica's rate at that mix, and turns the forecast rate into
``shuniu_pool_desired_replicas``. It asks off the request path and caches the answer per
mix (rounded to a grid, so a mix that drifts a little asks nothing new).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["CapacityModel", "CapacityTarget", "EngineEntry", "TokenMix"]


@dataclass(frozen=True, slots=True)
class TokenMix:
    """What an average request of the pool asks for."""

    prompt_tokens: float
    """Mean prompt length, tokens."""
    output_tokens: float
    """Mean answer length, tokens."""
    cached_share: float = 0.0
    """Share of prompt tokens the engines found in their prefix caches (0..1), from their
    own counters where they report them."""


@dataclass(frozen=True, slots=True)
class EngineEntry:
    """One endpoint entry of the pool, as the deployment file gives it."""

    kind: str
    """Its backend (``sim``, ``vllm``, ...)."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Its ``options:`` mapping, as written."""


@dataclass(frozen=True, slots=True)
class CapacityTarget:
    """What a capacity model is built for: one pool and its SLO."""

    model: str
    """The model (pool) name."""
    ttft_p99_s: float | None
    itl_p99_s: float | None
    e2e_p99_s: float | None
    """The SLO's p99 targets (``autoscaling:``); at least one is set."""
    engines: Sequence[EngineEntry] = ()
    """The pool's endpoint entries (a model may take its engine's description from them)."""
    max_model_len: int | None = None
    """The model's context window, when the deployment gives it."""


@runtime_checkable
class CapacityModel(Protocol):
    """One pool's capacity model. Built once per model by the factory registered with
    ``register_capacity_models`` (``factory(options, target)``)."""

    def replica_capacity(self, mix: TokenMix) -> float:
        """Requests per second one replica serves at ``mix`` while meeting the target's SLO
        (0: not even a trickle meets it). Called rarely (once per new mix), never on the
        request path, and may take seconds. A live gateway calls it in a worker process, so
        the model must pickle and must not depend on the gateway's state; ``shuniu simulate``
        calls it in a thread while virtual time stands still."""
        ...
