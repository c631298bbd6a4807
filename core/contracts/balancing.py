"""The balancing contracts: :class:`Balancer` picks one endpoint; a composed balancer is
built from :class:`Filter` s and weighted :class:`Scorer` s instead.

Where they run: after the scheduler decided a request may start now and some endpoint has a
free slot, inside :meth:`shuniu.core.pools.Pool.try_dispatch`, with the candidates that are
healthy, not ejected or draining, under their concurrency limit, of the request's version
(a canary or pinned one) and not already tried by this request (a retry). All three are
synchronous, O(endpoints) and do no I/O: they run once per dispatch on the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from shuniu.core.contracts.conformance import optional
from shuniu.core.contracts.fleet import SharedIndex
from shuniu.core.contracts.views import EndpointView
from shuniu.core.types import InferenceRequest

__all__ = ["Balancer", "Filter", "Scorer"]


@runtime_checkable
class Balancer(Protocol):
    """Picks one endpoint for a request. One instance per pool (``balancer.policy``).

    A balancer class may set ``takes_full_endpoints = True``: it is then also offered the
    endpoints at their *adaptive* concurrency limit (never those at ``max_concurrency``),
    recognisable by ``in_flight + remote_in_flight >= limit``, and called even when only
    those are left. It may pick one when waiting there is cheaper than any free endpoint
    (the prefix balancers: the engine that holds the prompt, against a cold prefill
    elsewhere); the request then waits in that engine's queue instead of the gateway's. With
    no free endpoint and none worth waiting on, it returns ``None``."""

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        """Return one of ``endpoints`` (never empty), or ``None`` to let the request wait
        for another slot."""
        ...

    @optional
    def shared_index(self) -> SharedIndex | None:
        """Optional: the balancer's prefix index, shared with the fleet's other gateways
        when the deployment has ``fleet:`` (:class:`SharedIndex`). Default ``None``."""
        return None

    @optional
    def engine_lost(self, endpoint: EndpointView) -> None:
        """Optional: ``endpoint``'s engine lost its KV cache (a launched engine's process
        exited or stopped answering, and is being restarted). Called on the event loop, once
        per loss, never per request; a balancer that remembers which prefixes each engine
        holds forgets the endpoint's. The default does nothing."""
        return None


@runtime_checkable
class Filter(Protocol):
    """Narrows the candidates of a composed balancer (``balancer.filters``), in order."""

    def filter(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> Sequence[EndpointView]:
        """A subset of ``endpoints``. Returning none of them means "no preference": the
        balancer then keeps them all."""
        ...


class Scorer(Protocol):
    """Rates candidates for a composed balancer (``balancer.scorers``, each with a weight):
    the endpoint with the highest weighted sum wins, ties in turn."""

    def score(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> Sequence[float]:
        """One score per endpoint, in order, each in 0..1 (higher is better)."""
        ...

    @optional
    def picked(self, req: InferenceRequest, endpoint: EndpointView) -> None:
        """Optional: ``endpoint`` was chosen for ``req`` (a scorer with memory, e.g. of
        prefixes, records it). The default does nothing."""
        return None

    @optional
    def shared_index(self) -> SharedIndex | None:
        """Optional: as :meth:`Balancer.shared_index`, for a scorer with a prefix index."""
        return None
