"""``power_of_two``: the less loaded of two endpoints drawn at random ("power of two
choices")."""

from __future__ import annotations

import random
from collections.abc import Sequence

from shuniu.core import hookimpl
from shuniu.core.config import Options
from shuniu.core.contracts import Balancer, EndpointView, RegisterBalancer
from shuniu.core.pools.load import load_score
from shuniu.core.types import InferenceRequest

__all__ = ["PowerOfTwo", "PowerOfTwoOptions"]


class PowerOfTwoOptions(Options):
    """Options of the ``power_of_two`` balancer."""

    seed: int | None = None
    """Seed of this balancer's own random generator, for reproducible runs (simulations,
    tests); unset seeds it from the system's entropy."""


class PowerOfTwo(Balancer):
    """Draws two distinct candidates uniformly and takes the one with the lower
    :func:`shuniu.core.pools.load.load_score` (the first drawn on a tie, so equal endpoints
    share at random).

    Nearly as even as scanning for the least loaded, but the randomness keeps several
    gateways (each with a stale or partial view) from all sending to the same "least
    loaded" endpoint at once. It never picks the most loaded of three or more candidates
    when that one is strictly the worst, and with two it always takes the lower. Ignores
    ``weight``; O(1).
    """

    __slots__ = ("_random",)

    def __init__(self, options: PowerOfTwoOptions | None = None) -> None:
        options = options or PowerOfTwoOptions()
        self._random = random.Random(options.seed).random

    def pick(self, req: InferenceRequest, endpoints: Sequence[EndpointView]) -> EndpointView | None:
        n = len(endpoints)
        if n <= 1:
            return endpoints[0] if n else None
        rand = self._random
        i = int(rand() * n)
        # Draw the second from the other n - 1 positions: distinct without a retry loop.
        j = int(rand() * (n - 1))
        if j >= i:
            j += 1
        a = endpoints[i]
        b = endpoints[j]
        return b if load_score(b) < load_score(a) else a


@hookimpl
def register_balancers(register: RegisterBalancer) -> None:
    register(
        "power_of_two",
        PowerOfTwo,
        options=PowerOfTwoOptions,
        description="The less loaded of two endpoints drawn at random.",
    )
