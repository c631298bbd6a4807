"""Routing state shared by the gateways of a fleet, kept in step off the request path.

Every ``sync_interval_s`` each gateway sends one :class:`FleetBatch` — the prefix blocks its
balancers recorded since the last sync (each pool's :class:`~shuniu.core.contracts.SharedIndex`,
by endpoint name), and its requests and tokens in flight per endpoint — and in the same
round trip reads the batches the others sent. Their blocks are merged into the local
indexes (so a conversation started through one gateway finds its engine through another),
and their in-flight counts become each endpoint's ``remote_in_flight`` and
``remote_tokens`` (so the load view counts the others' traffic at once instead of a poll
later). Requests never wait for it: balancers read the local view, at most one interval
plus one round trip behind the fleet.

When the fleet's store cannot be reached, each gateway routes on its local state (said once
in the log; ``degraded`` in ``/status.json``) and picks up again when it is back. A gateway
that stops publishing drops out of the others' counts after ``stale_after_s``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from zlib import crc32

import msgspec

from shuniu.core.fleet.hub import FleetTransport
from shuniu.core.pools.pool import Pool
from shuniu.core.types import EndpointLoad
from shuniu.core.version import __version__

__all__ = ["FleetBatch", "FleetSync"]

log = logging.getLogger("shuniu.fleet")


class FleetBatch(msgspec.Struct, array_like=True):
    """What one gateway says in one sync."""

    gateway: str
    sent: float
    """The sender's wall clock (old batches read at start-up carry no current counts)."""
    inflight: dict[str, dict[str, tuple[int, int]]]
    """Pool → endpoint → (requests, tokens) in flight from this gateway."""
    prefixes: list[tuple[str, str, list[int]]]
    """(pool, endpoint, block hashes) sent since the last batch."""
    version: str = ""
    """The sender's shuniu version (last: batches of an older sender decode without it)."""
    loads: list[tuple[str, str, EndpointLoad]] = msgspec.field(default_factory=list)
    """(pool, endpoint, snapshot) of the engines this gateway polls for the fleet."""
    demand: dict[str, tuple[float, float]] = msgspec.field(default_factory=dict)
    """Pool → (arrival rate now, forecast) this gateway sees, for pools with
    ``autoscaling:`` (so each gateway's desired count is the fleet's)."""
    queues: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    """Pool → its scheduler's ``fleet_state()`` (tiers' slots, tenants' service)."""
    prefill: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)
    """Pool → endpoint → uncached prompt tokens of this gateway's requests there that have
    not answered yet (``prefill_tokens``: the prefix balancers weigh the fleet's)."""


class _Peer(msgspec.Struct):
    seen: float
    """When its last batch arrived (loop time)."""
    inflight: dict[str, dict[str, tuple[int, int]]]
    version: str
    demand: dict[str, tuple[float, float]] = msgspec.field(default_factory=dict)
    queues: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    """Pool → the scheduler state it last sent, less its ``service``."""
    unmerged: dict[str, dict[str, dict[str, float]]] = msgspec.field(default_factory=dict)
    """Pool → the ``service`` it said (summed over its batches) not yet merged here."""
    prefill: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)


_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder(FleetBatch).decode


def _add_service(total: dict[str, dict[str, float]], service: dict[str, dict[str, float]]) -> None:
    """Add a ``service`` (priority → tenant → amount) into ``total``."""
    for prio, tenants in service.items():
        into = total.setdefault(prio, {})
        for tenant, amount in tenants.items():
            into[tenant] = into.get(tenant, 0.0) + amount


def gateway_id() -> str:
    """This process's name in the fleet: host, pid and a random part."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class FleetSync:
    """One gateway's share of the fleet's routing state."""

    def __init__(
        self,
        transport: FleetTransport,
        pools: Callable[[], Mapping[str, Pool]],
        *,
        interval_s: float,
        stale_after_s: float,
        name: str | None = None,
    ) -> None:
        self.transport = transport
        self._pools = pools
        self.interval_s = interval_s
        self.stale_after_s = stale_after_s
        self.name = name or gateway_id()
        self._cursor: Any = None
        self._peers: dict[str, _Peer] = {}
        """The other gateways heard from within ``stale_after_s``."""
        self._task: asyncio.Task[None] | None = None
        self._last_inflight: dict[str, dict[str, tuple[int, int]]] | None = None
        self._last_prefill: dict[str, dict[str, int]] | None = None
        self._last_demand: dict[str, tuple[float, float]] = {}
        self._last_queues: dict[str, dict[str, Any]] = {}
        self._last_sent = 0.0
        self.degraded = False
        self.syncs = 0
        self.failures = 0
        self.merged_blocks = 0
        self.published_blocks = 0
        self._offered: dict[tuple[str, str], EndpointLoad] = {}
        """Snapshots this gateway polled since the last batch, for the others."""
        self._shared_loads: dict[tuple[str, str], tuple[EndpointLoad, float]] = {}
        """The latest snapshot another gateway polled, per (pool, endpoint), and when it came."""
        self.last_sync = 0.0

    # -- running ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._share()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="shuniu-fleet-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        await self.transport.close()

    async def _run(self) -> None:
        while True:
            await self.sync_once()
            await asyncio.sleep(self.interval_s)

    async def sync_once(self) -> bool:
        """One exchange with the fleet; ``False`` when its store could not be reached."""
        loop = asyncio.get_running_loop()
        pools = self._pools()
        self._share()
        batch = self._outgoing(pools, loop.time())
        try:
            async with asyncio.timeout(max(self.interval_s * 5, 1.0)):
                self._cursor, incoming = await self.transport.exchange(batch, self._cursor)
        except Exception as exc:  # any failure of the store: route on the local view
            self.failures += 1
            if not self.degraded:
                self.degraded = True
                log.warning("the fleet's store cannot be reached (%s); routing on local state", exc)
            self._apply_inflight(pools, loop.time())
            return False
        if self.degraded:
            self.degraded = False
            log.warning("the fleet's store is reachable again; sharing routing state")
        now = loop.time()
        self._apply(pools, incoming, now)
        self._apply_inflight(pools, now)
        self.syncs += 1
        self.last_sync = now
        return True

    # -- out ------------------------------------------------------------------------------

    def _share(self) -> None:
        for pool in self._pools().values():
            index = pool.balancer.shared_index()
            if index is not None:
                index.share()

    def _outgoing(self, pools: Mapping[str, Pool], now: float) -> bytes:
        prefixes: list[tuple[str, str, list[int]]] = []
        for name, pool in pools.items():
            index = pool.balancer.shared_index()
            if index is None or not index.outbox:
                continue
            entries, index.outbox = index.outbox, []
            names = {e.index: e.name for e in pool.endpoints}
            seen: set[tuple[int, int]] = set()
            for i in range(len(entries) - 1, -1, -1):  # newest first: one per chain and endpoint
                ep, hashes = entries[i]
                key = (ep, hashes[-1])
                if key in seen or ep not in names:
                    continue
                seen.add(key)
                prefixes.append((name, names[ep], list(hashes)))
                self.published_blocks += len(hashes)
        inflight = {
            name: {e.name: (e.in_flight, e.in_flight_tokens) for e in pool.endpoints if e.in_flight}
            for name, pool in pools.items()
        }
        inflight = {k: v for k, v in inflight.items() if v}
        prefill = {
            name: {e.name: e.prefill_tokens for e in pool.endpoints if e.prefill_tokens}
            for name, pool in pools.items()
        }
        prefill = {k: v for k, v in prefill.items() if v}
        demand = {
            name: (pool.scaling.rate, pool.scaling.forecast)
            for name, pool in pools.items()
            if pool.scaling is not None
        }
        queues: dict[str, dict[str, Any]] = {}
        for name, pool in pools.items():
            state = pool.scheduler.fleet_state()
            if state is not None:
                queues[name] = dict(state)
        heartbeat = now - self._last_sent >= self.stale_after_s / 3
        # A queue's service since the last batch is said once: a batch carrying some is sent.
        said = {name: {k: v for k, v in q.items() if k != "service"} for name, q in queues.items()}
        news = any(q.get("service") for q in queues.values())
        unchanged = (
            inflight == self._last_inflight
            and prefill == self._last_prefill
            and demand == self._last_demand
            and said == self._last_queues
        )
        if not prefixes and not self._offered and unchanged and not news and not heartbeat:
            return b""
        self._last_inflight = inflight
        self._last_prefill = prefill
        self._last_demand = demand
        self._last_queues = said
        self._last_sent = now
        loads = [(p, e, snap) for (p, e), snap in self._offered.items()]
        self._offered = {}
        return _encode(
            FleetBatch(
                self.name, time.time(), inflight, prefixes, __version__, loads, demand, queues, prefill
            )
        )

    # -- in -------------------------------------------------------------------------------

    def _apply(self, pools: Mapping[str, Pool], incoming: Sequence[bytes], now: float) -> None:
        if not incoming:
            return
        wall = time.time()
        endpoints = {(name, e.name): e for name, pool in pools.items() for e in pool.endpoints}
        for raw in incoming:
            try:
                batch = _decode(raw)
            except msgspec.DecodeError:
                continue  # another version's, or not ours
            if batch.gateway == self.name:
                continue
            if wall - batch.sent <= self.stale_after_s:
                before = self._peers.get(batch.gateway)
                queues = dict(before.queues) if before is not None else {}
                # Several batches of one gateway between two merges: their service adds up.
                unmerged = before.unmerged if before is not None else {}
                for pool_name, state in batch.queues.items():
                    service = state.get("service")
                    if service:
                        _add_service(unmerged.setdefault(pool_name, {}), service)
                    queues[pool_name] = {k: v for k, v in state.items() if k != "service"}
                self._peers[batch.gateway] = _Peer(
                    now, batch.inflight, batch.version, batch.demand, queues, unmerged, batch.prefill
                )
                for pool_name, endpoint, snap in batch.loads:
                    self._shared_loads[(pool_name, endpoint)] = (snap, now)
                    local = endpoints.get((pool_name, endpoint))
                    if local is not None:
                        # In place at once; the load loop adapts the limit to it and ages it.
                        local.load, local.load_at, local.load_weight = snap, now, 1.0
            for pool_name, endpoint, hashes in batch.prefixes:
                local = endpoints.get((pool_name, endpoint))
                if local is None or not hashes:
                    continue
                index = pools[pool_name].balancer.shared_index()
                if index is not None:
                    index.merge(local.index, hashes)
                    self.merged_blocks += len(hashes)

    def _apply_inflight(self, pools: Mapping[str, Pool], now: float) -> None:
        for gw, peer in list(self._peers.items()):
            if now - peer.seen > self.stale_after_s:
                del self._peers[gw]
        for name, pool in pools.items():
            freed = False
            for e in pool.endpoints:
                requests = tokens = prefill = 0
                for peer in self._peers.values():
                    got = peer.inflight.get(name, {}).get(e.name)
                    if got is not None:
                        requests += got[0]
                        tokens += got[1]
                    prefill += peer.prefill.get(name, {}).get(e.name, 0)
                if requests < e.remote_in_flight:
                    freed = True
                e.remote_in_flight = requests
                e.remote_tokens = tokens
                e.remote_prefill_tokens = prefill
            states = []
            for peer in self._peers.values():
                state = peer.queues.get(name)
                if state is not None:
                    service = peer.unmerged.get(name)  # merged once: cleared below
                    states.append({**state, "service": service} if service else state)
            if states:
                pool.scheduler.merge_fleet(states)
            if freed or states:
                # Slots the others freed (or a larger share of them) may fit this
                # gateway's waiters.
                pool.scheduler.wake(pool)
        for peer in self._peers.values():
            peer.unmerged.clear()  # (service for a pool this gateway lacks has nowhere to go)

    # -- engine load: one poller per endpoint for the fleet -------------------------------

    def polls(self, pool: str, endpoint: str, now: float, fresh_s: float) -> bool:
        """Whether this gateway should poll ``endpoint``'s engine itself: it is the one the
        fleet's live gateways agree on (highest rendezvous hash of gateway and endpoint), or
        the store cannot be reached, or no snapshot from the chosen one came within
        ``fresh_s`` (it may not know the endpoint)."""
        if self.degraded or not self._peers:
            return True
        key = f"\x00{pool}\x00{endpoint}".encode()
        owner = max([self.name, *self._peers], key=lambda gw: crc32(gw.encode() + key))
        if owner == self.name:
            return True
        shared = self._shared_loads.get((pool, endpoint))
        return shared is None or now - shared[1] > fresh_s

    def offer(self, pool: str, endpoint: str, snap: EndpointLoad) -> None:
        """A snapshot this gateway polled: sent to the others with the next batch."""
        if self._peers:
            self._offered[(pool, endpoint)] = snap

    def shared_load(self, pool: str, endpoint: str) -> tuple[EndpointLoad, float] | None:
        """The latest snapshot of ``endpoint`` another gateway polled, and when it arrived."""
        return self._shared_loads.get((pool, endpoint))

    # -- reading ----------------------------------------------------------------------------

    def peer_demand(self, pool: str) -> tuple[float, int]:
        """What the other live gateways last said they see for ``pool`` with
        ``autoscaling:``: the sum of each one's ``max(rate now, forecast)``, and how many."""
        ahead = 0.0
        n = 0
        for peer in self._peers.values():
            got = peer.demand.get(pool)
            if got is not None:
                ahead += max(got)
                n += 1
        return ahead, n

    def status(self, now: float) -> dict[str, Any]:
        """For ``/status.json``: this gateway's name, the others heard from (when last, their
        version and requests in flight), whether the store is reachable, and how long ago
        the last sync was."""
        peers = [
            {
                "gateway": name,
                "age_s": round(now - peer.seen, 3),
                "version": peer.version or None,
                "in_flight": sum(n for counts in peer.inflight.values() for n, _ in counts.values()),
            }
            for name, peer in sorted(self._peers.items())
        ]
        return {
            "gateway": self.name,
            "peers": peers,
            "degraded": self.degraded,
            "last_sync_s": round(now - self.last_sync, 3) if self.last_sync else None,
            "published_blocks": self.published_blocks,
            "merged_blocks": self.merged_blocks,
        }
