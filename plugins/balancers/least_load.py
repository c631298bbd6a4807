"""``least_load``: the endpoint with the least outstanding work, and the ``load`` scorer.

Work is the load view of :mod:`shuniu.core.pools.load`: the gateway's own in-flight requests and
tokens plus, weighted by freshness, what the engine reports (requests from other gateways,
its waiting queue, a nearly full KV cache). Unlike least-requests it sees that one request
holding 8,000 tokens is not the same as one holding 80.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer, RegisterScorer, Scorer
from shuniu.core.pools.load import LoadWeights, load_score
from shuniu.core.types import InferenceRequest

__all__ = ["LeastLoad", "LoadOptions", "LoadScorer"]


class LoadOptions(Options):
    """How the load view's parts add up, in units of one request in flight."""

    waiting: float = Field(1.0, ge=0)
    """Extra weight of a request waiting in the engine's own queue."""
    tokens_per_request: float = Field(2048.0, gt=0)
    """In-flight tokens (prompt + expected output) that weigh as much as one request."""
    kv: float = Field(8.0, ge=0)
    """Weight of KV-cache usage above ``kv_knee``."""
    kv_knee: float = Field(0.8, ge=0, lt=1)
    """KV usage below this costs nothing."""

    def weights(self) -> LoadWeights:
        return LoadWeights(self.waiting, self.tokens_per_request, self.kv, self.kv_knee)


class LeastLoad(Balancer):
    """Picks the lowest :func:`~shuniu.core.pools.load.load_score`; ties in turn. O(endpoints)."""

    __slots__ = ("_turn", "weights")

    def __init__(self, options: LoadOptions | None = None) -> None:
        self.weights = (options or LoadOptions()).weights()
        self._turn = 0

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        n = len(endpoints)
        if n == 0:
            return None
        start = self._turn % n
        self._turn = start + 1
        w = self.weights
        best = endpoints[start]
        low = load_score(best, w)
        for k in range(1, n):
            e = endpoints[(start + k) % n]
            s = load_score(e, w)
            if s < low:
                best, low = e, s
        return best


class LoadScorer(Scorer):
    """Scores each candidate ``(1 + least load) / (1 + its load)``: 1 for the least loaded,
    falling as an endpoint carries more than the least loaded one."""

    __slots__ = ("weights",)

    def __init__(self, options: LoadOptions | None = None) -> None:
        self.weights = (options or LoadOptions()).weights()

    def score(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> list[float]:
        w = self.weights
        loads = [load_score(e, w) for e in endpoints]
        low = min(loads) + 1.0
        return [low / (x + 1.0) for x in loads]

    def picked(self, req: InferenceRequest, endpoint: EndpointView) -> None:
        return None


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register(
        "least_load",
        LeastLoad,
        options=LoadOptions,
        description="Least outstanding work: in-flight requests and tokens, engine queue, KV usage.",
    )


@hookimpl
def register_scorers(register: RegisterScorer) -> None:
    register(
        "load",
        LoadScorer,
        options=LoadOptions,
        description="1 for the least-loaded endpoint, less for busier ones.",
    )
