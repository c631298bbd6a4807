"""``weighted_round_robin``: smooth weighted round robin (nginx's algorithm) over
``endpoint.weight``."""

from __future__ import annotations

from collections.abc import Sequence

from shuniu.core import hookimpl
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer
from shuniu.core.types import InferenceRequest

__all__ = ["WeightedRoundRobin"]


class WeightedRoundRobin(Balancer):
    """Smooth weighted round robin: each pick adds every candidate's weight to its current
    weight, takes the candidate with the highest current weight and subtracts the
    candidates' total from it. Over a cycle each endpoint gets exactly its share, and the
    picks are interleaved (weights 5, 1, 1 give ``a a b a c a a``, not ``a a a a a b c``).

    The current weights are kept per endpoint (by ``endpoint.index``, which the pool makes
    unique), not per position, so a candidate list that changes between picks (an endpoint
    saturated or unhealthy) does not reset the cycle: an absent endpoint keeps its current
    weight, the others share its turns by weight, and it resumes where it left off. O(n).
    """

    __slots__ = ("_current",)

    def __init__(self, options: None = None) -> None:
        self._current: list[float] = []

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        current = self._current
        best: EndpointView | None = None
        best_weight = 0.0
        total = 0.0
        for e in endpoints:
            w = e.weight
            i = e.index
            try:
                cw = current[i] + w
            except IndexError:  # first sight of this endpoint: grow once, no per-pick check
                current.extend([0.0] * (i + 1 - len(current)))
                cw = w
            current[i] = cw
            total += w
            if best is None or cw > best_weight:
                best = e
                best_weight = cw
        if best is not None:
            current[best.index] = best_weight - total
        return best


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register(
        "weighted_round_robin",
        WeightedRoundRobin,
        description="Smooth weighted round robin over endpoint weights (nginx's algorithm).",
    )
