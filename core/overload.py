"""Overload detection per pool, for per-tier degradation (``tiers.<t>.degrade``).

Two signals per pool, from finished requests (a ``request_finished`` observer): the queue
wait of admitted requests and whether the scheduler refused a request (full queue, wait
limits, shedding), each as an exponentially weighted average that also decays with time
(half-life ``HALF_LIFE_S``), so a pool that stops receiving requests recovers by itself.
A tier's degradation starts when either signal passes its threshold and ends when both are
below half of it (hysteresis, so it does not flap).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from shuniu.core.types import RequestRecord

if TYPE_CHECKING:
    from shuniu.core.config import DegradeConfig

__all__ = ["HALF_LIFE_S", "OverloadMonitor"]

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
