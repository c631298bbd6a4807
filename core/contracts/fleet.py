"""What the gateways of a fleet share about routing (``fleet:`` in the deployment,
:mod:`shuniu.core.fleet`): the prefix blocks each endpoint was sent, through a balancer's or
scorer's :class:`SharedIndex`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["SharedIndex"]


class SharedIndex(Protocol):
    """A prefix index that other gateways' routing decisions can be merged into.

    The gateway calls :meth:`share` once when the deployment has a fleet; from then on the
    index keeps what it records in :attr:`outbox` (endpoint index and block hashes, in
    order), which the fleet sync empties every ``sync_interval_s`` and publishes. What the
    other gateways sent is applied with :meth:`merge`. Both run on the event loop, never
    concurrently with a pick.
    """

    outbox: list[tuple[int, Sequence[int]]] | None
    """What was recorded since the last sync (``None`` until :meth:`share`)."""

    def share(self) -> None:
        """Start keeping :attr:`outbox`."""
        ...

    def merge(self, endpoint: int, hashes: Sequence[int]) -> None:
        """Another gateway sent these blocks to the endpoint of this index (local
        endpoint index), as if this gateway had: they are not put in :attr:`outbox`."""
        ...
