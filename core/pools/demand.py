"""What a pool is asked for: arrivals and finished answers counted per second
(:class:`Demand`, fed by the request path), and the rate line fitted through them
(:func:`fit_rate`). The autoscaling signals (:mod:`shuniu.core.pools.autoscale`) read them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from shuniu.core.contracts.capacity import TokenMix

__all__ = ["MIN_TREND_S", "Demand", "Signals", "fit_rate"]

MIN_TREND_S = 10
"""Seconds of counts needed before a trend is fitted (fewer: the rate is their mean)."""


class Demand:
    """A pool's arrivals and finished answers in one-second buckets, the last ``span``
    seconds (a ring; a bucket is cleared when its second comes round again)."""

    __slots__ = ("_arrivals", "_finished", "_first", "_output", "_prompt", "_sec", "span")

    def __init__(self, window_s: float) -> None:
        self.span = math.ceil(window_s)
        n = self.span + 1  # the window's complete seconds and the current one
        self._arrivals = [0] * n
        self._prompt = [0] * n
        self._finished = [0] * n
        self._output = [0] * n
        self._sec = -1
        self._first: int | None = None
        """The first complete second counted: the one after the first call (which came
        part-way through its second)."""

    def _advance(self, sec: int) -> None:
        if self._first is None:
            self._first, self._sec = sec + 1, sec
            return
        n = len(self._arrivals)
        if sec - self._sec >= n:
            for lst in (self._arrivals, self._prompt, self._finished, self._output):
                lst[:] = [0] * n
        else:
            for s in range(self._sec + 1, sec + 1):
                i = s % n
                self._arrivals[i] = self._prompt[i] = self._finished[i] = self._output[i] = 0
        self._sec = sec

    def arrived(self, now: float, prompt_tokens: int) -> None:
        """A request for the pool arrived (refused ones too: they are demand)."""
        sec = int(now)
        if sec != self._sec:
            self._advance(sec)
        i = sec % len(self._arrivals)
        self._arrivals[i] += 1
        self._prompt[i] += prompt_tokens

    def finished(self, now: float, output_tokens: int) -> None:
        """A request of the pool ended with ``output_tokens`` generated."""
        sec = int(now)
        if sec != self._sec:
            self._advance(sec)
        i = sec % len(self._arrivals)
        self._finished[i] += 1
        self._output[i] += output_tokens

    def window(self, now: float) -> tuple[list[int], int, int, int]:
        """The complete seconds of the window, oldest first: arrival counts, and the
        window's prompt tokens, finished answers and their tokens."""
        sec = int(now)
        if sec != self._sec:
            self._advance(sec)
        n = len(self._arrivals)
        assert self._first is not None
        start = max(self._first, sec - self.span)
        idx = [s % n for s in range(start, sec)]
        return (
            [self._arrivals[i] for i in idx],
            sum(self._prompt[i] for i in idx),
            sum(self._finished[i] for i in idx),
            sum(self._output[i] for i in idx),
        )


def fit_rate(counts: list[int], lead_s: float) -> tuple[float, float]:
    """(rate at the window's end, rate ``lead_s`` later) of a least-squares line through
    per-second ``counts``; both at least 0. Fewer than :data:`MIN_TREND_S` seconds: their
    mean, with no trend."""
    m = len(counts)
    if m == 0:
        return 0.0, 0.0
    mean = sum(counts) / m
    if m < MIN_TREND_S:
        return mean, mean
    xbar = m / 2  # bucket j covers [j, j+1): its centre is j + 0.5; the mean centre is m/2
    sxx = sum((j + 0.5 - xbar) ** 2 for j in range(m))
    slope = sum((j + 0.5 - xbar) * (c - mean) for j, c in enumerate(counts)) / sxx
    now = mean + slope * (m - xbar)
    return max(0.0, now), max(0.0, now + slope * lead_s)


@dataclass(slots=True)
class Signals:
    """One evaluation of a pool's scaling signals."""

    rate: float = 0.0
    """Arrivals per second now (the fitted line at the window's end)."""
    forecast: float = 0.0
    """Arrivals per second ``lead_time_s`` from now."""
    mix: TokenMix | None = None
    """The observed token mix (``None`` before any request finished)."""
    capacity: float | None = None
    """Requests per second one replica serves at the mix within the SLO (``None``: not known yet)."""
    demand: float | None = None
    """Replicas' worth of the work this gateway sees: ``max(rate, forecast) * (1 +
    headroom) / capacity``."""
    desired: int = 0
    """The replica count to scale to: the ceiling of the demand, the fleet's when the
    gateways share state (``fleet:``), within the bounds."""
    replicas: int = 0
    """Endpoints in the pool now (not draining)."""
    peers: int = 0
    """Other gateways of the fleet (``fleet:``) whose demand ``desired`` includes."""
    fleet_ahead: float | None = None
    """With peers: ``max(rate, forecast)`` summed over the fleet, this gateway included."""
    lead_time_s: float = 0.0
    """How far ahead ``forecast`` looks (the pool's ``lead_time_s``)."""
    state: str = "starting"
    """``ready``; ``starting`` (no capacity known yet: holding the current count);
    ``unreachable`` (one replica cannot meet the SLO at this mix: holding); ``failed``
    (the capacity model raised: holding)."""

    def to_json(self) -> dict[str, Any]:
        """For ``/ready`` and ``/status.json``."""
        mix = self.mix
        return {
            "state": self.state,
            "rate": round(self.rate, 3),
            "forecast": round(self.forecast, 3),
            "lead_time_s": self.lead_time_s,
            "mix": None
            if mix is None
            else {
                "prompt_tokens": round(mix.prompt_tokens, 1),
                "output_tokens": round(mix.output_tokens, 1),
                "cached_share": round(mix.cached_share, 3),
            },
            "replica_capacity": None if self.capacity is None else round(self.capacity, 3),
            "demand": None if self.demand is None else round(self.demand, 3),
            "desired": self.desired,
            "replicas": self.replicas,
            "peers": self.peers,
            "fleet_ahead": None if self.fleet_ahead is None else round(self.fleet_ahead, 3),
        }
