"""The ``least_busy`` balancer and its options."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from shuniu.core.config import Options
from shuniu.core.contracts import Balancer, EndpointView
from shuniu.core.types import InferenceRequest

__all__ = ["LeastBusy", "LeastBusyOptions"]

# Scores this close (relatively) are ties: weights such as 0.1 and 0.3 make float quotients
# that should be equal differ in the last bit.
_REL_TOL = 1e-9


class LeastBusyOptions(Options):
    """Options of the ``least_busy`` balancer (``balancer.options`` in a deployment)."""

    tie_break: Literal["round_robin", "first"] = "round_robin"
    """Which endpoint wins among those with the same (lowest) score. ``round_robin`` starts
    each scan one past the previous winner, so equally loaded endpoints take turns and load
    spreads even when requests finish before the next one arrives; ``first`` always takes the
    earliest one in the model's endpoint order (deterministic; fills endpoints in order)."""


class LeastBusy(Balancer):
    """Picks the candidate endpoint that minimizes ``(in_flight + 1) / weight``.

    ``in_flight`` is the number of requests the gateway has dispatched to the endpoint and
    not yet finished; ``+ 1`` counts the request being placed, so that with equal in-flight
    counts a heavier endpoint wins, and an idle endpoint of weight 2 takes two requests
    for every one an idle endpoint of weight 1 takes. Synchronous, O(endpoints), no I/O.
    """

    __slots__ = ("_next", "options")

    def __init__(self, options: LeastBusyOptions | None = None) -> None:
        self.options = options or LeastBusyOptions()
        self._next = 0

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        n = len(endpoints)
        if n == 0:
            return None
        rotate = self.options.tie_break == "round_robin"
        start = self._next % n if rotate else 0
        best_index = start
        best_score = math.inf
        for k in range(n):
            i = start + k
            if i >= n:
                i -= n
            e = endpoints[i]
            # Config validation keeps weights > 0; an endpoint built by hand with weight 0
            # is never preferred over one with a positive weight.
            score = (e.in_flight + 1) / e.weight if e.weight > 0 else math.inf
            if score < best_score and not math.isclose(score, best_score, rel_tol=_REL_TOL):
                best_index, best_score = i, score
        if rotate:
            self._next = best_index + 1
        return endpoints[best_index]
