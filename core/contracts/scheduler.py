"""The scheduler contract: a pool's queue.

Where it runs: once the request is authenticated, routed to a pool, within its rate limits
and not answered from the cache, the gateway awaits :meth:`Scheduler.admit`, which returns
a :class:`~shuniu.core.contracts.views.Ticket` holding an endpoint slot (it calls
:meth:`~shuniu.core.contracts.views.PoolView.try_dispatch`, which asks the balancer) or
refuses the request. When the engine call ends the gateway calls :meth:`Scheduler.release`;
when capacity may have appeared (an endpoint turned healthy, a limit grew, an endpoint
joined) it calls :meth:`Scheduler.wake`. One instance per pool (``scheduler.policy``).

Subclass :class:`Scheduler` to inherit the defaults of its optional members.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from shuniu.core.contracts.conformance import optional
from shuniu.core.contracts.views import PoolView, Ticket
from shuniu.core.types import InferenceRequest, Outcome

__all__ = ["Scheduler"]

_NONE: Mapping[str, int] = {}


class Scheduler(Protocol):
    """Owns a pool's queue: decides which waiting request is dispatched next.

    A scheduler class may set ``steps_without_task = True`` when :meth:`admit` needs no
    task of its own (it uses neither ``asyncio.timeout`` nor ``asyncio.current_task``: it
    limits a wait with :func:`shuniu.core.timers.cancel_at`). ``shuniu simulate`` then runs
    the admission on callbacks, as a task would step it, instead of with a task per request
    (the built-in schedulers do); otherwise it gives each admission a task, a loop turn
    later than the request's arrival."""

    async def admit(self, req: InferenceRequest, pool: PoolView) -> Ticket:
        """Wait until the request may start and return its ticket, or raise
        :class:`shuniu.core.errors.GatewayError` (429/503/504, with ``Retry-After``) to
        refuse it. A cancelled wait (the client left) must leave no slot held."""
        ...

    def release(self, ticket: Ticket, outcome: Outcome) -> None:
        """The request holding ``ticket`` ended: free its slot (``ticket.pool.free``) and
        dispatch waiters that fit now."""
        ...

    def wake(self, pool: PoolView) -> None:
        """Capacity may have appeared; dispatch what fits."""
        ...

    # -- optional --------------------------------------------------------------------

    @optional
    def adopt_tiers(self, priorities: Mapping[str, int]) -> None:
        """Optional: the deployment's tiers and their priorities (``tiers.<t>.priority``),
        given once at start-up and after a reload. The default ignores them."""
        return None

    @property
    @optional
    def queued(self) -> int | None:
        """Optional: requests waiting now (``/ready``, ``/metrics``); ``None`` (the
        default) when the scheduler does not count them."""
        return None

    @property
    @optional
    def rejected(self) -> Mapping[str, int]:
        """Optional: refusals since start by error code (``/metrics``). Default: none."""
        return _NONE

    @optional
    def fleet_state(self) -> Mapping[str, Any] | None:
        """Optional: what the fleet's other gateways should know of this queue
        (``fleet:``), taken once per sync, off the request path: a mapping of plain values
        (msgpack: strings, numbers, lists, mappings). ``None`` (the default): nothing."""
        return None

    @optional
    def merge_fleet(self, states: Sequence[Mapping[str, Any]]) -> None:
        """Optional: the latest :meth:`fleet_state` of each other live gateway, once per
        sync, so that shares and limits hold across the fleet. Its ``service`` member (if
        any) is passed once, in the sync that brought it, and empty after: a state may say
        both what holds now (``tiers``) and what happened since it last spoke. The default
        ignores them."""
        return None
