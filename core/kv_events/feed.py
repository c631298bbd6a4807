"""One endpoint's KV-event stream into the index: sequence numbers checked, batches decoded
and applied, gaps and engine restarts resynchronised.

The transport hands :meth:`KvEventFeed.receive` each message's sequence number and payload
(a ZMQ subscription, :mod:`.subscriber`; or the in-process simulator, :mod:`.local`). A
sequence number

- one past the last: applied;
- at or below the last (from 0 again): the engine restarted and its cache is empty — the
  endpoint's entries are cleared, then the batch applied;
- further on (messages lost: a slow consumer past the publisher's high-water mark, a
  reconnect): the transport may fetch the missing batches from the engine's replay socket
  (:meth:`missing` says which); otherwise the endpoint's entries are cleared — blocks stored
  before the gap stay invisible until stored again, which costs hits, never a wrong answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from shuniu.core.kv_events.index import KvBlockIndex
from shuniu.core.kv_events.wire import EventBatch, decode_batch

__all__ = ["KvEventFeed"]

log = logging.getLogger("shuniu.kv_events")


class KvEventFeed:
    """The KV events of one endpoint (its index in the pool: ``endpoint``)."""

    __slots__ = (
        "applied",
        "endpoint",
        "gaps",
        "index",
        "invalid",
        "last",
        "name",
        "on_batch",
        "resets",
    )

    def __init__(
        self,
        index: KvBlockIndex,
        endpoint: int,
        name: str,
        on_batch: Callable[[EventBatch], None] | None = None,
    ) -> None:
        self.index = index
        self.endpoint = endpoint
        self.name = name
        self.on_batch = on_batch
        self.last: int | None = None
        """The last sequence number applied (``None``: none yet)."""
        self.applied = 0
        self.gaps = 0
        """Times messages were missing (recovered by a replay or not)."""
        self.resets = 0
        """Times the endpoint's entries were cleared (restart, unrecovered gap, AllBlocksCleared)."""
        self.invalid = 0
        """Payloads that were not event batches (logged once)."""

    def missing(self, seq: int) -> range | None:
        """The sequence numbers lost before ``seq`` (``None``: nothing is missing)."""
        last = self.last
        if last is None or seq <= last + 1:
            return None
        return range(last + 1, seq)

    def receive(self, seq: int, payload: bytes) -> None:
        """Apply one message (after any replay of what :meth:`missing` named)."""
        last = self.last
        if last is not None and seq != last + 1:
            if seq <= last:
                log.info(
                    "KV events of %s start again at %d (engine restarted): its entries cleared",
                    self.name,
                    seq,
                )
            else:
                self.gaps += 1
                log.info(
                    "KV events of %s lost %d batches: its entries cleared until its blocks are stored again",
                    self.name,
                    seq - last - 1,
                )
            self.reset()
        self.last = seq
        self.apply(payload)

    def replayed(self, seq: int, payload: bytes) -> None:
        """A batch the engine's replay socket sent for a gap: applied in order, others skipped."""
        if self.last is not None and seq == self.last + 1:
            self.last = seq
            self.apply(payload)

    def apply(self, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            if not self.invalid:
                log.warning("KV events of %s: a message that is not an event batch (%s)", self.name, exc)
            self.invalid += 1
            return
        self.index.apply(self.endpoint, batch)
        self.applied += 1
        if self.on_batch is not None:
            self.on_batch(batch)

    def reset(self) -> None:
        """Forget what the endpoint held (its events can no longer be trusted to be whole)."""
        self.resets += 1
        self.index.clear(self.endpoint)
