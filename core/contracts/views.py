"""What a policy sees of the gateway: one endpoint, one pool, one request's slot.

Balancers, filters and scorers read :class:`EndpointView`; schedulers work on a
:class:`PoolView` and hand out :class:`Ticket`s. These are narrow read-mostly views of the
gateway's own :class:`shuniu.core.pools.EndpointState` and :class:`shuniu.core.pools.Pool`
(which implement them), so a plugin depends on what it may use, not on the whole pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from shuniu.core.types import EndpointLoad, InferenceRequest, Outcome

__all__ = ["EndpointView", "PoolView", "Ticket"]


class EndpointView(Protocol):
    """One endpoint (engine replica) as a policy reads it. Mutated only by the gateway, on
    the event loop; a policy never writes to it."""

    name: str
    """Unique endpoint name, e.g. ``chat-sim-0``."""
    index: int
    """Position in the pool: stable, never reused, a small integer key for policy state."""
    weight: float
    """The configured traffic weight."""
    version: str
    """The endpoint's version label (canaries split traffic by it)."""
    labels: dict[str, str]
    """Configured labels, e.g. ``zone``."""
    in_flight: int
    """Requests this gateway dispatched to it and has not seen finish (always current)."""
    in_flight_tokens: int
    """Prompt plus expected output tokens of those requests."""
    prefill_tokens: int
    """Of those requests, the ones with no output yet: their prompt tokens the engine must
    still compute (less what the balancer expected it to have cached,
    ``InferenceRequest.expected_cached``). Work standing between a new request and its
    first token there."""
    remote_in_flight: int
    """Requests the fleet's other gateways have in flight on it (``fleet:``), at most one
    sync interval old; 0 without a fleet."""
    remote_tokens: int
    """Their prompt plus expected output tokens."""
    remote_prefill_tokens: int
    """Their ``prefill_tokens`` on it (as of their last sync); 0 without a fleet."""
    limit: int
    """Current concurrency limit (0: none)."""
    healthy: bool
    draining: bool
    ejected: bool
    load: EndpointLoad | None
    """The engine's last load report, or ``None`` (none, or too old to count)."""
    load_weight: float
    """How much ``load`` still counts: 1 fresh, fading to 0 as it ages."""


class PoolView(Protocol):
    """The endpoints of one model, as its scheduler works on them."""

    name: str
    """The model's own name."""

    @property
    def endpoints(self) -> Sequence[EndpointView]:
        """Every endpoint, healthy or not (a new list when one joins or leaves); read-only
        here (a pool's own list of its endpoint states is one)."""
        ...

    dispatched: int
    """Requests given a slot since start (for drain-rate estimates)."""

    def has_healthy(self, version: str | None = None) -> bool:
        """Whether some endpoint (of ``version``, when given) is in balancing."""
        ...

    def try_dispatch(self, req: InferenceRequest, now: float) -> Ticket | None:
        """Give ``req`` a slot on the endpoint the pool's balancer picks among those with a
        free one, or ``None`` when none has (the request keeps waiting)."""
        ...

    def free(self, ticket: Ticket, outcome: Outcome) -> bool:
        """Return the ticket's slot (idempotent); ``True`` if it was still held."""
        ...


class Ticket:
    """A request's claim on one endpoint slot, from dispatch until release."""

    __slots__ = ("admitted", "cost", "endpoint", "pool", "prefill", "released", "request", "tag")

    def __init__(
        self, request: InferenceRequest, pool: PoolView, endpoint: EndpointView, admitted: float, cost: int
    ) -> None:
        self.request = request
        self.pool = pool
        self.endpoint = endpoint
        self.admitted = admitted
        """Event-loop time the slot was given."""
        self.cost = cost
        """Tokens added to the endpoint's ``in_flight_tokens`` (given back on release)."""
        self.prefill = 0
        """Tokens added to the endpoint's ``prefill_tokens`` (given back at the first
        output, or on release)."""
        self.released = False
        self.tag: object = None
        """The scheduler's own: what it keeps with the slot until it releases it (the
        ``priority`` scheduler: the tier whose slots it counts), so that ``release`` need
        not look it up again. ``None`` until a scheduler sets it."""
