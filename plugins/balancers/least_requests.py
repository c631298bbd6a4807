"""``least_requests``: the endpoint with the fewest requests in flight per unit of weight."""

from __future__ import annotations

from collections.abc import Sequence

from shuniu.core import hookimpl
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer
from shuniu.core.types import InferenceRequest

__all__ = ["LeastRequests"]


class LeastRequests(Balancer):
    """Picks the candidate with the lowest ``(in_flight + 1) / weight``: the fewest requests
    per unit of weight once this one is placed. Counting the new request makes a heavier
    endpoint win among idle ones and keeps filling endpoints in proportion to their weights
    (with ``in_flight / weight`` every idle endpoint ties at 0 whatever its weight); with
    equal weights it is simply the fewest in flight.

    Ties are broken round-robin: the scan starts just after the position picked last, so
    equal endpoints (an idle pool) share the requests instead of the first always winning.
    Uses only the gateway's own counts (always current, blind to other gateways); see
    ``least_load`` for the engine's view. O(n), no allocation. Weights are > 0 (the config
    enforces it).
    """

    __slots__ = ("_next",)

    def __init__(self, options: None = None) -> None:
        self._next = 0

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        n = len(endpoints)
        if n == 0:
            return None
        start = self._next % n
        best_pos = start
        first = endpoints[start]
        best_score = (first.in_flight + 1) / first.weight
        for pos in range(start + 1, start + n):
            if pos >= n:
                pos -= n
            e = endpoints[pos]
            score = (e.in_flight + 1) / e.weight
            if score < best_score:  # strict: among ties the first after ``start`` wins
                best_score = score
                best_pos = pos
        self._next = best_pos + 1
        return endpoints[best_pos]


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register(
        "least_requests",
        LeastRequests,
        description="Fewest requests in flight per unit of weight; ties in turn.",
    )
