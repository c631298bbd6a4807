"""KV events over ZMQ, as vLLM sends them (``--kv-events-config``): a PUB socket sending
``[topic, sequence, payload]`` and, optionally, a ROUTER socket that answers a replay request
(the first wanted sequence number, 8 bytes big-endian) with the buffered messages from there,
then an end marker (sequence ``-1``).

:class:`ZmqPublisher` is the simulator's side (``shuniu sim serve --kv-events-config``);
:class:`ZmqSubscriber` the gateway's, one per endpoint: a task that receives messages, drains
what is queued in one go (events are applied off the request path, in batches), fills a gap
from the replay socket when the engine has one, and otherwise lets :class:`KvEventFeed`
resynchronise. Needs ``pyzmq`` (``pip install 'shuniu[kv-events]'``).

vLLM's rule for the address: an endpoint with a wildcard (``tcp://*:5557``) or an ``ipc://``
/ ``inproc://`` one is bound, any other is connected to. The subscriber does the opposite of
its engine: it connects to an engine that binds, and binds (``bind: true``) for engines that
connect to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from shuniu.core.extras import require
from shuniu.core.kv_events.feed import KvEventFeed
from shuniu.core.kv_events.wire import EventBatch, encode_batch, sequence_bytes
from shuniu.core.tasks import cancel_and_wait

__all__ = ["ZmqPublisher", "ZmqSubscriber", "engine_binds"]

log = logging.getLogger("shuniu.kv_events")

_END = -1
_DRAIN = 256
"""Messages applied per wake-up at most, before yielding to the event loop."""
_REPLAY_TIMEOUT_S = 1.0


def engine_binds(endpoint: str) -> bool:
    """Whether an engine given ``endpoint`` binds it (vLLM's rule) rather than connects."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _zmq() -> Any:
    zmq = require("zmq", "kv-events", "KV-cache events")
    require("zmq.asyncio", "kv-events", "KV-cache events")
    return zmq


class ZmqPublisher:
    """Publishes event batches on a PUB socket, with a replay buffer."""

    def __init__(
        self,
        endpoint: str,
        *,
        topic: str = "",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
    ) -> None:
        zmq = _zmq()
        self._zmq = zmq
        self.ctx = zmq.asyncio.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.set_hwm(hwm)
        self.pub.setsockopt(zmq.LINGER, 0)
        if engine_binds(endpoint):
            self.pub.bind(endpoint)
        else:
            self.pub.connect(endpoint)
        self.topic = topic.encode()
        self.seq = 0
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.replay: Any = None
        self._task: asyncio.Task[None] | None = None
        if replay_endpoint is not None:
            self.replay = self.ctx.socket(zmq.ROUTER)
            self.replay.setsockopt(zmq.LINGER, 0)
            self.replay.bind(replay_endpoint)

    def start(self) -> None:
        if self.replay is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replay(), name="kv-events-replay")

    def publish(self, batch: EventBatch) -> None:
        """Send one batch now (never waits: past the high-water mark ZMQ drops it, and the
        subscriber sees a gap)."""
        if self.replay is not None and self._task is None:
            self.start()  # the first batch comes from the running engine: its loop serves replays
        payload = encode_batch(batch)
        seq = self.seq
        self.seq = seq + 1
        self.buffer.append((seq, payload))
        try:
            self.pub.send_multipart((self.topic, sequence_bytes(seq), payload), flags=self._zmq.NOBLOCK)
        except self._zmq.Again:
            pass

    async def _serve_replay(self) -> None:
        while True:
            frames = await self.replay.recv_multipart()
            if len(frames) != 3:
                continue
            client, _empty, start = frames
            first = int.from_bytes(start, "big")
            for seq, payload in list(self.buffer):
                if seq >= first:
                    await self.replay.send_multipart((client, b"", self.topic, sequence_bytes(seq), payload))
            await self.replay.send_multipart((client, b"", b"", sequence_bytes(_END), b""))

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        self.pub.close(0)
        if self.replay is not None:
            self.replay.close(0)
        self.ctx.term()


class ZmqSubscriber:
    """Receives one endpoint's events into its feed."""

    def __init__(
        self,
        feed: KvEventFeed,
        endpoint: str,
        *,
        topic: str = "",
        replay_endpoint: str | None = None,
        bind: bool = False,
    ) -> None:
        self.feed = feed
        self.endpoint = endpoint
        self.topic = topic.encode()
        self.replay_endpoint = replay_endpoint
        self.bind = bind
        self.received = 0
        self.replays = 0
        self._task: asyncio.Task[None] | None = None
        self._ctx: Any = None
        self._sub: Any = None

    async def start(self) -> None:
        zmq = _zmq()
        self._ctx = zmq.asyncio.Context()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 100_000)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        if self.bind:
            sub.bind(self.endpoint)
        else:
            sub.connect(self.endpoint)
        self._sub = sub
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"kv-events-{self.feed.name}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._sub is not None:
            self._sub.close(0)
            self._sub = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    async def _run(self) -> None:
        zmq = _zmq()
        sub = self._sub
        feed = self.feed
        while True:
            try:
                frames = await sub.recv_multipart()
                for _ in range(_DRAIN):
                    await self._one(frames)
                    try:
                        frames = await sub.recv_multipart(flags=zmq.NOBLOCK)
                    except zmq.Again:
                        break
                else:
                    await self._one(frames)
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one bad message end the subscription
                log.exception("KV events of %s: a message could not be applied", feed.name)

    async def _one(self, frames: list[bytes]) -> None:
        if len(frames) != 3:
            self.feed.invalid += 1
            return
        _topic, seq_bytes, payload = frames
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        self.received += 1
        feed = self.feed
        if self.replay_endpoint is not None:
            lost = feed.missing(seq)
            if lost is not None or (feed.last is None and seq > 0):
                await self._replay(lost.start if lost is not None else 0, seq)
        feed.receive(seq, payload)

    async def _replay(self, first: int, upto: int) -> None:
        """Ask the engine's replay socket for ``first`` .. ``upto - 1`` and apply them."""
        zmq = _zmq()
        self.replays += 1
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            assert self.replay_endpoint is not None
            sock.connect(self.replay_endpoint)
            await sock.send_multipart((b"", first.to_bytes(8, "big")))
            feed = self.feed
            while True:
                if not await sock.poll(_REPLAY_TIMEOUT_S * 1000):
                    log.info("KV events of %s: the replay socket did not answer", feed.name)
                    return
                frames = await sock.recv_multipart()
                if len(frames) != 4:
                    return
                _empty, _topic, seq_bytes, payload = frames
                seq = int.from_bytes(seq_bytes, "big", signed=True)
                if seq == _END or seq >= upto:
                    if seq == _END:
                        return
                    continue
                if feed.last is None:
                    feed.receive(seq, payload)
                else:
                    feed.replayed(seq, payload)
        finally:
            sock.close(0)
