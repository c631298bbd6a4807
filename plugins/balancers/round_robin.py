"""``round_robin``: each request to the next endpoint with a free slot, in turn."""

from __future__ import annotations

from collections.abc import Sequence

from shuniu.core import hookimpl
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer
from shuniu.core.types import InferenceRequest

__all__ = ["RoundRobin"]


class RoundRobin(Balancer):
    """Cycles through the candidates. O(1) per pick; ignores load and weights."""

    __slots__ = ("_next",)

    def __init__(self, options: None = None) -> None:
        self._next = 0

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        if not endpoints:
            return None
        i = self._next % len(endpoints)
        self._next = i + 1
        return endpoints[i]


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register("round_robin", RoundRobin, description="Each request to the next endpoint in turn.")
