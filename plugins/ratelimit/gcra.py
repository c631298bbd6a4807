"""The GCRA arithmetic shared by the rate-limit stores (the Redis store's Lua mirrors it).

A key's state is its theoretical arrival time ``tat``; ``debt = max(tat - now, 0)`` is how
far ahead of the clock the key has been booked. With ``T = period_s / limit`` a request of
``cost`` units passes when ``debt + cost·T <= period_s`` and then books ``tat = now + debt +
cost·T``. Everything else follows from the debt: ``reset_s`` is the debt itself (the time
until the key is full again) and ``remaining`` is the largest cost that would pass now.

Times are compared with a tolerance of :data:`EPSILON_S`, because ``tat`` is a sum of many
``cost·T`` terms kept at a large absolute time (Redis stores microseconds since 1970, whose
doubles step by 0.25 µs): without it ``limit = 3, period_s = 1`` could refuse its third
request over a rounding error.
"""

from __future__ import annotations

import math

__all__ = ["EPSILON_S", "INF", "check", "remaining"]

EPSILON_S = 1e-6
"""A request this early (in seconds) still passes: far below anything a client can observe."""
INF = math.inf


def check(debt: float, limit: float, period_s: float, cost: float) -> tuple[float, float]:
    """Whether ``cost`` units pass a key that is ``debt`` seconds ahead of the clock.

    Returns ``(new_debt, retry_after_s)``: ``retry_after_s`` is ``0.0`` when it passes
    (then book ``now + new_debt``), the wait until it would pass otherwise, and ``inf`` when
    it never can (``cost`` above ``limit``, or no limit at all)."""
    if limit <= 0 or cost > limit:
        return debt, INF
    new_debt = debt + cost * period_s / limit
    excess = new_debt - period_s
    if excess > EPSILON_S:
        return debt, excess
    return new_debt, 0.0


def remaining(debt: float, limit: float, period_s: float) -> float:
    """Units that would pass now: ``floor((period_s - debt) / T)``, between 0 and ``limit``."""
    if limit <= 0:
        return 0.0
    units = math.floor((period_s + EPSILON_S - debt) * limit / period_s)
    if units <= 0:
        return 0.0
    return float(min(units, math.floor(limit)))
