"""``random``: a uniformly random endpoint, or one drawn with probability proportional to
``endpoint.weight``."""

from __future__ import annotations

import random
from collections.abc import Sequence

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer
from shuniu.core.types import InferenceRequest

__all__ = ["RandomOptions", "RandomPick"]


class RandomOptions(Options):
    """Options of the ``random`` balancer."""

    weighted: bool = True
    """Draw each endpoint with probability proportional to its ``weight``; ``false`` draws
    uniformly and ignores the weights."""
    seed: int | None = None
    """Seed of this balancer's own random generator, for reproducible runs (simulations,
    tests); unset seeds it from the system's entropy."""


class RandomPick(Balancer):
    """Picks at random among the candidates, stateless apart from its generator. O(n)
    weighted (one pass to sum the weights, one to find the draw), O(1) uniform."""

    __slots__ = ("_random", "_weighted")

    def __init__(self, options: RandomOptions | None = None) -> None:
        options = options or RandomOptions()
        self._weighted = options.weighted
        # Its own generator: a seed then reproduces this balancer's picks whatever else
        # in the process draws from the global one.
        self._random = random.Random(options.seed).random

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        n = len(endpoints)
        if n <= 1:
            return endpoints[0] if n else None
        if self._weighted:
            total = 0.0
            for e in endpoints:
                total += e.weight
            if total > 0.0:
                r = self._random() * total
                for e in endpoints:
                    r -= e.weight
                    if r < 0.0:
                        return e
                # Rounding left ``r`` a hair above 0: the draw fell at the very top, which
                # belongs to the last endpoint with a weight.
                for e in reversed(endpoints):
                    if e.weight > 0.0:
                        return e
        # int(random() * n) is uniform enough for pool-sized n and ~5x cheaper than randrange.
        return endpoints[int(self._random() * n)]


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register(
        "random",
        RandomPick,
        options=RandomOptions,
        description="A random endpoint, drawn by weight (or uniformly with weighted: false).",
    )
