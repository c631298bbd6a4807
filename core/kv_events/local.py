"""KV events inside one process: the in-process ``sim`` backend publishes each step's events
here, encoded exactly as on the wire, and the gateway's feeds receive them synchronously, so
``shuniu simulate`` and the tests run the same decoding and indexing path as a ZMQ
subscription to a real engine."""

from __future__ import annotations

from collections.abc import Callable

from shuniu.core.kv_events.wire import EventBatch, encode_batch

__all__ = ["LocalKvEvents"]

Receiver = Callable[[int, bytes], None]


class LocalKvEvents:
    """One engine's event stream, numbered from 0 (again after :meth:`restart`)."""

    __slots__ = ("receivers", "seq")

    def __init__(self) -> None:
        self.seq = 0
        self.receivers: list[Receiver] = []

    def subscribe(self, receive: Receiver) -> None:
        self.receivers.append(receive)

    def publish(self, batch: EventBatch) -> None:
        if not self.receivers:
            return
        payload = encode_batch(batch)
        seq = self.seq
        self.seq = seq + 1
        for receive in self.receivers:
            receive(seq, payload)

    def restart(self) -> None:
        """The engine started again (empty cache): numbers start from 0, as a new process's."""
        self.seq = 0
