"""A balancer composed from filters and weighted scorers (``balancer.filters`` and
``balancer.scorers`` in a deployment), e.g. "local zone first, then 0.6 * prefix + 0.4 * load".
"""

from __future__ import annotations

from collections.abc import Sequence

from shuniu.core.contracts import Filter, Scorer, SharedIndex
from shuniu.core.pools.pool import EndpointState
from shuniu.core.types import InferenceRequest

__all__ = ["Composite"]


class Composite:
    """Filters narrow the candidates in order (a filter leaving none is ignored); the
    candidate with the highest weighted sum of scores wins, ties taken in turn."""

    __slots__ = ("_turn", "filters", "scorers")

    def __init__(self, filters: Sequence[Filter], scorers: Sequence[tuple[Scorer, float]]) -> None:
        if not scorers:
            raise ValueError("a composed balancer needs at least one scorer")
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self._turn = 0

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointState]) -> EndpointState | None:
        candidates = endpoints
        for f in self.filters:
            narrowed = f.filter(req, candidates)
            if narrowed:
                candidates = narrowed
        n = len(candidates)
        if n == 0:
            return None
        if n == 1:
            best = candidates[0]
        else:
            totals = [0.0] * n
            for scorer, weight in self.scorers:
                for i, s in enumerate(scorer.score(req, candidates)):
                    totals[i] += weight * s
            # Scan from a rotating start so equal totals share the traffic.
            start = self._turn % n
            self._turn = start + 1
            best_i = start
            top = totals[start]
            for k in range(1, n):
                i = (start + k) % n
                if totals[i] > top:
                    top, best_i = totals[i], i
            best = candidates[best_i]
        for scorer, _ in self.scorers:
            scorer.picked(req, best)
        return best

    def shared_index(self) -> SharedIndex | None:
        """The first scorer's shared prefix index (the ``prefix`` scorer's)."""
        for scorer, _ in self.scorers:
            index = scorer.shared_index()
            if index is not None:
                return index
        return None
