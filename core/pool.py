"""Pools of endpoints: the state the scheduler and balancer work on.

A pool serves one logical model. Each endpoint has a gateway-side slot count
(``max_concurrency``); the scheduler only dispatches while some healthy endpoint has a free
slot, so the queue stays in the gateway, where priorities can still be applied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shuniu.core.types import EndpointLoad, InferenceRequest, Outcome

if TYPE_CHECKING:
    from shuniu.core.interfaces import Backend, Balancer, Scheduler

__all__ = ["EndpointState", "Pool", "Ticket"]


class EndpointState:
    """One endpoint as the gateway sees it. Mutated only on the event loop."""

    __slots__ = (
        "backend",
        "completed",
        "errors",
        "healthy",
        "in_flight",
        "last_health_detail",
        "load",
        "max_concurrency",
        "name",
        "version",
        "weight",
    )

    def __init__(
        self,
        name: str,
        backend: Backend,
        *,
        weight: float = 1.0,
        version: str = "v1",
        max_concurrency: int = 0,
    ) -> None:
        self.name = name
        self.backend = backend
        self.weight = weight
        self.version = version
        self.max_concurrency = max_concurrency
        self.in_flight = 0
        self.healthy = True
        self.last_health_detail = ""
        self.completed = 0
        self.errors = 0
        self.load: EndpointLoad | None = None

    def has_capacity(self) -> bool:
        return self.healthy and (self.max_concurrency == 0 or self.in_flight < self.max_concurrency)

    def __repr__(self) -> str:
        return f"<EndpointState {self.name} in_flight={self.in_flight} healthy={self.healthy}>"


class Ticket:
    """A request's claim on one endpoint slot, from dispatch until release."""

    __slots__ = ("admitted", "endpoint", "pool", "released", "request")

    def __init__(
        self, request: InferenceRequest, pool: Pool, endpoint: EndpointState, admitted: float
    ) -> None:
        self.request = request
        self.pool = pool
        self.endpoint = endpoint
        self.admitted = admitted
        self.released = False


class Pool:
    """The endpoints of one model, with its balancer and scheduler."""

    __slots__ = ("_on_change", "balancer", "endpoints", "max_model_len", "name", "scheduler")

    def __init__(
        self,
        name: str,
        endpoints: list[EndpointState],
        balancer: Balancer,
        scheduler: Scheduler,
        *,
        max_model_len: int | None = None,
    ) -> None:
        self.name = name
        self.endpoints = endpoints
        self.balancer = balancer
        self.scheduler = scheduler
        self.max_model_len = max_model_len
        self._on_change: list[Callable[[Pool], Any]] = []

    def has_healthy(self) -> bool:
        return any(e.healthy for e in self.endpoints)

    def try_dispatch(self, req: InferenceRequest, now: float) -> Ticket | None:
        """Give ``req`` a slot on an endpoint the balancer picks, if one has a free slot."""
        candidates = [e for e in self.endpoints if e.has_capacity()]
        if not candidates:
            return None
        endpoint = self.balancer.pick(req, candidates)
        if endpoint is None:
            return None
        endpoint.in_flight += 1
        return Ticket(req, self, endpoint, now)

    def free(self, ticket: Ticket, outcome: Outcome) -> bool:
        """Return the ticket's slot (idempotent). True if it was still held."""
        if ticket.released:
            return False
        ticket.released = True
        endpoint = ticket.endpoint
        endpoint.in_flight -= 1
        if outcome is Outcome.ERROR:
            endpoint.errors += 1
        else:
            endpoint.completed += 1
        return True

    def set_healthy(self, endpoint: EndpointState, healthy: bool) -> None:
        endpoint.healthy = healthy
        if healthy:
            self.scheduler.wake(self)
