"""Overload detection per pool, and per-tier degradation (``tiers.<t>.degrade``).

Two signals per pool, from finished requests (a ``request_finished`` observer): the queue
wait of admitted requests and whether the scheduler refused a request (full queue, wait
limits, shedding), each as an exponentially weighted average that also decays with time
(half-life ``HALF_LIFE_S``), so a pool that stops receiving requests recovers by itself.
A tier's degradation starts when either signal passes its threshold and ends when both are
below half of it (hysteresis, so it does not flap).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from shuniu.core.config import DegradeConfig
from shuniu.core.errors import GatewayError
from shuniu.core.http.asgi import header_value
from shuniu.core.pools.pool import Pool
from shuniu.core.tenancy.tenancy import Tier
from shuniu.core.types import InferenceRequest, RequestRecord

__all__ = ["HALF_LIFE_S", "OverloadMonitor", "degrade"]

HALF_LIFE_S = 5.0
"""Without new requests, the signals halve every this many seconds (by default)."""
_ALPHA = 0.1
"""Weight of each new request in the averages."""
_REFUSED = frozenset({"queue_full", "queue_wait_exceeded", "queue_timeout", "shed"})


class _Signals:
    __slots__ = ("at", "refused", "wait")

    def __init__(self) -> None:
        self.wait = 0.0
        self.refused = 0.0
        self.at = 0.0


class OverloadMonitor:
    """Per-pool overload signals and per-(pool, tier) degradation state."""

    def __init__(self, clock: object, half_life_s: float = HALF_LIFE_S) -> None:
        self._clock = clock  # the event loop's time()
        self.half_life_s = half_life_s
        self._pools: dict[str, _Signals] = {}
        self._degraded: set[tuple[str, str]] = set()
        self.degraded_requests: dict[tuple[str, str, str], int] = {}
        """(model, tier, action) → requests degraded (for metrics)."""

    def _decayed(self, s: _Signals, now: float) -> float:
        return math.pow(0.5, max(0.0, now - s.at) / self.half_life_s)

    def observe(self, record: RequestRecord) -> None:
        pool = record.pool
        if pool is None:
            return
        s = self._pools.get(pool)
        if s is None:
            s = self._pools[pool] = _Signals()
            s.at = record.finished
        k = self._decayed(s, record.finished)
        refused = record.error_code in _REFUSED
        if record.admitted is not None:
            s.wait = (1 - _ALPHA) * s.wait * k + _ALPHA * max(0.0, record.admitted - record.arrival)
        elif not refused:
            return  # neither admitted nor refused by the scheduler: says nothing about load
        s.refused = (1 - _ALPHA) * s.refused * k + (_ALPHA if refused else 0.0)
        s.at = record.finished

    def signals(self, pool: str) -> tuple[float, float]:
        """(queue wait, refused share) of the pool now."""
        s = self._pools.get(pool)
        if s is None:
            return 0.0, 0.0
        k = self._decayed(s, self._clock())  # type: ignore[operator]
        return s.wait * k, s.refused * k

    def degraded(self, pool: str, tier: str, cfg: DegradeConfig) -> bool:
        wait, refused = self.signals(pool)
        key = (pool, tier)
        if key in self._degraded:
            if wait < cfg.queue_wait_s / 2 and refused < cfg.refused_share / 2:
                self._degraded.discard(key)
                return False
            return True
        if wait > cfg.queue_wait_s or refused > cfg.refused_share:
            self._degraded.add(key)
            return True
        return False

    def count(self, pool: str, tier: str, action: str) -> None:
        key = (pool, tier, action)
        self.degraded_requests[key] = self.degraded_requests.get(key, 0) + 1

    @property
    def degraded_pairs(self) -> set[tuple[str, str]]:
        return set(self._degraded)


def degrade(
    req: InferenceRequest, tier: Tier, pool: Pool, pools: Mapping[str, Pool], monitor: OverloadMonitor
) -> tuple[Pool, bytes]:
    """Apply the tier's degradation while ``pool`` is overloaded: shed (503 ``overloaded``),
    cap ``max_tokens``, and/or route to another model. Returns the pool to use and what was
    done, for ``x-shuniu-degraded``."""
    cfg = tier.degrade
    assert cfg is not None
    if cfg.shed:
        monitor.count(pool.name, tier.name, "shed")
        raise GatewayError(
            503,
            f"`{pool.name}` is overloaded; requests of tier {tier.name!r} are refused until it recovers.",
            type="server_error",
            code="overloaded",
            headers={"retry-after": "5", "x-shuniu-degraded": "shed"},
        )
    done = []
    if cfg.max_tokens is not None and (req.max_tokens is None or req.max_tokens > cfg.max_tokens):
        req.max_tokens = cfg.max_tokens
        req.body["max_tokens"] = cfg.max_tokens
        req.body.pop("max_completion_tokens", None)
        done.append(f"max_tokens={cfg.max_tokens}")
        monitor.count(pool.name, tier.name, "max_tokens")
    if cfg.route_to is not None and cfg.route_to != pool.name and req.api in pools[cfg.route_to].serves:
        monitor.count(pool.name, tier.name, "route")
        pool = pools[cfg.route_to]
        done.append(f"model={cfg.route_to}")
    return pool, header_value(",".join(done)) if done else b"none"
