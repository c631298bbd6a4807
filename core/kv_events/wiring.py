"""Connects each pool's KV-event index (a balancer with ``kv_index()``, e.g.
``precise_prefix``) to its endpoints' event streams: a ZMQ subscription for an endpoint with
``kv_events:``, the in-process stream of a ``sim`` backend. Built at start and again after a
reload (new pools, new balancers: the old feeds are dropped)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from shuniu.core.kv_events.feed import KvEventFeed
from shuniu.core.kv_events.index import KvBlockIndex

__all__ = ["KvEventWiring"]

log = logging.getLogger("shuniu.kv_events")


def pool_index(pool: Any) -> KvBlockIndex | None:
    """The KV-event index of ``pool``'s balancer, if it keeps one."""
    method = getattr(pool.balancer, "kv_index", None)
    index = method() if callable(method) else None
    return index if isinstance(index, KvBlockIndex) else None


class KvEventWiring:
    """Every pool's feeds and subscriptions."""

    def __init__(self) -> None:
        self.feeds: dict[str, list[KvEventFeed]] = {}
        """Pool name → its endpoints' feeds."""
        self._subscribers: list[Any] = []
        self._local: list[tuple[Any, Any]] = []
        """(in-process source, receiver) pairs, to unsubscribe."""

    async def start(self, pools: Mapping[str, Any]) -> None:
        """Feed every pool whose balancer keeps a KV-event index (after :meth:`stop` of any
        earlier wiring)."""
        for name, pool in pools.items():
            index = pool_index(pool)
            if index is None:
                continue
            feeds = self.feeds[name] = []
            for endpoint in pool.endpoints:
                feed = KvEventFeed(index, endpoint.index, endpoint.name)
                cfg = endpoint.kv_events
                source = getattr(endpoint.backend, "kv_event_source", None)
                if cfg is not None:
                    from shuniu.core.kv_events.zmq_transport import ZmqSubscriber

                    sub = ZmqSubscriber(
                        feed,
                        cfg.endpoint,
                        topic=cfg.topic,
                        replay_endpoint=cfg.replay_endpoint,
                        bind=cfg.bind,
                    )
                    await sub.start()
                    self._subscribers.append(sub)
                elif callable(source):
                    stream = source()
                    stream.subscribe(feed.receive)
                    self._local.append((stream, feed.receive))
                else:
                    continue  # an engine that publishes nothing: the balancer's memory of dispatches only
                feeds.append(feed)
            if not feeds:
                log.warning(
                    "pool %s routes by KV events, but none of its endpoints publishes them "
                    "(kv_events: on each endpoint); it routes by its own dispatches only",
                    name,
                )

    async def stop(self) -> None:
        for sub in self._subscribers:
            await sub.stop()
        for stream, receive in self._local:
            if receive in stream.receivers:
                stream.receivers.remove(receive)
        self._subscribers, self._local, self.feeds = [], [], {}
